//! The models a run keeps (`DIR/models/`) and what `export` makes of them:
//! the best-validation models, scored again from disk, give exactly the
//! summary's per-client test accuracies (and the last models its last-round
//! mean); a resumed run keeps byte-identical models; the exported
//! `state_dict` round-trips to the flat vectors, and a forward pass rebuilt
//! from it (PyTorch's conventions, from `model.json`'s layer list) gives
//! fedweave's logits.

use fedweave_sim::export::{
    ExportOptions, Format, TorchData, TorchTensor, export, from_state_dict, read_state_dict,
};
use fedweave_sim::models::{ModelCard, Which, model_path, read_model, rescore};
use fedweave_sim::{ExperimentConfig, Summary, resume_experiment, run_experiment};
use serde_json::Value;
use std::path::Path;

const DIGITS: &str = "seed = 3\nclients = 5\nrounds = 4\nthreads = 2\n[data]\ndataset = \"digits\"\n[partition]\nkind = \"pathological\"\nclasses_per_client = 2\n[model]\nkind = \"mlp\"\n[train]\nlocal_iterations = 3\nbatch_size = 16\nlr = 0.05\n";
const FMNIST_BN: &str = "seed = 2\nclients = 4\nrounds = 2\nthreads = 2\n[data]\ndataset = \"fashion-mnist\"\nmax_train_samples = 1200\n[partition]\nkind = \"groups\"\ngroups = 2\n[model]\nkind = \"cnn-bn\"\n[train]\nlocal_iterations = 4\nbatch_size = 32\nlr = 0.01\nmomentum = 0.5\n";

fn fmnist_present() -> bool {
    let here = Path::new("/usr/share/datasets/fashion-mnist").is_dir();
    if !here {
        eprintln!("skipped the Fashion-MNIST cases: /usr/share/datasets/fashion-mnist is absent");
    }
    here
}

fn run(base: &str, overrides: &[&str], dir: &Path) -> Summary {
    let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    let cfg = ExperimentConfig::from_toml_str(base, &overrides).unwrap();
    run_experiment(&cfg, dir, &mut |_| {}).unwrap()
}

/// The best models rescored from disk equal `per_client_test_acc` bit for
/// bit; the last models' mean equals `last_round_mean_test_acc`.
fn check_rescored(dir: &Path, summary: &Summary, what: &str) {
    let best = rescore(dir, Which::Best).unwrap();
    assert_eq!(best, summary.per_client_test_acc, "{what}: best models");
    let last: Vec<f64> = rescore(dir, Which::Last)
        .unwrap()
        .into_iter()
        .flatten()
        .collect();
    assert_eq!(last.len(), summary.clients - summary.malicious.len());
    let mean = fedweave_core::vecmath::mean(&last);
    assert_eq!(
        Some(mean),
        summary.last_round_mean_test_acc,
        "{what}: last models"
    );
}

#[test]
fn best_models_from_disk_give_the_summary_accuracies() {
    let cases: &[(&str, &[&str])] = &[
        // Scored after training; the default selection.
        ("pfedgraph", &["algorithm.name=pfedgraph"]),
        // Scored after receiving, before and after training, another
        // selection rule, with an attacker (not scored, no model).
        (
            "fedavg",
            &[
                "algorithm.name=fedavg",
                "eval.when=\"before_and_after\"",
                "eval.select=\"last\"",
                "attack.kind=\"sign_flip\"",
                "attack.ratio=0.2",
            ],
        ),
        // Split methods: the shared body with each client's own head.
        (
            "fedrep",
            &[
                "algorithm.name=fedrep",
                "eval.select=\"best_round_mean_val\"",
            ],
        ),
        (
            "fedbabu",
            &["algorithm.name=fedbabu", "algorithm.ft_epochs=1"],
        ),
        ("fedrod", &["algorithm.name=fedrod"]),
        ("lg-fedavg", &["algorithm.name=lg-fedavg"]),
    ];
    for (what, overrides) in cases {
        let dir = tempfile::tempdir().unwrap();
        let summary = run(DIGITS, overrides, dir.path());
        check_rescored(dir.path(), &summary, what);
        for i in &summary.malicious {
            assert!(!model_path(dir.path(), Which::Best, *i).exists());
        }
    }
    if fmnist_present() {
        // Batch norm: the running statistics are part of the kept model.
        let dir = tempfile::tempdir().unwrap();
        let summary = run(FMNIST_BN, &["algorithm.name=fedrep"], dir.path());
        check_rescored(dir.path(), &summary, "fedrep cnn-bn");
        let kept = read_model(dir.path(), Which::Best, 0).unwrap();
        assert_eq!(kept.model.buffers.len(), 2 * (32 + 64));
        assert!(kept.exact);
    }
}

