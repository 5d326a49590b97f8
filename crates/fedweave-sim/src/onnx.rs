//! ONNX export of a kept model's forward pass, for serving it with any ONNX
//! runtime (`fedweave export --format onnx`).
//!
//! The graph is built from the same two things a PyTorch user gets: the
//! layer list of `model.json` ([`crate::export::layers`]) and the client's
//! `state_dict` ([`crate::export::to_state_dict`]), so the ONNX model and the
//! safetensors file cannot disagree. Input `input` is `[batch, *input_shape]`
//! `float32` (batch dynamic), output `logits` is `[batch, outputs]`; batch
//! norm runs on its running statistics (evaluation), dropout is the
//! identity. Weights are initializers named as in the `state_dict`.
//!
//! The ONNX messages are declared here with prost (the subset of
//! `onnx.proto` a feed-forward graph needs, field numbers from the
//! specification); IR version 8, opset 17, which every current runtime
//! reads.

use crate::export::{TorchData, TorchTensor};
use prost::Message;
use serde_json::Value;

/// ONNX IR version written (ONNX 1.13+).
const IR_VERSION: i64 = 8;
/// Default-domain opset written.
const OPSET: i64 = 17;
/// `TensorProto.DataType.FLOAT`.
const FLOAT: i32 = 1;
/// `TensorProto.DataType.INT64`.
const INT64: i32 = 7;

/// The subset of `onnx.proto` fedweave writes.
pub mod proto {
    use prost::Message;

    /// `onnx.ModelProto`.
    #[derive(Clone, PartialEq, Message)]
    pub struct ModelProto {
        /// The IR version.
        #[prost(int64, tag = "1")]
        pub ir_version: i64,
        /// Who wrote it.
        #[prost(string, tag = "2")]
        pub producer_name: String,
        /// Its version.
        #[prost(string, tag = "3")]
        pub producer_version: String,
        /// Free text.
        #[prost(string, tag = "6")]
        pub doc_string: String,
        /// The graph.
        #[prost(message, optional, tag = "7")]
        pub graph: Option<GraphProto>,
        /// Operator sets used.
        #[prost(message, repeated, tag = "8")]
        pub opset_import: Vec<OperatorSetIdProto>,
    }

    /// `onnx.OperatorSetIdProto`.
    #[derive(Clone, PartialEq, Message)]
    pub struct OperatorSetIdProto {
        /// The domain (`""`: the default ONNX operators).
        #[prost(string, tag = "1")]
        pub domain: String,
        /// The opset version.
        #[prost(int64, tag = "2")]
        pub version: i64,
    }

    /// `onnx.GraphProto`.
    #[derive(Clone, PartialEq, Message)]
    pub struct GraphProto {
        /// Nodes in topological order.
        #[prost(message, repeated, tag = "1")]
        pub node: Vec<NodeProto>,
        /// The graph's name.
        #[prost(string, tag = "2")]
        pub name: String,
        /// Constant tensors (weights).
        #[prost(message, repeated, tag = "5")]
        pub initializer: Vec<TensorProto>,
        /// Inputs.
        #[prost(message, repeated, tag = "11")]
        pub input: Vec<ValueInfoProto>,
        /// Outputs.
        #[prost(message, repeated, tag = "12")]
        pub output: Vec<ValueInfoProto>,
    }

    /// `onnx.NodeProto`.
    #[derive(Clone, PartialEq, Message)]
    pub struct NodeProto {
        /// Input value names.
        #[prost(string, repeated, tag = "1")]
        pub input: Vec<String>,
        /// Output value names.
        #[prost(string, repeated, tag = "2")]
        pub output: Vec<String>,
        /// The node's name.
        #[prost(string, tag = "3")]
        pub name: String,
        /// The operator (`Conv`, `Gemm`, ...).
        #[prost(string, tag = "4")]
        pub op_type: String,
        /// Its attributes.
        #[prost(message, repeated, tag = "5")]
        pub attribute: Vec<AttributeProto>,
    }

