//! `fedweave export`: clients' kept models (see [`crate::models`]) as
//! PyTorch `state_dict`s in safetensors files, one per client, plus a
//! `model.json` a loader rebuilds the architecture from.
//!
//! Names are fedweave's layer names (`conv1.weight`, `bn1.running_mean`,
//! `fc3.bias`), which are the attribute names of the modules in
//! `scripts/load_exported.py`; shapes are PyTorch's: linear weights
//! `[out, in]` (fedweave stores `[in, out]`, so they are transposed),
//! convolutions `[out, in, kh, kw]` as stored, batch norm with
//! `running_mean`, `running_var` (F32) and `num_batches_tracked` (I64
//! scalar, 0: fedweave does not count batches; PyTorch reads it only when
//! `momentum = None`). GRU tensors take `nn.GRU`'s names (`gru.weight_ih_l0`,
//! gates r, z, n as PyTorch), embedding tables stay `[rows, dim]`.

use crate::models::{ModelCard, ModelsError, Snapshot, Which, read_checked};
use fedweave_nn::{ModelKind, ModelSpec};
use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use serde::Serialize;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// A tensor's values in an exported file.
#[derive(Clone, Debug, PartialEq)]
pub enum TorchData {
    /// 32-bit floats (parameters, running statistics).
    F32(Vec<f32>),
    /// 64-bit integers (`num_batches_tracked`).
    I64(Vec<i64>),
}

/// One entry of a PyTorch `state_dict`.
#[derive(Clone, Debug, PartialEq)]
pub struct TorchTensor {
    /// Its key (`conv1.weight`).
    pub name: String,
    /// PyTorch's shape (`[]` for a scalar).
    pub shape: Vec<usize>,
    /// Values, row-major.
    pub data: TorchData,
}

/// PyTorch's name of fedweave's tensor `name` in a `kind` model, and
/// whether its values are transposed (2-D `[in, out]` linear weights).
fn torch_name(kind: ModelKind, name: &str, shape: &[usize]) -> (String, bool) {
    let renamed = match (kind, name) {
        (ModelKind::Gru, "gru.weight_ih" | "gru.weight_hh" | "gru.bias_ih" | "gru.bias_hh") => {
            format!("{name}_l0")
        }
        _ => name.to_string(),
    };
    let linear = shape.len() == 2
        && (name.ends_with(".weight") || kind == ModelKind::Gru && name.starts_with("gru.weight"))
        && !name.starts_with("embedding.");
    (renamed, linear)
}

/// `m` (`rows × cols`, row-major) transposed.
fn transpose(m: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0; m.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = m[r * cols + c];
        }
    }
    out
}

/// The batch-norm layers of `spec`: (layer name, channels, buffer offset),
/// in the order their running statistics lie in the buffer vector.
fn batch_norms(spec: &ModelSpec) -> Vec<(String, usize, usize)> {
    let mut at = 0;
    spec.split()
        .batch_norm
        .iter()
        .filter_map(|r| {
            let group = spec.layout().groups().iter().find(|g| g.range == *r)?;
            let c = r.len() / 2;
            let out = (group.name.clone(), c, at);
            at += 2 * c;
            Some(out)
        })
        .collect()
}

/// `model` (a `spec` model) as PyTorch's `state_dict`, in PyTorch's order.
pub fn to_state_dict(spec: &ModelSpec, model: &Snapshot) -> Vec<TorchTensor> {
    let norms = batch_norms(spec);
    let mut out = Vec::new();
    for group in spec.layout().groups() {
        for t in spec
            .layout()
            .tensors()
            .iter()
            .filter(|t| group.range.contains(&t.offset))
        {
            let (name, flip) = torch_name(spec.kind(), &t.name, &t.shape);
            let values = &model.params[t.range()];
            let (shape, values) = if flip {
                let (rows, cols) = (t.shape[0], t.shape[1]);
                (vec![cols, rows], transpose(values, rows, cols))
            } else {
                (t.shape.clone(), values.to_vec())
            };
            out.push(TorchTensor {
                name,
                shape,
                data: TorchData::F32(values),
            });
        }
        if let Some((layer, c, at)) = norms.iter().find(|n| n.0 == group.name) {
            for (suffix, from) in [("running_mean", *at), ("running_var", at + c)] {
                out.push(TorchTensor {
                    name: format!("{layer}.{suffix}"),
                    shape: vec![*c],
                    data: TorchData::F32(model.buffers[from..from + c].to_vec()),
                });
            }
            out.push(TorchTensor {
                name: format!("{layer}.num_batches_tracked"),
                shape: vec![],
                data: TorchData::I64(vec![0]),
            });
        }
    }
    out
}

