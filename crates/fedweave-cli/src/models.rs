//! `fedweave export` and `fedweave predict`: the models a run kept, out.

use anyhow::Context;
use fedweave_nn::LocalData;
use fedweave_sim::export::{self, ExportOptions, export, run_clients};
use fedweave_sim::models::{ModelCard, ModelsError, PixelScaling, Which, read_checked};
use std::path::{Path, PathBuf};

/// The file format of `fedweave export`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// One safetensors file per client, PyTorch `state_dict` names and shapes.
    Safetensors,
    /// One ONNX graph per client: the forward pass with its weights, for serving.
    Onnx,
}

impl From<Format> for export::Format {
    fn from(f: Format) -> Self {
        match f {
            Format::Safetensors => export::Format::Safetensors,
            Format::Onnx => export::Format::Onnx,
        }
    }
}

/// Best or last models, on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum WhichArg {
    /// Each client's best-validation model (behind `mean_test_acc`).
    Best,
    /// Each client's model of the last round.
    Last,
}

impl From<WhichArg> for Which {
    fn from(w: WhichArg) -> Self {
        match w {
            WhichArg::Best => Which::Best,
            WhichArg::Last => Which::Last,
        }
    }
}

/// `fedweave export`.
#[derive(clap::Args)]
pub struct ExportArgs {
    /// The run directory.
    dir: PathBuf,
    /// Clients to export, e.g. `0,3,7` (default: every client with a model).
    #[arg(long, value_delimiter = ',')]
    clients: Option<Vec<usize>>,
    /// Which models.
    #[arg(long, value_enum, default_value = "best")]
    which: WhichArg,
    /// File format.
    #[arg(long, value_enum, default_value = "safetensors")]
    format: Format,
    /// Output folder (default: DIR/export-best or DIR/export-last).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Replace files that exist in the output folder.
    #[arg(long)]
    overwrite: bool,
}

/// `fedweave predict`.
#[derive(clap::Args)]
pub struct PredictArgs {
    /// The run directory.
    dir: PathBuf,
    /// Whose model classifies.
    #[arg(long)]
    client: usize,
    /// Samples: `.npy` (float32 features as the dataset feeds them, or
    /// uint8 raw pixels; shape [n, ...input shape] or [n, features]),
    /// `.csv` (one sample per row, the features, no label column), or for
    /// runs on image files (`image-folder`, `cinic10`, `tiny-imagenet`) a
    /// `.png` / `.jpg` image or a directory of them (one line per image, in
    /// file-name order), preprocessed as the run's dataset was.
    #[arg(long)]
    input: PathBuf,
    /// Which model.
    #[arg(long, value_enum, default_value = "best")]
    which: WhichArg,
    /// One JSON object per sample: the class and the class probabilities.
    #[arg(long)]
    json: bool,
}

/// Runs `fedweave export`: prints the files written.
pub fn run_export(args: ExportArgs) -> anyhow::Result<()> {
    let files = export(&ExportOptions {
        dir: args.dir,
        clients: args.clients,
        which: args.which.into(),
        out: args.out,
        overwrite: args.overwrite,
        format: args.format.into(),
    })?;
    for f in files {
        println!("{}", f.display());
    }
    Ok(())
}

/// Runs `fedweave predict`: one line per sample.
pub fn run_predict(args: PredictArgs) -> anyhow::Result<()> {
    let card = ModelCard::read(&args.dir)?;
    let clients = run_clients(&args.dir)?;
    if args.client >= clients {
        return Err(ModelsError::NoClient {
            client: args.client,
            last: clients.saturating_sub(1),
        }
        .into());
    }
    let kept = read_checked(&args.dir, args.which.into(), args.client)?;
    if !kept.exact {
        eprintln!(
            "note: `{}` scores with more than this model (its own evaluation differs); these are the model's own outputs",
            kept.algorithm
        );
    }
    let spec = card.spec()?;
    let features = if is_images(&args.input) {
        read_images(&args.dir, &args.input, &card)?
    } else {
        read_input(&args.input, &card)?
    };
    let n = features.len() / spec.input_len();
    let labels = vec![0u32; n];
    let rows: Vec<usize> = (0..n).collect();
    let data = LocalData::new(&features, &labels, &rows);
    let out = fedweave_nn::predict(&spec, &kept.model.params, &kept.model.buffers, &data);
    let mut text = String::new();
    for k in 0..out.len() {
        let row = out.output(k);
        if !card.classification {
            let values: Vec<String> = row.iter().map(f32::to_string).collect();
            text.push_str(&values.join(","));
        } else {
            let class = (0..row.len()).fold(0, |b, c| if row[c] > row[b] { c } else { b });
            if args.json {
                let top = f64::from(row[class]);
                let e: Vec<f64> = row.iter().map(|&z| (f64::from(z) - top).exp()).collect();
                let sum: f64 = e.iter().sum();
                let p: Vec<f64> = e.iter().map(|v| v / sum).collect();
                let line = serde_json::json!({"class": class, "probabilities": p});
                text.push_str(&line.to_string());
            } else {
                text.push_str(&class.to_string());
            }
        }
        text.push('\n');
    }
    print!("{text}");
    Ok(())
}