    /// `onnx.AttributeProto` (float, int and ints attributes).
    #[derive(Clone, PartialEq, Message)]
    pub struct AttributeProto {
        /// The attribute's name.
        #[prost(string, tag = "1")]
        pub name: String,
        /// A float value.
        #[prost(float, tag = "2")]
        pub f: f32,
        /// An int value.
        #[prost(int64, tag = "3")]
        pub i: i64,
        /// Int values.
        #[prost(int64, repeated, tag = "8")]
        pub ints: Vec<i64>,
        /// `AttributeType`: 1 FLOAT, 2 INT, 7 INTS.
        #[prost(int32, tag = "20")]
        pub r#type: i32,
    }

    /// `onnx.TensorProto` (dense, raw little-endian data).
    #[derive(Clone, PartialEq, Message)]
    pub struct TensorProto {
        /// The shape.
        #[prost(int64, repeated, tag = "1")]
        pub dims: Vec<i64>,
        /// `DataType`: 1 FLOAT, 7 INT64.
        #[prost(int32, tag = "2")]
        pub data_type: i32,
        /// The name (an initializer's value name).
        #[prost(string, tag = "8")]
        pub name: String,
        /// The values, little-endian.
        #[prost(bytes = "vec", tag = "9")]
        pub raw_data: Vec<u8>,
    }

    /// `onnx.ValueInfoProto`.
    #[derive(Clone, PartialEq, Message)]
    pub struct ValueInfoProto {
        /// The value's name.
        #[prost(string, tag = "1")]
        pub name: String,
        /// Its type.
        #[prost(message, optional, tag = "2")]
        pub r#type: Option<TypeProto>,
    }

    /// `onnx.TypeProto` (tensors only).
    #[derive(Clone, PartialEq, Message)]
    pub struct TypeProto {
        /// A tensor type.
        #[prost(message, optional, tag = "1")]
        pub tensor_type: Option<TensorTypeProto>,
    }

    /// `onnx.TypeProto.Tensor`.
    #[derive(Clone, PartialEq, Message)]
    pub struct TensorTypeProto {
        /// `DataType` of the elements.
        #[prost(int32, tag = "1")]
        pub elem_type: i32,
        /// The shape.
        #[prost(message, optional, tag = "2")]
        pub shape: Option<TensorShapeProto>,
    }

    /// `onnx.TensorShapeProto`.
    #[derive(Clone, PartialEq, Message)]
    pub struct TensorShapeProto {
        /// The dimensions.
        #[prost(message, repeated, tag = "1")]
        pub dim: Vec<Dimension>,
    }

    /// `onnx.TensorShapeProto.Dimension`: a size or a symbolic name.
    #[derive(Clone, PartialEq, Message)]
    pub struct Dimension {
        /// A fixed size.
        #[prost(int64, optional, tag = "1")]
        pub dim_value: Option<i64>,
        /// A symbolic size (`batch`).
        #[prost(string, optional, tag = "2")]
        pub dim_param: Option<String>,
    }
}

use proto::{
    AttributeProto, Dimension, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto,
    TensorShapeProto, TensorTypeProto, TypeProto, ValueInfoProto,
};

/// An attribute value.
enum Attr {
    Float(f32),
    Int(i64),
    Ints(Vec<i64>),
}

/// The graph under construction: nodes, initializers, the running value
/// and its shape (without the batch dimension).
struct Builder<'a> {
    dict: &'a [TorchTensor],
    nodes: Vec<NodeProto>,
    initializers: Vec<TensorProto>,
    value: String,
    shape: Vec<usize>,
}

