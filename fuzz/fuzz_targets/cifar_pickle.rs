//! CIFAR python-version pickles; the first byte picks CIFAR-10 / 100 fine / coarse.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some((&variant, rest)) = data.split_first() {
        let _ = fedweave_data::fuzzing::cifar(rest, true, variant % 3);
    }
});