/// The inverse of [`to_state_dict`]: fedweave's flat vectors from a
/// `state_dict` of a `spec` model (every tensor present, shapes PyTorch's);
/// the error names the first tensor missing or of the wrong shape.
pub fn from_state_dict(spec: &ModelSpec, tensors: &[TorchTensor]) -> Result<Snapshot, String> {
    let find = |name: &str, shape: &[usize]| -> Result<&[f32], String> {
        let t = tensors
            .iter()
            .find(|t| t.name == name)
            .ok_or_else(|| format!("tensor `{name}` is missing"))?;
        match &t.data {
            TorchData::F32(v) if t.shape == shape && v.len() == shape.iter().product::<usize>() => {
                Ok(v)
            }
            _ => Err(format!(
                "tensor `{name}` has shape {:?}, the model needs f32 {shape:?}",
                t.shape
            )),
        }
    };
    let mut params = vec![0.0; spec.layout().len()];
    for t in spec.layout().tensors() {
        let (name, flip) = torch_name(spec.kind(), &t.name, &t.shape);
        let v = if flip {
            let (rows, cols) = (t.shape[0], t.shape[1]);
            transpose(find(&name, &[cols, rows])?, cols, rows)
        } else {
            find(&name, &t.shape)?.to_vec()
        };
        params[t.range()].copy_from_slice(&v);
    }
    let mut buffers = vec![0.0; spec.buffer_len()];
    for (layer, c, at) in batch_norms(spec) {
        for (suffix, from) in [("running_mean", at), ("running_var", at + c)] {
            buffers[from..from + c].copy_from_slice(find(&format!("{layer}.{suffix}"), &[c])?);
        }
    }
    Ok(Snapshot { params, buffers })
}

/// Serialises a `state_dict` as safetensors with `meta`.
pub fn write_state_dict(
    tensors: &[TorchTensor],
    meta: HashMap<String, String>,
) -> Result<Vec<u8>, String> {
    let bytes: Vec<Vec<u8>> = tensors
        .iter()
        .map(|t| match &t.data {
            TorchData::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            TorchData::I64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        })
        .collect();
    let mut views = Vec::with_capacity(tensors.len());
    for (t, b) in tensors.iter().zip(&bytes) {
        let dtype = match t.data {
            TorchData::F32(_) => Dtype::F32,
            TorchData::I64(_) => Dtype::I64,
        };
        let view = TensorView::new(dtype, t.shape.clone(), b).map_err(|e| e.to_string())?;
        views.push((t.name.as_str(), view));
    }
    safetensors::tensor::serialize(views, Some(meta)).map_err(|e| e.to_string())
}

