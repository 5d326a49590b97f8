//! `fedweave export` and `fedweave predict` from the command line: the
//! classes `predict` prints are those fedweave's own forward pass gives;
//! PyTorch (where installed) loads the export and gives fedweave's logits;
//! bad input is a clear error with a non-zero exit status, never a panic.

use crate::{fedweave, text};
use fedweave_sim::ExperimentConfig;
use fedweave_sim::models::{Which, read_model};
use fedweave_sim::runtime::Derived;
use std::path::Path;

const CONFIG: &str = "seed = 4\nclients = 4\nrounds = 2\nthreads = 2\n[data]\ndataset = \"digits\"\n[partition]\nkind = \"pathological\"\nclasses_per_client = 2\n[model]\nkind = \"mlp\"\n[train]\nlocal_iterations = 3\nbatch_size = 16\nlr = 0.05\n[algorithm]\nname = \"fedrep\"\n[attack]\nkind = \"sign_flip\"\nratio = 0.25\n";

/// Runs `config` (with `overrides`) into `dir/run`; returns the run dir.
fn run(dir: &Path, config: &str, overrides: &[&str]) -> String {
    let cfg = dir.join("cfg.toml");
    std::fs::write(&cfg, config).unwrap();
    let out = dir.join("run");
    let mut args = vec![
        "run",
        cfg.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "-q",
    ];
    for o in overrides {
        args.extend(["--set", o]);
    }
    let o = fedweave(&args);
    assert!(o.status.success(), "{}", text(&o));
    out.to_str().unwrap().to_string()
}

/// The attacker of a run of `CONFIG` and a benign client.
fn roles(run: &str) -> (usize, usize) {
    let text = std::fs::read_to_string(Path::new(run).join("summary.json")).unwrap();
    let summary: serde_json::Value = serde_json::from_str(&text).unwrap();
    let bad = summary["malicious"][0].as_u64().unwrap() as usize;
    (bad, (bad + 1) % 4)
}

/// Client `i`'s first `n` test samples (flat) and the logits of its best
/// model on them by fedweave's own forward pass.
fn samples(run: &str, i: usize, n: usize) -> (Vec<f32>, Vec<Vec<f32>>, Vec<usize>) {
    let cfg = ExperimentConfig::from_file(&Path::new(run).join("config.toml"), &[]).unwrap();
    let fed = Derived::load(&cfg).unwrap();
    let env = fed.env();
    let kept = read_model(Path::new(run), Which::Best, i).unwrap();
    let mut test = fed.test_data(i);
    let rows: Vec<usize> = test.indices[..n].to_vec();
    test.indices = &rows;
    let len = env.spec.input_len();
    let x: Vec<f32> = rows
        .iter()
        .flat_map(|&r| test.features[r * len..(r + 1) * len].to_vec())
        .collect();
    let out = fedweave_nn::predict(env.spec, &kept.model.params, &kept.model.buffers, &test);
    let logits: Vec<Vec<f32>> = (0..n).map(|k| out.output(k).to_vec()).collect();
    let classes = logits
        .iter()
        .map(|l| (0..l.len()).fold(0, |b, c| if l[c] > l[b] { c } else { b }))
        .collect();
    (x, logits, classes)
}

fn npy<T: npyz::Serialize + npyz::AutoSerialize + Copy>(shape: &[u64], values: &[T]) -> Vec<u8> {
    use npyz::WriterBuilder;
    let mut buf = Vec::new();
    let mut w = npyz::WriteOptions::<T>::new()
        .default_dtype()
        .shape(shape)
        .writer(&mut buf)
        .begin_nd()
        .unwrap();
    w.extend(values.iter().copied()).unwrap();
    w.finish().unwrap();
    buf
}

