//! Experiment configs: TOML parsing, `--set` overrides and validation of
//! every key; a resolved config must print back.
#![no_main]
use fedweave_sim::ExperimentConfig;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(cfg) = ExperimentConfig::from_toml_str(text, &[]) {
        let _ = cfg.to_toml();
    }
    let _ = ExperimentConfig::from_toml_str("", &[text.to_string()]);
});
