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
use fedweave_nn::{LayerDesc, ModelSpec};
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

/// PyTorch's name of fedweave's tensor `name`, and whether its values are
/// transposed (fedweave's `[in, out]` linear weights): the weights of the
/// linear layers of the model's description (`linear`), or without one
/// (gru, textcnn, mf) every 2-D `.weight` but the embeddings' and the
/// GRU's `nn.GRU` weights (`gru.weight_ih_l0`).
fn torch_name(name: &str, shape: &[usize], linear: Option<&[String]>) -> (String, bool) {
    if let Some(linear) = linear {
        return (name.to_string(), linear.iter().any(|l| l == name));
    }
    if let Some(gru) = name.strip_prefix("gru.") {
        return (
            format!("{name}_l0"),
            shape.len() == 2 && gru.starts_with("weight"),
        );
    }
    let flip = shape.len() == 2 && name.ends_with(".weight") && !name.starts_with("embedding.");
    (name.to_string(), flip)
}

/// The parameterised layers of a description with their full names
/// (residual blocks' inner names prefixed with the block's), in order.
pub fn named_layers(layers: &[LayerDesc]) -> Vec<(String, &LayerDesc)> {
    fn walk<'a>(layers: &'a [LayerDesc], prefix: &str, out: &mut Vec<(String, &'a LayerDesc)>) {
        for l in layers {
            match l {
                LayerDesc::Residual {
                    name,
                    layers,
                    shortcut,
                } => {
                    let inner = format!("{prefix}{name}.");
                    walk(layers, &inner, out);
                    walk(shortcut, &inner, out);
                }
                LayerDesc::Linear { name, .. }
                | LayerDesc::Conv2d { name, .. }
                | LayerDesc::BatchNorm2d { name, .. }
                | LayerDesc::GroupNorm { name, .. }
                | LayerDesc::Embedding { name, .. } => out.push((format!("{prefix}{name}"), l)),
                _ => {}
            }
        }
    }
    let mut out = Vec::new();
    walk(layers, "", &mut out);
    out
}