impl Builder<'_> {
    /// A node `op` on `inputs` whose output becomes the running value.
    fn node(&mut self, op: &str, inputs: Vec<String>, attrs: Vec<(&str, Attr)>) {
        let output = format!("v{}", self.nodes.len());
        let attribute = attrs
            .into_iter()
            .map(|(name, a)| {
                let mut p = AttributeProto {
                    name: name.to_string(),
                    ..Default::default()
                };
                match a {
                    Attr::Float(f) => (p.f, p.r#type) = (f, 1),
                    Attr::Int(i) => (p.i, p.r#type) = (i, 2),
                    Attr::Ints(v) => (p.ints, p.r#type) = (v, 7),
                }
                p
            })
            .collect();
        self.nodes.push(NodeProto {
            input: inputs,
            output: vec![output.clone()],
            name: format!("{op}_{}", self.nodes.len()),
            op_type: op.to_string(),
            attribute,
        });
        self.value = output;
    }

    /// The `state_dict` tensor `name` as an initializer; `Err` when the
    /// export lacks it or its shape is not `shape`.
    fn weight(&mut self, name: &str, shape: &[usize]) -> Result<String, String> {
        let t = self
            .dict
            .iter()
            .find(|t| t.name == name)
            .ok_or_else(|| format!("the state_dict has no `{name}`"))?;
        if t.shape != shape {
            return Err(format!(
                "`{name}` has shape {:?} where the layer needs {shape:?}",
                t.shape
            ));
        }
        if !self.initializers.iter().any(|i| i.name == name) {
            let (data_type, raw_data) = match &t.data {
                TorchData::F32(v) => (FLOAT, v.iter().flat_map(|x| x.to_le_bytes()).collect()),
                TorchData::I64(v) => (INT64, v.iter().flat_map(|x| x.to_le_bytes()).collect()),
            };
            self.initializers.push(TensorProto {
                dims: t.shape.iter().map(|&d| d as i64).collect(),
                data_type,
                name: name.to_string(),
                raw_data,
            });
        }
        Ok(name.to_string())
    }

    /// A scalar `f32` constant as an initializer.
    fn constant(&mut self, value: f32) -> String {
        let name = format!("const_{}", self.initializers.len());
        self.initializers.push(TensorProto {
            dims: Vec::new(),
            data_type: FLOAT,
            name: name.clone(),
            raw_data: value.to_le_bytes().to_vec(),
        });
        name
    }

    /// An `f32` constant tensor of `dims` as an initializer.
    fn constants(&mut self, values: &[f32], dims: &[usize]) -> String {
        let name = format!("const_{}", self.initializers.len());
        self.initializers.push(TensorProto {
            dims: dims.iter().map(|&d| d as i64).collect(),
            data_type: FLOAT,
            name: name.clone(),
            raw_data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        });
        name
    }

    /// The `[C]` tensor `name` of the state_dict as a `[C, 1, 1]` constant
    /// that broadcasts over an image (group norm's affine).
    fn channelwise(&mut self, name: &str, c: usize) -> Result<String, String> {
        let t = self
            .dict
            .iter()
            .find(|t| t.name == name)
            .ok_or_else(|| format!("the state_dict has no `{name}`"))?;
        match &t.data {
            TorchData::F32(v) if t.shape == [c] => Ok(self.constants(v, &[c, 1, 1])),
            _ => Err(format!(
                "`{name}` has shape {:?} where the layer needs [{c}]",
                t.shape
            )),
        }
    }

    /// The running value as `[C, H, W]`, or `Err` naming the layer.
    fn image(&self, what: &str) -> Result<[usize; 3], String> {
        <[usize; 3]>::try_from(self.shape.as_slice())
            .map_err(|_| format!("{what} needs a C×H×W input, gets {:?}", self.shape))
    }

    /// An `int64` vector constant as an initializer (Reshape's shapes).
    fn int64s(&mut self, values: &[i64]) -> String {
        let name = format!("const_{}", self.initializers.len());
        self.initializers.push(TensorProto {
            dims: vec![values.len() as i64],
            data_type: INT64,
            name: name.clone(),
            raw_data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        });
        name
    }

    /// The running value through `op` with one more input.
    fn then(&mut self, op: &str, operand: String) {
        let v = self.value.clone();
        self.node(op, vec![v, operand], vec![]);
    }

    /// Appends the layers of `layers` (entries of `model.json`'s `layers`),
    /// their weights named under `prefix` (a residual block's `name.`: its
    /// inner layers' names are relative to it).
    fn layers(&mut self, layers: &[Value], prefix: &str) -> Result<(), String> {
        for (i, layer) in layers.iter().enumerate() {
            self.layer(layer, prefix)
                .map_err(|e| format!("{prefix}layers[{i}]: {e}"))?;
        }
        Ok(())
    }

    /// Appends layer `layer`, its weights named under `prefix`.
    fn layer(&mut self, layer: &Value, prefix: &str) -> Result<(), String> {
        let kind = layer["type"].as_str().unwrap_or_default();
        let full = format!("{prefix}{}", layer["name"].as_str().unwrap_or_default());
        let name = full.as_str();
        let int = |key: &str| -> Result<usize, String> {
            layer[key]
                .as_u64()
                .map(|v| v as usize)
                .ok_or_else(|| format!("{kind} lacks an integer `{key}`"))
        };
        let int_or =
            |key: &str, default: usize| layer[key].as_u64().map_or(default, |v| v as usize);
        let x = self.value.clone();
        match kind {
            "flatten" => {
                self.node("Flatten", vec![x], vec![("axis", Attr::Int(1))]);
                self.shape = vec![self.shape.iter().product()];
            }
            "linear" => {
                let (i, o) = (int("in_features")?, int("out_features")?);
                if self.shape != [i] {
                    return Err(format!(
                        "linear `{name}` expects [{i}], gets {:?}",
                        self.shape
                    ));
                }
                let mut inputs = vec![x, self.weight(&format!("{name}.weight"), &[o, i])?];
                if self.dict.iter().any(|t| t.name == format!("{name}.bias")) {
                    inputs.push(self.weight(&format!("{name}.bias"), &[o])?);
                }
                self.node("Gemm", inputs, vec![("transB", Attr::Int(1))]);
                self.shape = vec![o];
            }
            "conv2d" => {
                let [c, h, w] = self.image("conv2d")?;
                let (ci, co, k) = (
                    int("in_channels")?,
                    int("out_channels")?,
                    int("kernel_size")?,
                );
                let (s, p, g) = (
                    int_or("stride", 1),
                    int_or("padding", 0),
                    int_or("groups", 1),
                );
                if c != ci || g == 0 || ci % g != 0 || s == 0 || h + 2 * p < k || w + 2 * p < k {
                    return Err(format!(
                        "conv2d `{name}` ({ci}→{co}, kernel {k}, groups {g}) does not fit {:?}",
                        self.shape
                    ));
                }
                let mut inputs = vec![
                    x,
                    self.weight(&format!("{name}.weight"), &[co, ci / g, k, k])?,
                ];
                if self.dict.iter().any(|t| t.name == format!("{name}.bias")) {
                    inputs.push(self.weight(&format!("{name}.bias"), &[co])?);
                }
                let (k, s, p) = (k as i64, s as i64, p as i64);
                self.node(
                    "Conv",
                    inputs,
                    vec![
                        ("kernel_shape", Attr::Ints(vec![k, k])),
                        ("strides", Attr::Ints(vec![s, s])),
                        ("pads", Attr::Ints(vec![p, p, p, p])),
                        ("group", Attr::Int(g as i64)),
                    ],
                );
                let out = |n: usize| (n + 2 * p as usize - k as usize) / s as usize + 1;
                self.shape = vec![co, out(h), out(w)];
            }
            "batch_norm2d" => {
                let [c, _, _] = self.image("batch_norm2d")?;
                let eps = layer["eps"].as_f64().unwrap_or(1e-5) as f32;
                let inputs = ["weight", "bias", "running_mean", "running_var"]
                    .iter()
                    .map(|part| self.weight(&format!("{name}.{part}"), &[c]))
                    .collect::<Result<Vec<_>, _>>()?;
                self.node(
                    "BatchNormalization",
                    [vec![x], inputs].concat(),
                    vec![("epsilon", Attr::Float(eps))],
                );
            }
            "relu" => self.node("Relu", vec![x], vec![]),
            "tanh" => self.node("Tanh", vec![x], vec![]),
            "sigmoid" => self.node("Sigmoid", vec![x], vec![]),
            "gelu" => {
                // Opset 17 has no Gelu: 0.5·x·(1 + erf(x/√2)), PyTorch's exact form.
                let root2 = self.constant(std::f32::consts::SQRT_2);
                let (one, half) = (self.constant(1.0), self.constant(0.5));
                self.node("Div", vec![x.clone(), root2], vec![]);
                let v = self.value.clone();
                self.node("Erf", vec![v], vec![]);
                let v = self.value.clone();
                self.node("Add", vec![v, one], vec![]);
                let v = self.value.clone();
                self.node("Mul", vec![x, v], vec![]);
                let v = self.value.clone();
                self.node("Mul", vec![v, half], vec![]);
            }
            "max_pool2d" | "avg_pool2d" => {
                let [c, h, w] = self.image(kind)?;
                let k = int("kernel_size")?;
                let (st, p) = (int_or("stride", k), int_or("padding", 0));
                if k == 0 || st == 0 || h + 2 * p < k || w + 2 * p < k || 2 * p > k {
                    return Err(format!(
                        "{kind} (kernel {k}, padding {p}) does not fit {:?}",
                        self.shape
                    ));
                }
                let (ki, si, pi) = (k as i64, st as i64, p as i64);
                let mut attrs = vec![
                    ("kernel_shape", Attr::Ints(vec![ki, ki])),
                    ("strides", Attr::Ints(vec![si, si])),
                    ("pads", Attr::Ints(vec![pi, pi, pi, pi])),
                ];
                let op = if kind == "max_pool2d" {
                    "MaxPool"
                } else {
                    // PyTorch's AvgPool2d counts the padding.
                    attrs.push(("count_include_pad", Attr::Int(1)));
                    "AveragePool"
                };
                self.node(op, vec![x], attrs);
                let out = |n: usize| (n + 2 * p - k) / st + 1;
                self.shape = vec![c, out(h), out(w)];
            }
            "adaptive_avg_pool2d" | "adaptive_max_pool2d" => {
                let [c, h, w] = self.image(kind)?;
                let o = int("output_size")?;
                let max = kind == "adaptive_max_pool2d";
                if o == 1 {
                    let op = if max {
                        "GlobalMaxPool"
                    } else {
                        "GlobalAveragePool"
                    };
                    self.node(op, vec![x], vec![]);
                } else if o > 0 && h % o == 0 && w % o == 0 {
                    // Equal windows: an ordinary pool of kernel = stride = side / o.
                    let (kh, kw) = ((h / o) as i64, (w / o) as i64);
                    let op = if max { "MaxPool" } else { "AveragePool" };
                    let window = vec![
                        ("kernel_shape", Attr::Ints(vec![kh, kw])),
                        ("strides", Attr::Ints(vec![kh, kw])),
                    ];
                    self.node(op, vec![x], window);
                } else {
                    return Err(format!(
                        "{kind} to {o}×{o} from {h}×{w}: ONNX has no adaptive pool of unequal windows"
                    ));
                }
                self.shape = vec![c, o, o];
            }
            "group_norm" => {
                let [c, h, w] = self.image(kind)?;
                let g = int("num_groups")?;
                if g == 0 || c % g != 0 {
                    return Err(format!("group_norm `{name}`: {g} groups of {c} channels"));
                }
                let eps = layer["eps"].as_f64().unwrap_or(1e-5) as f32;
                // Opset 17 has no GroupNormalization: normalise [N, G, C/G·H·W]
                // per group with InstanceNormalization (unit scale, zero shift),
                // reshape back, then the per-channel affine.
                let grouped = self.int64s(&[0, g as i64, -1]);
                self.then("Reshape", grouped);
                let ones = self.constants(&vec![1.0; g], &[g]);
                let zeros = self.constants(&vec![0.0; g], &[g]);
                let v = self.value.clone();
                self.node(
                    "InstanceNormalization",
                    vec![v, ones, zeros],
                    vec![("epsilon", Attr::Float(eps))],
                );
                let back = self.int64s(&[0, c as i64, h as i64, w as i64]);
                self.then("Reshape", back);
                let scale = self.channelwise(&format!("{name}.weight"), c)?;
                self.then("Mul", scale);
                let shift = self.channelwise(&format!("{name}.bias"), c)?;
                self.then("Add", shift);
            }
            "residual" => {
                let empty = Vec::new();
                let body = layer["layers"].as_array().unwrap_or(&empty);
                let shortcut = layer["shortcut"].as_array().unwrap_or(&empty);
                let (input, shape) = (x, self.shape.clone());
                let inner = format!("{name}.");
                self.layers(body, &inner)?;
                let (main, main_shape) = (self.value.clone(), self.shape.clone());
                self.value = input;
                self.shape = shape;
                self.layers(shortcut, &inner)?;
                if self.shape != main_shape {
                    return Err(format!(
                        "residual `{name}`: its branch gives {main_shape:?}, its shortcut {:?}",
                        self.shape
                    ));
                }
                let short = self.value.clone();
                self.node("Add", vec![main, short], vec![]);
            }
            "scale" => {
                let factor = layer["factor"]
                    .as_f64()
                    .ok_or_else(|| "scale lacks a number `factor`".to_string())?;
                let k = self.constant(factor as f32);
                self.node("Mul", vec![x, k], vec![]);
            }
            "dropout" => {}
            other => return Err(format!("layer type `{other}` has no ONNX form yet")),
        }
        Ok(())
    }
}

/// A tensor value's type: `float32` of `dims` (`None`: the batch).
fn tensor_info(name: &str, dims: &[Option<usize>]) -> ValueInfoProto {
    let dim = dims
        .iter()
        .map(|d| match d {
            Some(v) => Dimension {
                dim_value: Some(*v as i64),
                dim_param: None,
            },
            None => Dimension {
                dim_value: None,
                dim_param: Some("batch".into()),
            },
        })
        .collect();
    ValueInfoProto {
        name: name.to_string(),
        r#type: Some(TypeProto {
            tensor_type: Some(TensorTypeProto {
                elem_type: FLOAT,
                shape: Some(TensorShapeProto { dim }),
            }),
        }),
    }
}