#[test]
fn methods_scoring_more_than_one_model_say_so() {
    let dir = tempfile::tempdir().unwrap();
    run(DIGITS, &["algorithm.name=knn-per", "rounds=1"], dir.path());
    assert!(!read_model(dir.path(), Which::Best, 0).unwrap().exact);
    assert!(!ModelCard::read(dir.path()).unwrap().exact);
}

fn files(dir: &Path, which: Which, clients: usize) -> Vec<Option<Vec<u8>>> {
    (0..clients)
        .map(|i| std::fs::read(model_path(dir, which, i)).ok())
        .collect()
}

#[test]
fn a_resumed_run_keeps_the_same_models_byte_for_byte() {
    for name in ["pfedgraph", "fedrep", "dpfl"] {
        let algo = format!("algorithm.name={name}");
        let overrides = [algo.as_str(), "rounds=5", "algorithm.init_epochs=1"];
        let overrides = if name == "dpfl" {
            &overrides[..]
        } else {
            &overrides[..2]
        };
        let whole = tempfile::tempdir().unwrap();
        run(DIGITS, overrides, whole.path());

        // Stopped after round 2; its checkpoint kept. Then it went on to
        // round 4 (writing the models of rounds 3 and 4) and was killed
        // there: the checkpoint of round 2 is what a kill between round 2's
        // and round 4's checkpoints leaves (checkpoint_every = 3, say).
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let mut two: Vec<&str> = overrides.to_vec();
        two[1] = "rounds=2";
        run(DIGITS, &two, d);
        let checkpoint = std::fs::read(d.join("checkpoint/state.safetensors")).unwrap();
        let rounds: String = std::fs::read_to_string(d.join("rounds.jsonl")).unwrap();
        resume_experiment(d, Some(4), &mut |_| {}).unwrap();
        std::fs::write(d.join("checkpoint/state.safetensors"), checkpoint).unwrap();
        std::fs::write(d.join("rounds.jsonl"), rounds).unwrap();
        std::fs::remove_file(d.join("summary.json")).unwrap();
        resume_experiment(d, Some(5), &mut |_| {}).unwrap();

        for which in [Which::Best, Which::Last] {
            let (got, want) = (files(d, which, 5), files(whole.path(), which, 5));
            for i in 0..5 {
                let round = |dir: &Path| read_model(dir, which, i).ok().map(|k| k.round);
                assert!(
                    got[i] == want[i],
                    "{name}: client {i}'s {which:?} model differs (rounds {:?} vs {:?} uninterrupted)",
                    round(d),
                    round(whole.path())
                );
            }
        }
    }
}

fn f32s(t: &TorchTensor) -> &[f32] {
    match &t.data {
        TorchData::F32(v) => v,
        TorchData::I64(_) => panic!("{} is not f32", t.name),
    }
}

/// PyTorch's forward pass of `model.json`'s layer list on `x` (one sample,
/// `shape`), written out plainly: what a loader builds from the export.
fn reference_forward(
    layers: &[Value],
    dict: &[TorchTensor],
    x: &[f32],
    shape: &[usize],
) -> Vec<f32> {
    let get = |name: &str| {
        dict.iter()
            .find(|t| t.name == name)
            .unwrap_or_else(|| panic!("{name} missing"))
    };
    let (mut x, mut shape) = (x.to_vec(), shape.to_vec());
    for layer in layers {
        let name = layer["name"].as_str().unwrap_or_default();
        match layer["type"].as_str().unwrap() {
            "flatten" => shape = vec![x.len()],
            "relu" => x.iter_mut().for_each(|v| *v = v.max(0.0)),
            "linear" => {
                let w = get(&format!("{name}.weight"));
                let b = f32s(get(&format!("{name}.bias")));
                let (out, inp) = (w.shape[0], w.shape[1]);
                assert_eq!(inp, x.len());
                let w = f32s(w);
                x = (0..out)
                    .map(|o| b[o] + (0..inp).map(|i| w[o * inp + i] * x[i]).sum::<f32>())
                    .collect();
                shape = vec![out];
            }
            "conv2d" => {
                let w = get(&format!("{name}.weight"));
                let b = f32s(get(&format!("{name}.bias")));
                let [co, ci, k, _] = <[usize; 4]>::try_from(w.shape.as_slice()).unwrap();
                let [c, h, wd] = <[usize; 3]>::try_from(shape.as_slice()).unwrap();
                assert_eq!(c, ci);
                let (oh, ow) = (h - k + 1, wd - k + 1);
                let w = f32s(w);
                let mut y = vec![0.0f32; co * oh * ow];
                for o in 0..co {
                    for r in 0..oh {
                        for s in 0..ow {
                            let mut acc = b[o];
                            for i in 0..ci {
                                for u in 0..k {
                                    for v in 0..k {
                                        acc += w[((o * ci + i) * k + u) * k + v]
                                            * x[(i * h + r + u) * wd + s + v];
                                    }
                                }
                            }
                            y[(o * oh + r) * ow + s] = acc;
                        }
                    }
                }
                (x, shape) = (y, vec![co, oh, ow]);
            }
            "max_pool2d" => {
                let [c, h, w] = <[usize; 3]>::try_from(shape.as_slice()).unwrap();
                let (oh, ow) = (h / 2, w / 2);
                let mut y = vec![f32::NEG_INFINITY; c * oh * ow];
                for ch in 0..c {
                    for r in 0..oh * 2 {
                        for s in 0..ow * 2 {
                            let at = (ch * oh + r / 2) * ow + s / 2;
                            y[at] = y[at].max(x[(ch * h + r) * w + s]);
                        }
                    }
                }
                (x, shape) = (y, vec![c, oh, ow]);
            }
            "batch_norm2d" => {
                let g = f32s(get(&format!("{name}.weight")));
                let b = f32s(get(&format!("{name}.bias")));
                let m = f32s(get(&format!("{name}.running_mean")));
                let v = f32s(get(&format!("{name}.running_var")));
                let eps = layer["eps"].as_f64().unwrap() as f32;
                let plane = shape[1] * shape[2];
                for (k, val) in x.iter_mut().enumerate() {
                    let ch = k / plane;
                    *val = (*val - m[ch]) / (v[ch] + eps).sqrt() * g[ch] + b[ch];
                }
            }
            other => panic!("layer type {other}"),
        }
    }
    x
}