/// The names of `spec`'s linear weights, if it has a description.
fn linear_weights(spec: &ModelSpec) -> Option<Vec<String>> {
    let layers = spec.describe()?;
    Some(
        named_layers(&layers)
            .into_iter()
            .filter(|(_, l)| matches!(l, LayerDesc::Linear { .. }))
            .map(|(name, _)| format!("{name}.weight"))
            .collect(),
    )
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
    let linear = linear_weights(spec);
    let mut out = Vec::new();
    for group in spec.layout().groups() {
        for t in spec
            .layout()
            .tensors()
            .iter()
            .filter(|t| group.range.contains(&t.offset))
        {
            let (name, flip) = torch_name(&t.name, &t.shape, linear.as_deref());
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
    let linear = linear_weights(spec);
    for t in spec.layout().tensors() {
        let (name, flip) = torch_name(&t.name, &t.shape, linear.as_deref());
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

/// The model's layer list as `scripts/load_exported.py` builds it (each
/// entry a `type` and its arguments, named layers with the `name` their
/// `state_dict` keys start with), from the architecture's description in
/// the registry. `None` for gru, textcnn and mf, which are not a plain
/// sequence of layers: their `kind` names the architecture.
pub fn layers(spec: &ModelSpec) -> Option<Vec<Value>> {
    let layers = spec.describe()?;
    layers
        .iter()
        .map(|l| serde_json::to_value(l).ok())
        .collect()
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
            kind: card.kind.name().to_string(),
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
        "kind": card.kind.name(),
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
    use fedweave_nn::{InputValues, ModelInput, ModelKind, SequentialConfig};

    /// A small sequential model with every kind of parameterised layer a
    /// dense input takes, a residual block with a conv shortcut included.
    fn sequential_input() -> ModelInput {
        let layers: SequentialConfig = toml::from_str(
            r#"
            layers = [
              { type = "conv2d", out_channels = 4, kernel = 3, padding = 1 },
              { type = "batch_norm" },
              { type = "relu" },
              { type = "residual", layers = [
                  { type = "conv2d", out_channels = 8, kernel = 3, padding = 1, bias = false },
                  { type = "group_norm", groups = 2 },
                ], shortcut = [{ type = "conv2d", out_channels = 8, kernel = 1 }] },
              { type = "max_pool2d", kernel = 2 },
              { type = "flatten" },
              { type = "linear", out_features = 16 },
              { type = "relu" },
              { type = "linear" },
            ]
            "#,
        )
        .unwrap();
        ModelInput {
            sequential: Some(layers),
            ..Default::default()
        }
    }

    /// Every architecture: the state_dict round-trips bit for bit, linear
    /// weights come out `[out, in]`, batch-norm layers carry their
    /// statistics, and every model but gru, textcnn and mf has a layer list.
    #[test]
    fn every_model_round_trips_through_its_state_dict() {
        let dense = ModelInput::default();
        let tokens = ModelInput {
            values: InputValues::Tokens { vocab: 30 },
            embed_dim: Some(8),
            ..Default::default()
        };
        let ids = ModelInput {
            values: InputValues::Categorical {
                cardinalities: vec![7, 9],
            },
            embed_dim: Some(4),
            ..Default::default()
        };
        let seq = sequential_input();
        let cases: Vec<(ModelKind, Vec<usize>, &ModelInput)> = vec![
            (ModelKind::MLP, vec![1, 8, 8], &dense),
            (ModelKind::CNN, vec![1, 28, 28], &dense),
            (ModelKind::CNN_BN, vec![3, 32, 32], &dense),
            (ModelKind::CNN_DWA, vec![3, 32, 32], &dense),
            (ModelKind::GRU, vec![12, 3], &dense),
            (ModelKind::RESNET8, vec![3, 16, 16], &dense),
            (ModelKind::RESNET9, vec![3, 16, 16], &dense),
            (ModelKind::RESNET18, vec![3, 16, 16], &dense),
            (ModelKind::TEXTCNN, vec![20], &tokens),
            (ModelKind::MF, vec![2], &ids),
            (ModelKind::SEQUENTIAL, vec![3, 8, 8], &seq),
        ];
        assert_eq!(cases.len(), ModelKind::catalogue().len(), "every model");
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
            let head = ["fc.weight", "fc3.weight", "head.weight", "layers.8.weight"];
            let head = dict
                .iter()
                .find(|t| head.contains(&t.name.as_str()))
                .unwrap();
            assert_eq!(head.shape[0], 5, "{kind:?}: the head's weight is [out, in]");
            let stats = dict
                .iter()
                .filter(|t| t.name.ends_with(".running_var"))
                .count();
            let norms = spec.split().batch_norm.len();
            assert_eq!(stats, norms, "{kind:?}");
            let listed = ![ModelKind::GRU, ModelKind::TEXTCNN, ModelKind::MF].contains(&kind);
            assert_eq!(layers(&spec).is_some(), listed, "{kind:?}");
        }
    }

    /// The layer list names each parameterised layer once, with the
    /// layout's group names (what `load_exported.py` attaches the modules
    /// under), in layout order: the ResNets' blocks as `residual` entries,
    /// a sequential model's layers as `nn.Sequential` names them.
    #[test]
    fn layer_lists_name_the_layout_groups_one_to_one() {
        let seq = sequential_input();
        let dense = ModelInput::default();
        for (kind, input) in [
            (ModelKind::RESNET8, &dense),
            (ModelKind::RESNET9, &dense),
            (ModelKind::RESNET18, &dense),
            (ModelKind::CNN_BN, &dense),
            (ModelKind::SEQUENTIAL, &seq),
        ] {
            let side = if kind == ModelKind::CNN_BN { 28 } else { 8 };
            let spec = ModelSpec::with_input(kind, &[3, side, side], 5, input).unwrap();
            let desc = spec.describe().unwrap();
            let listed: Vec<String> = named_layers(&desc).into_iter().map(|(n, _)| n).collect();
            let groups: Vec<String> = spec
                .layout()
                .groups()
                .iter()
                .map(|g| g.name.clone())
                .collect();
            assert_eq!(listed, groups, "{kind:?}");
        }
        let spec = ModelSpec::with_input(ModelKind::SEQUENTIAL, &[3, 8, 8], 5, &seq).unwrap();
        let names: Vec<String> = to_state_dict(
            &spec,
            &Snapshot {
                params: vec![0.0; spec.layout().len()],
                buffers: vec![0.0; spec.buffer_len()],
            },
        )
        .into_iter()
        .map(|t| t.name)
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
                "layers.3.layers.0.weight",
                "layers.3.layers.1.weight",
                "layers.3.layers.1.bias",
                "layers.3.shortcut.0.weight",
                "layers.3.shortcut.0.bias",
                "layers.6.weight",
                "layers.6.bias",
                "layers.8.weight",
                "layers.8.bias",
            ]
        );
        // A torch Linear(16, 5) weight is [5, 16]; the layout stores [16, 5].
        let json = serde_json::to_value(&spec.describe().unwrap()[8]).unwrap();
        assert_eq!(json["type"], "linear");
        assert_eq!(json["in_features"], 16);
        assert_eq!(json["out_features"], 5);
    }
}