/// Reads a safetensors `state_dict` (F32 and I64 tensors), in file order.
pub fn read_state_dict(bytes: &[u8]) -> Result<Vec<TorchTensor>, String> {
    let st = SafeTensors::deserialize(bytes).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for (name, t) in st.iter() {
        let chunks = |n: usize| t.data().chunks_exact(n);
        let data = match t.dtype() {
            Dtype::F32 => TorchData::F32(
                chunks(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect(),
            ),
            Dtype::I64 => TorchData::I64(
                chunks(8)
                    .map(|b| i64::from_le_bytes(b.try_into().unwrap_or_default()))
                    .collect(),
            ),
            other => return Err(format!("tensor `{name}` has dtype {other:?}")),
        };
        out.push(TorchTensor {
            name: name.to_string(),
            shape: t.shape().to_vec(),
            data,
        });
    }
    Ok(out)
}

/// The layer list of the models whose forward pass is a plain sequence
/// (`mlp`, `cnn`, `cnn-bn`, `cnn-dwa`), as `scripts/load_exported.py`
/// builds it: each entry a `type` and its arguments, named layers with
/// the `name` their `state_dict` keys start with. `None` for the others
/// (ResNets, GRU, TextCNN, MF), whose `kind` names the architecture.
pub fn layers(spec: &ModelSpec) -> Option<Vec<Value>> {
    let shape = |name: &str| {
        spec.layout()
            .tensor(name)
            .map(|t| t.shape.clone())
            .unwrap_or_default()
    };
    let linear = |name: &str| {
        let s = shape(&format!("{name}.weight"));
        json!({"type": "linear", "name": name, "in_features": s[0], "out_features": s[1]})
    };
    let conv = |name: &str| {
        let s = shape(&format!("{name}.weight"));
        json!({"type": "conv2d", "name": name, "in_channels": s[1], "out_channels": s[0],
               "kernel_size": s[2], "stride": 1, "padding": 0})
    };
    let bn = |name: &str| {
        let s = shape(&format!("{name}.weight"));
        json!({"type": "batch_norm2d", "name": name, "num_features": s[0], "eps": 1e-5, "momentum": 0.1})
    };
    let relu = json!({"type": "relu"});
    let pool = json!({"type": "max_pool2d", "kernel_size": 2, "stride": 2});
    let flatten = json!({"type": "flatten"});
    // The three fully connected layers of `mlp` and `cnn`.
    let three_fc = || {
        vec![
            flatten.clone(),
            linear("fc1"),
            relu.clone(),
            linear("fc2"),
            relu.clone(),
            linear("fc3"),
        ]
    };
    let list = match spec.kind() {
        ModelKind::Mlp => three_fc(),
        ModelKind::Cnn => [
            vec![
                conv("conv1"),
                relu.clone(),
                pool.clone(),
                conv("conv2"),
                relu.clone(),
                pool.clone(),
            ],
            three_fc(),
        ]
        .concat(),
        ModelKind::CnnBn => vec![
            conv("conv1"),
            bn("bn1"),
            relu.clone(),
            pool.clone(),
            conv("conv2"),
            bn("bn2"),
            relu.clone(),
            pool.clone(),
            flatten.clone(),
            linear("fc1"),
            relu.clone(),
            linear("fc"),
        ],
        ModelKind::CnnDwa => vec![
            conv("conv1"),
            relu.clone(),
            pool.clone(),
            bn("bn1"),
            conv("conv2"),
            relu.clone(),
            pool.clone(),
            bn("bn2"),
            flatten.clone(),
            linear("fc1"),
            relu.clone(),
            linear("fc"),
        ],
        _ => return None,
    };
    Some(list)
}

/// The file format of an export.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Format {
    /// One safetensors file per client: PyTorch `state_dict` names and shapes.
    #[default]
    Safetensors,
    /// One ONNX graph per client: the forward pass with its weights
    /// ([`crate::onnx`]), for serving.
    Onnx,
}

impl Format {
    /// The file extension.
    fn extension(self) -> &'static str {
        match self {
            Format::Safetensors => "safetensors",
            Format::Onnx => "onnx",
        }
    }
}

/// What `fedweave export` is asked for.
#[derive(Clone, Debug)]
pub struct ExportOptions {
    /// The run directory.
    pub dir: PathBuf,
    /// The clients (`None`: every client with a kept model); exported in
    /// ascending order, each once.
    pub clients: Option<Vec<usize>>,
    /// Best or last models.
    pub which: Which,
    /// Where to write (`None`: `DIR/export-best` or `DIR/export-last`).
    pub out: Option<PathBuf>,
    /// Replace files that exist.
    pub overwrite: bool,
    /// The file format.
    pub format: Format,
}

/// One exported client, as `model.json` lists it.
#[derive(Clone, Debug, Serialize)]
pub struct Exported {
    /// The client.
    pub client: usize,
    /// The round its model was scored in.
    pub round: usize,
    /// The file, relative to the export folder.
    pub file: String,
}