/// What the model expects, for error messages.
fn expected(card: &ModelCard) -> String {
    let len: usize = card.input_shape.iter().product();
    format!(
        "the model takes samples of shape {:?} ({len} features): give [n, {}] or [n, {len}]",
        card.input_shape,
        card.input_shape
            .iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// Whether `path` is an image file or a directory (of images).
fn is_images(path: &Path) -> bool {
    let ext = path
        .extension()
        .map(|e| e.to_string_lossy().to_lowercase())
        .unwrap_or_default();
    path.is_dir() || ["png", "jpg", "jpeg"].contains(&ext.as_str())
}

/// The image `path`, or the images of the directory `path` sorted by file
/// name, preprocessed as the run in `run_dir` preprocessed its dataset
/// (channels, size, normalisation: its `config.toml`).
fn read_images(run_dir: &Path, path: &Path, card: &ModelCard) -> anyhow::Result<Vec<f32>> {
    let cfg = fedweave_sim::ExperimentConfig::from_file(&run_dir.join("config.toml"), &[])?;
    let prep = fedweave_data::image_prep(&cfg.data).with_context(|| {
        format!(
            "{}: image input needs a run on image files (image-folder, cinic10, tiny-imagenet)",
            path.display()
        )
    })?;
    let files: Vec<PathBuf> = if path.is_dir() {
        let mut files = Vec::new();
        for entry in
            std::fs::read_dir(path).with_context(|| format!("cannot read {}", path.display()))?
        {
            let p = entry
                .with_context(|| format!("cannot read {}", path.display()))?
                .path();
            if !p.is_dir() && is_images(&p) {
                files.push(p);
            }
        }
        files.sort();
        anyhow::ensure!(
            !files.is_empty(),
            "{}: no .png or .jpg image",
            path.display()
        );
        files
    } else {
        vec![path.to_path_buf()]
    };
    let mut out = Vec::new();
    for f in &files {
        let bytes = std::fs::read(f).with_context(|| format!("cannot read {}", f.display()))?;
        let [h, w] = prep.features(&bytes, f, &mut out)?;
        let shape = [prep.channels, h, w];
        anyhow::ensure!(
            shape[..] == card.input_shape[..],
            "{}: the image gives samples of shape {shape:?} but the model takes {:?} (the run's images were {}×{})",
            f.display(),
            card.input_shape,
            card.input_shape.get(2).copied().unwrap_or_default(),
            card.input_shape.get(1).copied().unwrap_or_default(),
        );
    }
    Ok(out)
}

/// The samples of `path` as the model's flat inputs.
fn read_input(path: &Path, card: &ModelCard) -> anyhow::Result<Vec<f32>> {
    let len: usize = card.input_shape.iter().product();
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let ext = path
        .extension()
        .map(|e| e.to_string_lossy().to_lowercase())
        .unwrap_or_default();
    let values = match ext.as_str() {
        "npy" => read_npy(&bytes, card).with_context(|| format!("{}", path.display()))?,
        "csv" => read_csv(&bytes, len).with_context(|| format!("{}", path.display()))?,
        _ => anyhow::bail!(
            "{}: give a .npy or a .csv file (one sample per row)",
            path.display()
        ),
    };
    anyhow::ensure!(!values.is_empty(), "{}: no samples", path.display());
    anyhow::ensure!(
        values.iter().all(|v| v.is_finite()),
        "{}: values must be finite",
        path.display()
    );
    Ok(values)
}

/// A `.npy` array of float32, float64 or uint8 (raw pixels, scaled as the
/// dataset's loader scales them).
fn read_npy(bytes: &[u8], card: &ModelCard) -> anyhow::Result<Vec<f32>> {
    let len: usize = card.input_shape.iter().product();
    let npy = npyz::NpyFile::new(bytes).context("not a valid .npy file")?;
    anyhow::ensure!(
        npy.order() == npyz::Order::C,
        "a Fortran-ordered array; save it in C order (numpy's default)"
    );
    let shape: Vec<usize> = npy.shape().iter().map(|&d| d as usize).collect();
    let fits = shape.len() >= 2 && shape[1..].iter().product::<usize>() == len
        || shape.as_slice() == card.input_shape.as_slice();
    anyhow::ensure!(fits, "array of shape {shape:?}; {}", expected(card));
    let descr = npy.dtype().descr();
    Ok(match descr.trim_matches('\'') {
        "<f4" => npy.into_vec::<f32>()?,
        "<f8" => npy
            .into_vec::<f64>()?
            .into_iter()
            .map(|v| v as f32)
            .collect(),
        "|u1" => {
            let Some(PixelScaling { max, mean, std }) = card.pixels else {
                anyhow::bail!(
                    "uint8 input is read as raw pixels only for digits, mnist and fashion-mnist; this run is on {}: give float32 features as the dataset feeds them",
                    card.dataset
                );
            };
            npy.into_vec::<u8>()?
                .into_iter()
                .map(|p| (f32::from(p) / max - mean) / std)
                .collect()
        }
        other => anyhow::bail!("dtype `{other}`: give float32 (<f4), float64 or uint8 values"),
    })
}

/// A `.csv` file, one sample of `len` values per row (a header row of
/// names is skipped).
fn read_csv(bytes: &[u8], len: usize) -> anyhow::Result<Vec<f32>> {
    let text = std::str::from_utf8(bytes).context("not UTF-8 text")?;
    let mut out = Vec::new();
    for (k, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let cells: Vec<&str> = line.split(',').map(str::trim).collect();
        let parsed: Result<Vec<f32>, _> = cells.iter().map(|c| c.parse::<f32>()).collect();
        match parsed {
            Ok(row) if row.len() == len => out.extend(row),
            Ok(row) => anyhow::bail!(
                "row {} has {} values; the model takes {len} features per sample (no label column)",
                k + 1,
                row.len()
            ),
            Err(_) if k == 0 => {}
            Err(e) => anyhow::bail!("row {}: {e}", k + 1),
        }
    }
    Ok(out)
}