/// Exports every client's best model and checks the files against the
/// kept ones and fedweave's forward pass.
fn check_export(dir: &Path, clients: usize) {
    let out = dir.join("out");
    let written = export(&ExportOptions {
        dir: dir.to_path_buf(),
        clients: None,
        which: Which::Best,
        out: Some(out.clone()),
        overwrite: false,
        format: Format::Safetensors,
    })
    .unwrap();
    assert_eq!(written.len(), clients + 1);
    let card: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("model.json")).unwrap()).unwrap();
    let spec = ModelCard::read(dir).unwrap().spec().unwrap();
    let cfg = ExperimentConfig::from_file(&dir.join("config.toml"), &[]).unwrap();
    let fed = fedweave_sim::runtime::Derived::load(&cfg).unwrap();
    for i in 0..clients {
        let bytes = std::fs::read(out.join(format!("client-{i}.safetensors"))).unwrap();
        let dict = read_state_dict(&bytes).unwrap();
        // Names, shapes and dtypes as model.json lists them.
        let listed: Vec<(String, Vec<usize>)> = card["state_dict"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                let shape = t["shape"].as_array().unwrap();
                (
                    t["name"].as_str().unwrap().to_string(),
                    shape.iter().map(|d| d.as_u64().unwrap() as usize).collect(),
                )
            })
            .collect();
        let mut got: Vec<(String, Vec<usize>)> = dict
            .iter()
            .map(|t| (t.name.clone(), t.shape.clone()))
            .collect();
        let mut want = listed.clone();
        got.sort();
        want.sort();
        assert_eq!(got, want);
        // Values: byte-exact after the inverse transposes.
        let kept = read_model(dir, Which::Best, i).unwrap();
        let back = from_state_dict(&spec, &dict).unwrap();
        assert_eq!(back.params.len(), kept.model.params.len());
        assert!(
            back.params
                .iter()
                .zip(&kept.model.params)
                .all(|(a, b)| a.to_bits() == b.to_bits())
        );
        assert!(
            back.buffers
                .iter()
                .zip(&kept.model.buffers)
                .all(|(a, b)| a.to_bits() == b.to_bits())
        );
        assert_eq!(back.buffers.len(), kept.model.buffers.len());
        // The forward pass rebuilt from the export gives fedweave's logits.
        let test = fed.test_data(i);
        let ours = fedweave_nn::predict(&spec, &kept.model.params, &kept.model.buffers, &test);
        let layers = card["layers"].as_array().unwrap();
        let len = spec.input_len();
        for k in 0..test.len().min(5) {
            let row = test.indices[k];
            let x = &test.features[row * len..(row + 1) * len];
            let theirs = reference_forward(layers, &dict, x, spec.input_shape());
            for (a, b) in theirs.iter().zip(ours.output(k)) {
                assert!(
                    (a - b).abs() <= 1e-4 * (1.0 + b.abs()),
                    "client {i} sample {k}: {a} vs {b}"
                );
            }
        }
    }
}

#[test]
fn exported_state_dicts_round_trip_and_rebuild_the_forward_pass() {
    let dir = tempfile::tempdir().unwrap();
    run(DIGITS, &["algorithm.name=fedrep", "rounds=2"], dir.path());
    check_export(dir.path(), 5);
    if fmnist_present() {
        for kind in ["cnn-bn", "cnn"] {
            let dir = tempfile::tempdir().unwrap();
            let model = format!("model.kind=\"{kind}\"");
            run(
                FMNIST_BN,
                &["algorithm.name=fedbn", "rounds=1", &model],
                dir.path(),
            );
            check_export(dir.path(), 4);
        }
    }
}