/// Exports the kept models `opts` asks for; returns the files written
/// (`model.json` last). Nothing is written when any client is missing or
/// out of range, or when a file exists and `overwrite` is not set.
pub fn export(opts: &ExportOptions) -> Result<Vec<PathBuf>, ModelsError> {
    let dir = &opts.dir;
    let card = ModelCard::read(dir)?;
    let clients = run_clients(dir)?;
    let wanted: Vec<usize> = match &opts.clients {
        Some(list) => {
            if let Some(&bad) = list.iter().find(|&&c| c >= clients) {
                return Err(ModelsError::NoClient {
                    client: bad,
                    last: clients.saturating_sub(1),
                });
            }
            let mut list = list.clone();
            list.sort_unstable();
            list.dedup();
            list
        }
        None => (0..clients)
            .filter(|&i| crate::models::model_path(dir, opts.which, i).is_file())
            .collect(),
    };
    let mut models = Vec::with_capacity(wanted.len());
    for &i in &wanted {
        models.push((i, read_checked(dir, opts.which, i)?));
    }
    if models.is_empty() {
        return Err(ModelsError::NoneKept {
            which: opts.which.name(),
            dir: dir.clone(),
            why: match opts.which {
                Which::Best => "best models are written once a round is scored",
                Which::Last => "last models are written when the run finishes its last round",
            },
        });
    }
    let out = opts
        .out
        .clone()
        .unwrap_or_else(|| dir.join(format!("export-{}", opts.which.name())));
    let file = |i: usize| format!("client-{i}.{}", opts.format.extension());
    let targets: Vec<PathBuf> = wanted
        .iter()
        .map(|&i| out.join(file(i)))
        .chain([out.join("model.json")])
        .collect();
    if !opts.overwrite
        && let Some(t) = targets.iter().find(|t| t.exists())
    {
        return Err(ModelsError::Exists(t.clone()));
    }
    let spec = card.spec()?;
    let layer_list = layers(&spec);
    if opts.format == Format::Onnx && layer_list.is_none() {
        return Err(ModelsError::NoFormat {
            kind: kind_name(card.kind),
            format: "ONNX",
            why: "its forward pass is not a layer list; export --format safetensors".into(),
        });
    }
    std::fs::create_dir_all(&out).map_err(|source| ModelsError::Io {
        path: out.clone(),
        source,
    })?;
    let mut listed = Vec::new();
    for ((i, kept), target) in models.iter().zip(&targets) {
        let bad = |message: String| ModelsError::Corrupt {
            path: crate::models::model_path(dir, opts.which, *i),
            message,
        };
        if kept.model.params.len() != spec.layout().len()
            || kept.model.buffers.len() != spec.buffer_len()
        {
            return Err(bad("does not match the run's model card".into()));
        }
        let dict = to_state_dict(&spec, &kept.model);
        let bytes = match (opts.format, &layer_list) {
            (Format::Onnx, Some(list)) => {
                let doc = format!(
                    "client {i}'s {} model (round {}) of a fedweave run of {}",
                    opts.which.name(),
                    kept.round,
                    card.algorithm
                );
                crate::onnx::onnx_model(list, &dict, &card.input_shape, card.outputs, &doc)
                    .map_err(bad)?
            }
            // PyTorch's convention; which client and round is in model.json.
            _ => write_state_dict(&dict, HashMap::from([("format".into(), "pt".into())]))
                .map_err(bad)?,
        };
        crate::models::write_atomic(target, &bytes).map_err(|source| ModelsError::Io {
            path: target.clone(),
            source,
        })?;
        listed.push(Exported {
            client: *i,
            round: kept.round,
            file: file(*i),
        });
    }
    let probe = to_state_dict(
        &spec,
        &Snapshot {
            params: vec![0.0; spec.layout().len()],
            buffers: vec![0.0; spec.buffer_len()],
        },
    );
    let description = json!({
        "format": "fedweave-export",
        "version": 1,
        "kind": kind_name(card.kind),
        "input_shape": card.input_shape,
        "outputs": card.outputs,
        "classification": card.classification,
        "input": card.input,
        "pixels": card.pixels,
        "dataset": card.dataset,
        "algorithm": card.algorithm,
        "exact": card.exact,
        "which": opts.which.name(),
        "file_format": opts.format.extension(),
        "layers": layer_list,
        "state_dict": probe.iter().map(|t| json!({
            "name": t.name,
            "shape": t.shape,
            "dtype": match t.data { TorchData::F32(_) => "float32", TorchData::I64(_) => "int64" },
        })).collect::<Vec<_>>(),
        "clients": listed,
    });
    let json_path = out.join("model.json");
    let text = serde_json::to_string_pretty(&description).unwrap_or_default();
    crate::models::write_atomic(&json_path, text.as_bytes()).map_err(|source| ModelsError::Io {
        path: json_path.clone(),
        source,
    })?;
    Ok(targets)
}