fn predicted(args: &[&str]) -> Vec<String> {
    let o = fedweave(args);
    assert!(o.status.success(), "{}", text(&o));
    String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn predict_gives_fedweave_s_classes_and_export_writes_state_dicts() {
    let tmp = tempfile::tempdir().unwrap();
    let run = run(tmp.path(), CONFIG, &[]);
    let (bad, good) = roles(&run);
    let me = good.to_string();
    let (x, _, classes) = samples(&run, good, 12);
    let want: Vec<String> = classes.iter().map(usize::to_string).collect();
    let (npy_path, csv_path, u8_path) = (
        tmp.path().join("x.npy"),
        tmp.path().join("x.csv"),
        tmp.path().join("raw.npy"),
    );
    std::fs::write(&npy_path, npy(&[12, 1, 8, 8], &x)).unwrap();
    let csv: String = x
        .chunks(64)
        .map(|r| r.iter().map(f32::to_string).collect::<Vec<_>>().join(",") + "\n")
        .collect();
    std::fs::write(&csv_path, csv).unwrap();
    // Raw digits pixels (0..=16), scaled by predict as the loader scales them.
    let raw: Vec<u8> = x
        .iter()
        .map(|v| {
            ((v * fedweave_data::digits::DIGITS_STD + fedweave_data::digits::DIGITS_MEAN) * 16.0)
                .round() as u8
        })
        .collect();
    std::fs::write(&u8_path, npy(&[12, 64], &raw)).unwrap();
    for input in [&npy_path, &csv_path, &u8_path] {
        let args = [
            "predict",
            &run,
            "--client",
            &me,
            "--input",
            input.to_str().unwrap(),
        ];
        assert_eq!(predicted(&args), want, "{}", input.display());
    }
    let json = predicted(&[
        "predict",
        &run,
        "--client",
        &me,
        "--input",
        npy_path.to_str().unwrap(),
        "--json",
    ]);
    for (line, class) in json.iter().zip(&classes) {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(v["class"].as_u64(), Some(*class as u64));
        let p: f64 = v["probabilities"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_f64().unwrap())
            .sum();
        assert!((p - 1.0).abs() < 1e-9);
    }

    // Export: the benign clients by default, a chosen one, --which last.
    let o = fedweave(&["export", &run]);
    assert!(o.status.success(), "{}", text(&o));
    let out = Path::new(&run).join("export-best");
    let files: Vec<String> = String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(
        files.len(),
        4,
        "three benign clients and model.json: {files:?}"
    );
    let card: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("model.json")).unwrap()).unwrap();
    assert_eq!(card["kind"], "mlp");
    assert_eq!(card["state_dict"][0]["name"], "fc1.weight");
    assert_eq!(card["state_dict"][0]["shape"], serde_json::json!([200, 64]));
    let last = tmp.path().join("last");
    let o = fedweave(&[
        "export",
        &run,
        "--which",
        "last",
        "--clients",
        &me,
        "--out",
        last.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(last.join(format!("client-{good}.safetensors")).is_file());
    assert!(!out.join(format!("client-{bad}.safetensors")).exists());
    // A client named twice is exported once.
    let twice = format!("{me},{me}");
    let dup = tmp.path().join("dup");
    let o = fedweave(&[
        "export",
        &run,
        "--clients",
        &twice,
        "--out",
        dup.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(String::from_utf8(o.stdout).unwrap().lines().count(), 2);
    // Existing files need --overwrite.
    let again = fedweave(&["export", &run]);
    refused(&again, "--overwrite");
    let o = fedweave(&["export", &run, "--overwrite"]);
    assert!(o.status.success(), "{}", text(&o));
}

/// A clean failure: non-zero exit, the message says `needle`, no panic.
fn refused(o: &std::process::Output, needle: &str) {
    let t = text(o);
    assert!(!o.status.success(), "should fail: {t}");
    assert!(t.contains(needle), "message should say `{needle}`: {t}");
    assert!(!t.contains("panicked"), "{t}");
}

#[test]
fn bad_input_is_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let run = run(tmp.path(), CONFIG, &[]);
    let (bad, benign) = roles(&run);
    let (bad, me) = (bad.to_string(), benign.to_string());
    let no_model = format!("client {bad} has no best model");
    let here = tmp.path().to_str().unwrap();
    let file = |name: &str, bytes: &[u8]| {
        let p = tmp.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        p.to_str().unwrap().to_string()
    };
    refused(&fedweave(&["export", here]), "not a run directory");
    refused(
        &fedweave(&["export", &run, "--clients", "0,9"]),
        "client 9 does not exist",
    );
    refused(&fedweave(&["export", &run, "--clients", "0,x"]), "invalid");
    // The attacker is never scored: it has no model.
    refused(&fedweave(&["export", &run, "--clients", &bad]), &no_model);

    let predict = |client: &str, input: &str| {
        fedweave(&["predict", &run, "--client", client, "--input", input])
    };
    let good = file("ok.npy", &npy(&[2, 64], &[0.5f32; 128]));
    refused(&predict("7", &good), "client 7 does not exist");
    refused(&predict(&bad, &good), &no_model);
    refused(
        &predict(&me, &file("wide.npy", &npy(&[2, 65], &[0.5f32; 130]))),
        "[n, 1, 8, 8] or [n, 64]",
    );
    refused(
        &predict(&me, &file("ints.npy", &npy(&[2, 64], &[1i32; 128]))),
        "dtype",
    );
    refused(
        &predict(&me, &file("junk.npy", b"not an array")),
        "not a valid .npy",
    );
    refused(
        &predict(&me, &file("x.csv", "1,2,3\n".as_bytes())),
        "takes 64 features",
    );
    refused(&predict(&me, &file("x.txt", b"1")), ".npy or a .csv");
    refused(
        &predict(&me, &tmp.path().join("missing.npy").to_string_lossy()),
        "cannot read",
    );

    // A best model that is not the one the books name.
    let summary = Path::new(&run).join("summary.json");
    let text = std::fs::read_to_string(&summary).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["per_client_best_round"][benign] = 99.into();
    std::fs::write(&summary, v.to_string()).unwrap();
    refused(
        &fedweave(&["export", &run, "--clients", &me]),
        "best validation score in round 99",
    );
    std::fs::write(&summary, text).unwrap();

    // A run that kept nothing (an older fedweave's, or a networked one).
    std::fs::remove_dir_all(Path::new(&run).join("models/best")).unwrap();
    refused(
        &fedweave(&["export", &run, "--out", here]),
        "has no best models",
    );
    std::fs::remove_dir_all(Path::new(&run).join("models")).unwrap();
    refused(&fedweave(&["export", &run]), "holds no kept models");
    refused(&predict(&me, &good), "holds no kept models");
}

fn torch_available() -> bool {
    std::process::Command::new("python3")
        .args(["-c", "import torch"])
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn pytorch_loads_the_export_with_fedweave_s_logits() {
    if !torch_available() {
        eprintln!("skipped: PyTorch is not installed (python3 -c 'import torch' fails)");
        return;
    }
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scripts/load_exported.py"
    );
    for (kind, cfg) in export_cases() {
        let tmp = tempfile::tempdir().unwrap();
        let run = run(tmp.path(), &cfg, &[]);
        let (_, good) = roles(&run);
        let o = fedweave(&["export", &run, "--clients", &good.to_string()]);
        assert!(o.status.success(), "{}", text(&o));
        let out = Path::new(&run).join("export-best");
        let (x, logits, _) = samples(&run, good, 8);
        let input = tmp.path().join("x.f32");
        std::fs::write(
            &input,
            x.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>(),
        )
        .unwrap();
        let o = std::process::Command::new("python3")
            .args([script, out.join("model.json").to_str().unwrap()])
            .arg(out.join(format!("client-{good}.safetensors")))
            .arg(&input)
            .arg("8")
            .output()
            .unwrap();
        assert!(o.status.success(), "{kind}: {}", text(&o));
        let theirs: Vec<Vec<f32>> = serde_json::from_slice(&o.stdout).unwrap();
        for (a, b) in theirs.iter().flatten().zip(logits.iter().flatten()) {
            assert!(
                (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                "{kind}: {a} vs {b}"
            );
        }
    }
}

/// The cases the export tests run: the MLP on digits, and where
/// Fashion-MNIST is installed the two CNNs.
fn export_cases() -> Vec<(&'static str, String)> {
    let mut cases = vec![("mlp", CONFIG.to_string())];
    if Path::new("/usr/share/datasets/fashion-mnist").is_dir() {
        for kind in ["cnn", "cnn-bn"] {
            let cfg = CONFIG
                .replace("\"digits\"", "\"fashion-mnist\"\nmax_train_samples = 600")
                .replace("\"mlp\"", &format!("\"{kind}\""));
            cases.push((kind, cfg));
        }
    }
    cases
}

/// `--format onnx` writes one graph per client whose weights are the
/// `state_dict`'s, byte for byte, wired as the layer list says; where
/// onnxruntime is installed (`pip install onnxruntime`), it gives
/// fedweave's logits to 1e-5.
#[test]
fn onnx_export_holds_the_state_dict_and_runs_with_fedweave_s_logits() {
    use fedweave_sim::export::read_state_dict;
    use fedweave_sim::onnx::proto::ModelProto;
    use prost::Message;
    let runtime = onnxruntime_available();
    if !runtime {
        eprintln!(
            "onnxruntime is not installed (pip install onnxruntime numpy): checking the graph without running it"
        );
    }
    for (kind, cfg) in export_cases() {
        let tmp = tempfile::tempdir().unwrap();
        let run = run(tmp.path(), &cfg, &[]);
        let (_, good) = roles(&run);
        let good_s = good.to_string();
        for format in ["safetensors", "onnx"] {
            let out = tmp.path().join(format);
            let o = fedweave(&[
                "export",
                &run,
                "--clients",
                &good_s,
                "--format",
                format,
                "--out",
                out.to_str().unwrap(),
            ]);
            assert!(o.status.success(), "{}", text(&o));
        }
        let onnx = std::fs::read(tmp.path().join(format!("onnx/client-{good}.onnx"))).unwrap();
        let model = ModelProto::decode(onnx.as_slice()).unwrap();
        let graph = model.graph.unwrap();
        let dict = read_state_dict(
            &std::fs::read(
                tmp.path()
                    .join(format!("safetensors/client-{good}.safetensors")),
            )
            .unwrap(),
        )
        .unwrap();
        // Every parameter and running statistic is an initializer with its
        // values (num_batches_tracked is not part of the forward pass).
        for t in dict
            .iter()
            .filter(|t| !t.name.ends_with("num_batches_tracked"))
        {
            let init = graph
                .initializer
                .iter()
                .find(|i| i.name == t.name)
                .unwrap_or_else(|| panic!("{kind}: no initializer {}", t.name));
            let dims: Vec<usize> = init.dims.iter().map(|&d| d as usize).collect();
            assert_eq!(dims, t.shape, "{kind}: {}", t.name);
            let fedweave_sim::export::TorchData::F32(values) = &t.data else {
                panic!("{}: not f32", t.name)
            };
            let raw: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            assert!(init.raw_data == raw, "{kind}: {} values", t.name);
        }
        let ops: Vec<&str> = graph.node.iter().map(|n| n.op_type.as_str()).collect();
        let want: &[&str] = match kind {
            "mlp" => &["Flatten", "Gemm", "Relu", "Gemm", "Relu", "Gemm"],
            "cnn" => &[
                "Conv", "Relu", "MaxPool", "Conv", "Relu", "MaxPool", "Flatten", "Gemm", "Relu",
                "Gemm", "Relu", "Gemm",
            ],
            _ => &[
                "Conv",
                "BatchNormalization",
                "Relu",
                "MaxPool",
                "Conv",
                "BatchNormalization",
                "Relu",
                "MaxPool",
                "Flatten",
                "Gemm",
                "Relu",
                "Gemm",
            ],
        };
        assert_eq!(ops, want, "{kind}");
        assert_eq!(graph.node.last().unwrap().output, ["logits"]);
        if !runtime {
            continue;
        }
        let (x, logits, _) = samples(&run, good, 8);
        let file = tmp.path().join(format!("onnx/client-{good}.onnx"));
        check_onnx_logits(kind, &file, tmp.path(), &x, &logits);
    }
}

/// A 6×6 RGB PNG of class `dark` (values below 80) or `light` (above
/// 170), its noise drawn from `seed`.
fn noisy_png(light: bool, seed: u32) -> Vec<u8> {
    use image::ImageEncoder;
    let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(12_345);
    let pixels: Vec<u8> = (0..6 * 6 * 3)
        .map(|_| {
            s = s.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            let noise = ((s >> 16) % 80) as u8;
            if light { 175 + noise } else { noise }
        })
        .collect();
    let mut out = Vec::new();
    image::codecs::png::PngEncoder::new(&mut out)
        .write_image(&pixels, 6, 6, image::ExtendedColorType::Rgb8)
        .unwrap();
    out
}

/// Three clients' folders of separable `dark` / `light` images; returns
/// client 0's test images in the loader's order (class, then file name).
fn image_clients(root: &Path) -> Vec<std::path::PathBuf> {
    let mut order = Vec::new();
    for c in 0..3u32 {
        for (split, n) in [("train", 8), ("test", 3)] {
            for (class, light) in [("dark", false), ("light", true)] {
                let dir = root.join(format!("client{c}/{split}/{class}"));
                std::fs::create_dir_all(&dir).unwrap();
                for k in 0..n {
                    let f = dir.join(format!("{k}.png"));
                    std::fs::write(&f, noisy_png(light, c * 100 + k + u32::from(light) * 50))
                        .unwrap();
                    if c == 0 && split == "test" {
                        order.push(f);
                    }
                }
            }
        }
    }
    order
}

#[test]
fn an_image_folder_run_learns_and_predict_reads_its_images() {
    let tmp = tempfile::tempdir().unwrap();
    let test_images = image_clients(&tmp.path().join("data"));
    let template = tmp.path().join("data/client{id}");
    let config = format!(
        "seed = 3\nclients = 3\nrounds = 2\nthreads = 2\n[data]\ndataset = \"image-folder\"\npath = {:?}\nimage_size = 4\nmean = [0.5, 0.5, 0.5]\nstd = [0.25, 0.25, 0.25]\n[partition]\nkind = \"natural\"\n[model]\nkind = \"mlp\"\n[train]\nlocal_iterations = 10\nbatch_size = 8\nlr = 0.05\n[algorithm]\nname = \"fedavg\"\n",
        template.to_str().unwrap()
    );
    let image_run = run(tmp.path(), &config, &[]);
    let json = std::fs::read_to_string(Path::new(&image_run).join("summary.json")).unwrap();
    let summary: serde_json::Value = serde_json::from_str(&json).unwrap();
    let acc = summary["mean_test_acc"].as_f64().unwrap();
    assert!(acc > 0.8, "mean test accuracy {acc} on separable images");
    // Client 0's six test images, by fedweave's own forward pass.
    let (_, _, classes) = samples(&image_run, 0, 6);
    let want: Vec<String> = classes.iter().map(usize::to_string).collect();
    // One image at a time, then a directory of copies named in that order.
    let each: Vec<String> = test_images
        .iter()
        .flat_map(|f| {
            predicted(&[
                "predict",
                &image_run,
                "--client",
                "0",
                "--input",
                f.to_str().unwrap(),
            ])
        })
        .collect();
    assert_eq!(each, want);
    let dir = tmp.path().join("to-classify");
    std::fs::create_dir_all(&dir).unwrap();
    for (k, f) in test_images.iter().enumerate() {
        std::fs::copy(f, dir.join(format!("{k:02}.png"))).unwrap();
    }
    std::fs::write(dir.join("readme.txt"), "not an image").unwrap();
    let args = [
        "predict",
        &image_run,
        "--client",
        "0",
        "--input",
        dir.to_str().unwrap(),
    ];
    assert_eq!(predicted(&args), want);
    // The labels are the classes: dark 0, light 1 (three of each).
    let right = ["0", "0", "0", "1", "1", "1"]
        .iter()
        .zip(&want)
        .filter(|(a, b)| *a == b)
        .count();
    assert!(right >= 5, "{want:?}");
    // An image of a run on other data is refused with a reason.
    let digits = tmp.path().join("digits");
    std::fs::create_dir_all(&digits).unwrap();
    let drun = run(&digits, CONFIG, &["rounds=1"]);
    let o = fedweave(&[
        "predict",
        &drun,
        "--client",
        "0",
        "--input",
        test_images[0].to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    assert!(text(&o).contains("image files"), "{}", text(&o));
}

/// A `sequential` model from the configuration alone: it runs with a split
/// method (FedRep), its export names tensors as `torch.nn.Sequential` does
/// and lists its layers, `predict` rebuilds it from the model card; a list
/// that does not fit the data stops before training, naming the layer.
#[test]
fn a_sequential_model_runs_exports_and_predicts() {
    let tmp = tempfile::tempdir().unwrap();
    let layers = "[model]\nkind = \"sequential\"\nlayers = [\n  { type = \"conv2d\", out_channels = 4, kernel = 3, padding = 1 },\n  { type = \"batch_norm\" },\n  { type = \"relu\" },\n  { type = \"max_pool2d\", kernel = 2 },\n  { type = \"flatten\" },\n  { type = \"linear\", out_features = 32 },\n  { type = \"relu\" },\n  { type = \"linear\" },\n]\n";
    let config = CONFIG.replace("[model]\nkind = \"mlp\"\n", layers);
    let run = run(tmp.path(), &config, &[]);
    let (_, good) = roles(&run);
    let me = good.to_string();
    let o = fedweave(&["export", &run, "--clients", &me]);
    assert!(o.status.success(), "{}", text(&o));
    let card: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(Path::new(&run).join("export-best/model.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(card["kind"], "sequential");
    let names: Vec<&str> = card["state_dict"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "layers.0.weight",
            "layers.0.bias",
            "layers.1.weight",
            "layers.1.bias",
            "layers.1.running_mean",
            "layers.1.running_var",
            "layers.1.num_batches_tracked",
            "layers.5.weight",
            "layers.5.bias",
            "layers.7.weight",
            "layers.7.bias",
        ]
    );
    assert_eq!(card["state_dict"][7]["shape"], serde_json::json!([32, 64]));
    let types: Vec<&str> = card["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        types,
        [
            "conv2d",
            "batch_norm2d",
            "relu",
            "max_pool2d",
            "flatten",
            "linear",
            "relu",
            "linear"
        ]
    );
    assert_eq!(card["layers"][0]["name"], "layers.0");
    let (x, _, classes) = samples(&run, good, 5);
    let input = tmp.path().join("x.npy");
    std::fs::write(&input, npy(&[5, 64], &x)).unwrap();
    let want: Vec<String> = classes.iter().map(usize::to_string).collect();
    let args = [
        "predict",
        &run,
        "--client",
        &me,
        "--input",
        input.to_str().unwrap(),
    ];
    assert_eq!(predicted(&args), want);

    let misfit = config.replace("kernel = 3, padding = 1", "kernel = 9");
    let cfg = tmp.path().join("misfit.toml");
    std::fs::write(&cfg, misfit).unwrap();
    let out = tmp.path().join("misfit");
    let o = fedweave(&[
        "run",
        cfg.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "-q",
    ]);
    refused(
        &o,
        "model.layers[0] (conv2d): kernel 9 is larger than the 8×8 map",
    );
}

/// Every exportable layer type through ONNX: a `sequential` list with a
/// residual block (conv shortcut), group norm, GELU, tanh, padded and
/// strided pools, an adaptive pool, dropout and a bias-free linear, and
/// the ResNets (residual blocks with downsampling shortcuts, ResNet-9's
/// scaled bias-free head), on digits. Where onnxruntime is installed the
/// graphs give fedweave's logits to 1e-5; without it, the graphs must
/// still build.
#[test]
fn onnx_covers_every_layer_type_and_the_resnets() {
    let runtime = onnxruntime_available();
    let rich = "[model]\nkind = \"sequential\"\nlayers = [\n  { type = \"conv2d\", out_channels = 8, kernel = 3, padding = 1 },\n  { type = \"group_norm\", groups = 2 },\n  { type = \"gelu\" },\n  { type = \"residual\", layers = [\n      { type = \"conv2d\", out_channels = 8, kernel = 3, stride = 2, padding = 1 },\n      { type = \"batch_norm\" },\n      { type = \"tanh\" },\n    ], shortcut = [\n      { type = \"conv2d\", out_channels = 8, kernel = 1, stride = 2, bias = false },\n    ] },\n  { type = \"avg_pool2d\", kernel = 3, stride = 1, padding = 1 },\n  { type = \"max_pool2d\", kernel = 2, stride = 1 },\n  { type = \"adaptive_avg_pool2d\", output = 1 },\n  { type = \"flatten\" },\n  { type = \"dropout\", p = 0.2 },\n  { type = \"linear\", out_features = 16, bias = false },\n  { type = \"relu\" },\n  { type = \"linear\" },\n]\n";
    let mut cases = vec![(
        "sequential",
        CONFIG.replace("[model]\nkind = \"mlp\"\n", rich),
    )];
    for kind in ["resnet8", "resnet9"] {
        cases.push((kind, CONFIG.replace("\"mlp\"", &format!("\"{kind}\""))));
    }
    for (kind, cfg) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let run = run(tmp.path(), &cfg, &[]);
        let (_, good) = roles(&run);
        let out = tmp.path().join("onnx");
        let o = fedweave(&[
            "export",
            &run,
            "--clients",
            &good.to_string(),
            "--format",
            "onnx",
            "--out",
            out.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{kind}: {}", text(&o));
        let file = out.join(format!("client-{good}.onnx"));
        assert!(std::fs::metadata(&file).unwrap().len() > 0);
        if !runtime {
            eprintln!("{kind}: onnxruntime is not installed; the graph was not run");
            continue;
        }
        let (x, logits, _) = samples(&run, good, 8);
        check_onnx_logits(kind, &file, tmp.path(), &x, &logits);
    }
}

/// Whether `python3` can import onnxruntime and numpy.
fn onnxruntime_available() -> bool {
    std::process::Command::new("python3")
        .args(["-c", "import onnxruntime, numpy"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Runs the ONNX graph `file` in onnxruntime on the samples `x` (flat
/// float32, as fedweave feeds them) and asserts its logits are fedweave's
/// `logits` to 1e-5.
fn check_onnx_logits(kind: &str, file: &Path, dir: &Path, x: &[f32], logits: &[Vec<f32>]) {
    let input = dir.join("x.f32");
    std::fs::write(
        &input,
        x.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>(),
    )
    .unwrap();
    let script = "import json, sys, numpy, onnxruntime as ort\n\
        s = ort.InferenceSession(sys.argv[1], providers=['CPUExecutionProvider'])\n\
        shape = [d if isinstance(d, int) else -1 for d in s.get_inputs()[0].shape]\n\
        x = numpy.fromfile(sys.argv[2], dtype='<f4').reshape(shape)\n\
        print(json.dumps(s.run(['logits'], {'input': x})[0].tolist()))";
    let o = std::process::Command::new("python3")
        .args(["-c", script])
        .arg(file)
        .arg(&input)
        .output()
        .unwrap();
    assert!(o.status.success(), "{kind}: {}", text(&o));
    let theirs: Vec<Vec<f32>> = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(theirs.len(), logits.len(), "{kind}");
    for (a, b) in theirs.iter().flatten().zip(logits.iter().flatten()) {
        assert!(
            (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
            "{kind}: {a} vs {b}"
        );
    }
}