/// The ONNX model (serialised `ModelProto`) of the forward pass that the
/// layer list `layers` describes, with weights from `dict`, for samples of
/// `input_shape` and `outputs` outputs. `Err` names the layer that does not
/// fit or has no ONNX form.
pub fn onnx_model(
    layers: &[Value],
    dict: &[TorchTensor],
    input_shape: &[usize],
    outputs: usize,
    doc: &str,
) -> Result<Vec<u8>, String> {
    let mut b = Builder {
        dict,
        nodes: Vec::new(),
        initializers: Vec::new(),
        value: "input".into(),
        shape: input_shape.to_vec(),
    };
    b.layers(layers, "")?;
    if b.shape != [outputs] {
        return Err(format!(
            "the layers end in {:?}, the model has {outputs} outputs",
            b.shape
        ));
    }
    // The last node writes the graph's output.
    match b.nodes.last_mut() {
        Some(last) => last.output = vec!["logits".into()],
        None => return Err("the layer list is empty".into()),
    }
    let input: Vec<Option<usize>> = std::iter::once(None)
        .chain(input_shape.iter().map(|&d| Some(d)))
        .collect();
    let model = ModelProto {
        ir_version: IR_VERSION,
        producer_name: "fedweave".into(),
        producer_version: env!("CARGO_PKG_VERSION").into(),
        doc_string: doc.to_string(),
        graph: Some(GraphProto {
            node: b.nodes,
            name: "fedweave".into(),
            initializer: b.initializers,
            input: vec![tensor_info("input", &input)],
            output: vec![tensor_info("logits", &[None, Some(outputs)])],
        }),
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: OPSET,
        }],
    };
    Ok(model.encode_to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tensor(name: &str, shape: &[usize]) -> TorchTensor {
        let n = shape.iter().product();
        TorchTensor {
            name: name.into(),
            shape: shape.to_vec(),
            data: TorchData::F32((0..n).map(|k| k as f32 / n as f32).collect()),
        }
    }

    /// conv 2→4 (3×3, stride 2, padding 1, groups 2) on 2×8×8, GELU,
    /// average pool 2, flatten, linear 16 → 3, tanh.
    fn layers() -> (Vec<Value>, Vec<TorchTensor>) {
        let layers = vec![
            json!({"type": "conv2d", "name": "c", "in_channels": 2, "out_channels": 4,
                   "kernel_size": 3, "stride": 2, "padding": 1, "groups": 2}),
            json!({"type": "gelu"}),
            json!({"type": "dropout"}),
            json!({"type": "avg_pool2d", "kernel_size": 2}),
            json!({"type": "flatten"}),
            json!({"type": "linear", "name": "fc", "in_features": 16, "out_features": 3}),
            json!({"type": "tanh"}),
        ];
        let dict = vec![
            tensor("c.weight", &[4, 1, 3, 3]),
            tensor("c.bias", &[4]),
            tensor("fc.weight", &[3, 16]),
            tensor("fc.bias", &[3]),
        ];
        (layers, dict)
    }

    #[test]
    fn layers_become_nodes_with_their_attributes_and_shapes() {
        let (layers, dict) = layers();
        let bytes = onnx_model(&layers, &dict, &[2, 8, 8], 3, "test").unwrap();
        let model = ModelProto::decode(bytes.as_slice()).unwrap();
        assert_eq!((model.ir_version, model.opset_import[0].version), (8, 17));
        let g = model.graph.unwrap();
        let ops: Vec<&str> = g.node.iter().map(|n| n.op_type.as_str()).collect();
        assert_eq!(
            ops,
            [
                "Conv",
                "Div",
                "Erf",
                "Add",
                "Mul",
                "Mul",
                "AveragePool",
                "Flatten",
                "Gemm",
                "Tanh"
            ]
        );
        let conv = &g.node[0];
        let attr = |n: &NodeProto, name: &str| {
            n.attribute
                .iter()
                .find(|a| a.name == name)
                .cloned()
                .unwrap()
        };
        assert_eq!(attr(conv, "strides").ints, [2, 2]);
        assert_eq!(attr(conv, "pads").ints, [1, 1, 1, 1]);
        assert_eq!(attr(conv, "group").i, 2);
        assert_eq!(conv.input, ["input", "c.weight", "c.bias"]);
        assert_eq!(attr(&g.node[8], "transB").i, 1);
        // Each node reads the one before; the last writes `logits`.
        for w in g.node.windows(2).skip(5) {
            assert!(w[1].input.contains(&w[0].output[0]));
        }
        assert_eq!(g.node.last().unwrap().output, ["logits"]);
        let dims = |v: &ValueInfoProto| {
            let t = v.r#type.as_ref().unwrap().tensor_type.as_ref().unwrap();
            t.shape.as_ref().unwrap().dim.clone()
        };
        let input = dims(&g.input[0]);
        assert_eq!(input[0].dim_param.as_deref(), Some("batch"));
        assert_eq!(
            input[1..].iter().map(|d| d.dim_value).collect::<Vec<_>>(),
            [Some(2), Some(8), Some(8)]
        );
        assert_eq!(dims(&g.output[0])[1].dim_value, Some(3));
        // Where onnxruntime is installed, the graph loads and runs a batch.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.onnx");
        std::fs::write(&path, &bytes).unwrap();
        let script = "import sys, numpy, onnxruntime as ort\n\
            s = ort.InferenceSession(sys.argv[1], providers=['CPUExecutionProvider'])\n\
            y = s.run(['logits'], {'input': numpy.ones((5, 2, 8, 8), numpy.float32)})[0]\n\
            assert y.shape == (5, 3) and numpy.isfinite(y).all() and abs(y).max() <= 1, y";
        match std::process::Command::new("python3")
            .args(["-c", "import onnxruntime"])
            .output()
        {
            Ok(o) if o.status.success() => {
                let o = std::process::Command::new("python3")
                    .args(["-c", script])
                    .arg(&path)
                    .output()
                    .unwrap();
                assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            }
            _ => eprintln!("onnxruntime not installed: the graph was not run"),
        }
    }

    #[test]
    fn lists_that_do_not_fit_name_the_layer() {
        let (layers, dict) = layers();
        let err = |layers: &[Value], dict: &[TorchTensor], shape: &[usize], out: usize| {
            onnx_model(layers, dict, shape, out, "").unwrap_err()
        };
        // 3 input channels where the conv takes 2.
        let e = err(&layers, &dict, &[3, 8, 8], 3);
        assert!(e.starts_with("layers[0]: conv2d `c`"), "{e}");
        // A 1×1 image is too small for the pool after the conv.
        let e = err(&layers, &dict, &[2, 1, 1], 3);
        assert!(e.starts_with("layers[3]: avg_pool2d"), "{e}");
        // Outputs that differ from the head's.
        let e = err(&layers, &dict, &[2, 8, 8], 5);
        assert!(e.contains("the model has 5 outputs"), "{e}");
        // A weight missing, a weight of the wrong shape.
        let e = err(&layers, &dict[..2], &[2, 8, 8], 3);
        assert!(e.contains("no `fc.weight`"), "{e}");
        let mut wrong = dict.clone();
        wrong[2] = tensor("fc.weight", &[16, 3]);
        let e = err(&layers, &wrong, &[2, 8, 8], 3);
        assert!(e.contains("[16, 3] where the layer needs [3, 16]"), "{e}");
        // A type with no ONNX form, a missing key, an empty list.
        let e = err(&[json!({"type": "lstm"})], &dict, &[4], 4);
        assert!(e.contains("`lstm` has no ONNX form"), "{e}");
        let e = err(&[json!({"type": "linear", "name": "fc"})], &dict, &[16], 3);
        assert!(e.contains("lacks an integer `in_features`"), "{e}");
        assert!(err(&[], &dict, &[3], 3).contains("empty"));
    }
}