/// The model kind's name in configs (`cnn-bn`).
fn kind_name(kind: ModelKind) -> String {
    serde_json::to_value(kind)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// The number of clients of the run in `dir`.
pub fn run_clients(dir: &Path) -> Result<usize, ModelsError> {
    let path = dir.join("config.toml");
    let cfg = crate::ExperimentConfig::from_file(&path, &[])
        .map_err(|e| Box::new(crate::RunError::Config(e)))?;
    Ok(cfg.clients)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fedweave_core::{Purpose, rng_stream};
    use fedweave_nn::{InputValues, ModelInput};

    /// Every architecture: the state_dict round-trips bit for bit, linear
    /// weights come out `[out, in]`, batch-norm layers carry their
    /// statistics.
    #[test]
    fn every_model_round_trips_through_its_state_dict() {
        let dense = ModelInput::default();
        let tokens = ModelInput {
            values: InputValues::Tokens { vocab: 30 },
            embed_dim: Some(8),
        };
        let ids = ModelInput {
            values: InputValues::Categorical {
                cardinalities: vec![7, 9],
            },
            embed_dim: Some(4),
        };
        let cases: Vec<(ModelKind, Vec<usize>, &ModelInput)> = vec![
            (ModelKind::Mlp, vec![1, 8, 8], &dense),
            (ModelKind::Cnn, vec![1, 28, 28], &dense),
            (ModelKind::CnnBn, vec![3, 32, 32], &dense),
            (ModelKind::CnnDwa, vec![3, 32, 32], &dense),
            (ModelKind::Gru, vec![12, 3], &dense),
            (ModelKind::ResNet8, vec![3, 16, 16], &dense),
            (ModelKind::ResNet9, vec![3, 16, 16], &dense),
            (ModelKind::ResNet18, vec![3, 16, 16], &dense),
            (ModelKind::TextCnn, vec![20], &tokens),
            (ModelKind::Mf, vec![2], &ids),
        ];
        for (kind, shape, input) in cases {
            let spec = ModelSpec::with_input(kind, &shape, 5, input).unwrap();
            let mut rng = rng_stream(1, 0, 0, Purpose::ModelInit);
            let model = Snapshot {
                params: spec.init(&mut rng),
                buffers: (0..spec.buffer_len()).map(|k| k as f32 * 0.5).collect(),
            };
            let dict = to_state_dict(&spec, &model);
            let bytes = write_state_dict(&dict, HashMap::new()).unwrap();
            let back = from_state_dict(&spec, &read_state_dict(&bytes).unwrap()).unwrap();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&back.params), bits(&model.params), "{kind:?}");
            assert_eq!(bits(&back.buffers), bits(&model.buffers), "{kind:?}");
            let head = dict
                .iter()
                .find(|t| {
                    t.name == "fc.weight" || t.name == "fc3.weight" || t.name == "head.weight"
                })
                .unwrap();
            assert_eq!(head.shape[0], 5, "{kind:?}: the head's weight is [out, in]");
            let stats = dict
                .iter()
                .filter(|t| t.name.ends_with(".running_var"))
                .count();
            let norms = spec.split().batch_norm.len();
            assert_eq!(stats, norms, "{kind:?}");
            let listed = matches!(
                kind,
                ModelKind::Mlp | ModelKind::Cnn | ModelKind::CnnBn | ModelKind::CnnDwa
            );
            assert_eq!(layers(&spec).is_some(), listed, "{kind:?}");
        }
    }
}
