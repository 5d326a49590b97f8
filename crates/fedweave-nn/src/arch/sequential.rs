//! `sequential`: an architecture from the configuration, no Rust: `[model]
//! layers` is a list of layers run in order, `[model] head` the index of
//! the first head layer (default: the last linear layer). Parameters are
//! named as PyTorch's `nn.Sequential` names them (`layers.3.weight`,
//! `layers.4.layers.0.weight` inside a residual block), so an exported
//! model loads into a `torch.nn.Sequential` stored as `layers`.
//!
//! The list is checked against the input when the model is built, before
//! any training: a layer that does not fit is an error naming its index
//! and the shapes involved. Activations are either maps `[C, H, W]`
//! (images; an embedding's `len × dim` output is a one-channel map) or
//! flat vectors; `flatten` turns the first into the second, and linear
//! layers read flat vectors only, conv/norm/pool layers maps only.
//!
//! Dropout is the identity in evaluation; in training its mask is drawn
//! from the local trainer's key stream (the same key as augmentation,
//! drawn once per local round from the client's batch stream, then one
//! stream per mini-batch), so runs are reproducible whatever the thread
//! count. Models with dropout or an embedding have no batched form.

use super::{Batched, BatchedInput, BuildCx, Built, Draw, LayerDesc, ModelInfo, Net, bn_desc};
use crate::NnError;
use crate::batched::BatchedCx;
use crate::kernels::linear;
use crate::kernels::{conv2d, max_pool2d, relu_max_pool2d};
use crate::model::{BN_EPS, InputValues, Norm, ParamTensor, flatten};
use burn::tensor::activation::{gelu, relu, tanh};
use burn::tensor::module::{adaptive_avg_pool2d, avg_pool2d, embedding};
use burn::tensor::ops::{AvgPoolOptions, ConvOptions, MaxPoolOptions};
use burn::tensor::{Tensor, TensorData};
use fedweave_core::{ParamLayout, TensorSpec};
use rand::Rng;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::sync::Arc;

/// The registry entry.
pub(crate) const INFO: ModelInfo = ModelInfo {
    name: "sequential",
    summary: "your own layer list: [model] layers = [{ type = \"conv2d\", out_channels = 6, kernel = 5 }, { type = \"relu\" }, …] (conv2d, batch_norm, group_norm, relu, gelu, tanh, max_pool2d, avg_pool2d, adaptive_avg_pool2d, flatten, dropout, linear, embedding, residual); head = index of the first head layer",
    batched: true,
    embedding: false,
    build,
};

/// `[model] layers` and `head` of a `sequential` model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SequentialConfig {
    /// The layers, in order.
    pub layers: Vec<LayerConfig>,
    /// Index of the first head layer (`None`: the last linear layer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head: Option<usize>,
}

/// One layer of a `sequential` model, as the configuration writes it
/// (`{ type = "conv2d", out_channels = 6, kernel = 5 }`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum LayerConfig {
    /// 2-D convolution with a square kernel.
    Conv2d {
        /// Input channels, if stated (checked against the input).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        in_channels: Option<usize>,
        /// Output channels.
        out_channels: usize,
        /// Kernel side.
        kernel: usize,
        /// Stride (default 1).
        #[serde(default = "one")]
        stride: usize,
        /// Zero padding on each side (default 0).
        #[serde(default)]
        padding: usize,
        /// Channel groups (default 1).
        #[serde(default = "one")]
        groups: usize,
        /// Whether it has a bias (default true).
        #[serde(default = "yes")]
        bias: bool,
    },
    /// Batch norm over the channels of a map; its running statistics are
    /// the client's local buffers, as `cnn-bn`'s.
    BatchNorm {},
    /// Group norm over the channels of a map.
    GroupNorm {
        /// Groups (dividing the channels).
        groups: usize,
    },
    /// ReLU.
    Relu {},
    /// GELU.
    Gelu {},
    /// tanh.
    Tanh {},
    /// Max pooling.
    MaxPool2d {
        /// Window side.
        kernel: usize,
        /// Stride (default: the window side).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stride: Option<usize>,
        /// Padding (default 0; at most half the window).
        #[serde(default)]
        padding: usize,
    },
    /// Average pooling (padding counted, as PyTorch's default).
    AvgPool2d {
        /// Window side.
        kernel: usize,
        /// Stride (default: the window side).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stride: Option<usize>,
        /// Padding (default 0; at most half the window).
        #[serde(default)]
        padding: usize,
    },
    /// Average pooling to an `output × output` map.
    AdaptiveAvgPool2d {
        /// Output side.
        output: usize,
    },
    /// A map `[C, H, W]` to a flat vector of C·H·W.
    Flatten {},
    /// Dropout with probability `p` (training only).
    Dropout {
        /// Drop probability, in [0, 1).
        p: f64,
    },
    /// Fully connected layer on a flat vector.
    Linear {
        /// Input width, if stated (checked against the input).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        in_features: Option<usize>,
        /// Output width, or `"classes"`; the last linear layer defaults to
        /// the class count.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        out_features: Option<Width>,
        /// Whether it has a bias (default true).
        #[serde(default = "yes")]
        bias: bool,
    },
    /// Embedding of token ids (first layer, token datasets): the sequence
    /// of `len` ids becomes a one-channel `len × dim` map.
    Embedding {
        /// Embedding width.
        dim: usize,
    },
    /// `layers(x) + shortcut(x)`; the shortcut defaults to the identity.
    Residual {
        /// The residual branch.
        layers: Vec<LayerConfig>,
        /// The shortcut branch (empty: the identity).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        shortcut: Vec<LayerConfig>,
    },
}

fn one() -> usize {
    1
}

fn yes() -> bool {
    true
}

/// A linear layer's output width.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Width {
    /// This many features.
    Count(usize),
    /// The model's output width (classes, or forecast horizon).
    Classes,
}

impl Serialize for Width {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match *self {
            Width::Count(n) => s.serialize_u64(n as u64),
            Width::Classes => s.serialize_str("classes"),
        }
    }
}

impl<'de> Deserialize<'de> for Width {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl serde::de::Visitor<'_> for Visit {
            type Value = Width;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a number of features or \"classes\"")
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<Width, E> {
                usize::try_from(n)
                    .map(Width::Count)
                    .map_err(|_| E::custom("too many features"))
            }
            fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<Width, E> {
                u64::try_from(n)
                    .map_err(|_| E::custom(format!("must be ≥ 1, got {n}")))
                    .and_then(|n| self.visit_u64(n))
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Width, E> {
                match s {
                    "classes" => Ok(Width::Classes),
                    _ => Err(E::custom(format!(
                        "expected a number or \"classes\", got \"{s}\""
                    ))),
                }
            }
        }
        d.deserialize_any(Visit)
    }
}

/// An activation's shape between layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shape {
    /// `[C, H, W]`.
    Map([usize; 3]),
    /// A flat vector.
    Flat(usize),
    /// `len` token ids (the input of an embedding).
    Tokens(usize),
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Shape::Map([c, h, w]) => write!(f, "[{c}, {h}, {w}]"),
            Shape::Flat(n) => write!(f, "[{n}]"),
            Shape::Tokens(n) => write!(f, "[{n}] token ids"),
        }
    }
}

/// A built layer: its tensors' indices in the layout and its settings.
#[derive(Clone, Debug)]
enum Op {
    Linear {
        at: usize,
        bias: bool,
        shape: [usize; 2],
    },
    Conv {
        at: usize,
        bias: bool,
        stride: usize,
        pad: usize,
        groups: usize,
        shape: [usize; 4],
    },
    BatchNorm {
        at: usize,
        /// Index among the batch norms, and (channels, buffer offset).
        which: usize,
        norm: (usize, usize),
    },
    GroupNorm {
        at: usize,
        groups: usize,
        channels: usize,
    },
    Relu,
    Gelu,
    Tanh,
    MaxPool {
        k: usize,
        stride: usize,
        pad: usize,
    },
    AvgPool {
        k: usize,
        stride: usize,
        pad: usize,
    },
    AdaptiveAvg(usize),
    Flatten,
    Dropout(f64),
    Embedding {
        at: usize,
        shape: [usize; 2],
    },
    Residual {
        body: Vec<Op>,
        shortcut: Vec<Op>,
    },
}

impl Op {
    /// Whether the layer holds no parameters and acts alike on one
    /// client's and on K clients' stacked activations (element-wise and
    /// pooling layers).
    fn is_stateless(&self) -> bool {
        matches!(
            self,
            Op::Relu
                | Op::Gelu
                | Op::Tanh
                | Op::MaxPool { .. }
                | Op::AvgPool { .. }
                | Op::AdaptiveAvg(_)
        )
    }
}

/// A built `sequential` model.
#[derive(Debug)]
struct Sequential {
    ops: Vec<Op>,
    /// The first head op.
    head: usize,
    input: Shape,
    /// The head's input (the body's output) before flattening.
    features: Shape,
    /// The first layout group of the head.
    head_group: usize,
    /// The batch-norm groups (FedBN keeps them local).
    bn_groups: Vec<String>,
    /// The group-norm groups (scale 1, shift 0 at init).
    gn_groups: Vec<String>,
    /// Why there is no batched form, if there is none.
    not_batched: Option<String>,
}

/// The builder's running state: the layout so far, the batch norms, and
/// the names of special groups.
struct Builder<'a> {
    cx: &'a BuildCx<'a>,
    layout: ParamLayout,
    tensors: usize,
    norms: Vec<(usize, usize)>,
    bn_groups: Vec<String>,
    gn_groups: Vec<String>,
    not_batched: Option<String>,
}

fn build(cx: &BuildCx) -> Result<Built, NnError> {
    let Some(config) = &cx.input.sequential else {
        return Err(layer_err(
            "model.layers",
            "a sequential model needs a layer list: [model] layers = [{ type = \"linear\" }, …]",
        ));
    };
    let layers = &config.layers;
    if layers.is_empty() {
        return Err(layer_err(
            "model.layers",
            "is empty; list at least one layer",
        ));
    }
    let last_linear = layers
        .iter()
        .rposition(|l| matches!(l, LayerConfig::Linear { .. }));
    let head = match (config.head, last_linear) {
        (Some(h), _) if h == 0 || h >= layers.len() => {
            return Err(layer_err(
                "model.head",
                &format!(
                    "must be a layer index in 1..={} (the first head layer), got {h}",
                    layers.len() - 1
                ),
            ));
        }
        (Some(h), _) => h,
        (None, Some(h)) if h > 0 => h,
        (None, _) => {
            return Err(layer_err(
                "model.head",
                "no linear layer after the first to start the head; set model.head to the index of the first head layer",
            ));
        }
    };
    if cx.input_shape.iter().product::<usize>() == 0 {
        return Err(cx.bad("empty input"));
    }
    let input = match (&cx.input.values, cx.input_shape) {
        (InputValues::Tokens { .. }, [len]) => Shape::Tokens(*len),
        (InputValues::Tokens { .. }, _) => {
            return Err(cx.bad("token ids must be one sequence"));
        }
        (InputValues::Categorical { .. }, _) => {
            return Err(cx.bad("reads real values or token ids, not categorical ids"));
        }
        (InputValues::Dense, &[c, h, w]) => Shape::Map([c, h, w]),
        (InputValues::Dense, shape) => Shape::Flat(shape.iter().product()),
    };
    let mut b = Builder {
        cx,
        layout: ParamLayout::new(),
        tensors: 0,
        norms: Vec::new(),
        bn_groups: Vec::new(),
        gn_groups: Vec::new(),
        not_batched: None,
    };
    let mut shape = input;
    let mut ops = Vec::with_capacity(layers.len());
    let mut features = input;
    let mut head_group = 0;
    for (i, layer) in layers.iter().enumerate() {
        if i == head {
            features = shape;
            head_group = b.layout.groups().len();
        }
        let from = if i == 0 {
            "the input".to_string()
        } else {
            format!("layers[{}] output", i - 1)
        };
        let last = last_linear == Some(i);
        let (op, out) = b.layer(
            layer,
            &format!("layers.{i}"),
            &format!("layers[{i}]"),
            shape,
            &from,
            last,
        )?;
        ops.push(op);
        shape = out;
    }
    if let Some(kind) = ops[head..].iter().find_map(|op| trains_differently(op)) {
        return Err(layer_err(
            "model.head",
            &format!(
                "the head (layers[{head}..]) holds a {kind} layer, which trains differently from how it evaluates; start the head after it"
            ),
        ));
    }
    if head_group == b.layout.groups().len() {
        return Err(layer_err(
            "model.head",
            &format!("layers[{head}..] hold no parameters; the head needs a linear or conv layer"),
        ));
    }
    if shape != Shape::Flat(cx.classes) {
        return Err(layer_err(
            "model.layers",
            &format!(
                "the last layer outputs {shape}; the model must output [{}] (the classes or targets): end with a linear layer",
                cx.classes
            ),
        ));
    }
    Ok(Built {
        layout: b.layout,
        batch_norms: b.norms,
        net: Arc::new(Sequential {
            ops,
            head,
            input,
            features,
            head_group,
            bn_groups: b.bn_groups,
            gn_groups: b.gn_groups,
            not_batched: b.not_batched,
        }),
    })
}

/// The type of the first batch-norm or dropout layer within `op`, if any.
fn trains_differently(op: &Op) -> Option<&'static str> {
    match op {
        Op::BatchNorm { .. } => Some("batch_norm"),
        Op::Dropout(_) => Some("dropout"),
        Op::Residual { body, shortcut } => body.iter().chain(shortcut).find_map(trains_differently),
        _ => None,
    }
}

/// A layer-list error at `at` (`model.layers[3]`).
fn layer_err(at: &str, message: &str) -> NnError {
    NnError::BadLayer {
        at: at.to_string(),
        message: message.to_string(),
    }
}

/// The output side of a window of `k` with `stride` and `pad` over `n`.
fn slide(n: usize, k: usize, stride: usize, pad: usize) -> Option<usize> {
    (n + 2 * pad).checked_sub(k).map(|r| r / stride + 1)
}

impl Builder<'_> {
    /// Pushes layer group `name` with `tensors`; returns the index of its
    /// first tensor.
    fn group(&mut self, name: &str, tensors: &[(&str, Vec<usize>)]) -> usize {
        let at = self.tensors;
        self.layout.push_group(name, tensors);
        self.tensors += tensors.len();
        at
    }

    /// Pushes a conv or linear layer: its weight, and a bias of `bias`
    /// elements if it has one.
    fn weight_and_bias(&mut self, name: &str, weight: Vec<usize>, bias: Option<usize>) -> usize {
        let mut t = vec![("weight", weight)];
        t.extend(bias.map(|b| ("bias", vec![b])));
        self.group(name, &t)
    }

    /// Builds one layer named `name` (its tensors' prefix) reading `shape`
    /// (described as `from` in errors); `last` marks the last linear layer,
    /// whose width defaults to the class count.
    fn layer(
        &mut self,
        layer: &LayerConfig,
        name: &str,
        path: &str,
        shape: Shape,
        from: &str,
        last: bool,
    ) -> Result<(Op, Shape), NnError> {
        let kind = layer_type(layer);
        let at_path = format!("model.{path} ({kind})");
        let err = |message: String| layer_err(&at_path, &message);
        let map = || match shape {
            Shape::Map(m) => Ok(m),
            _ => Err(err(format!(
                "expects a [C, H, W] map, gets {shape} from {from}{}",
                if matches!(shape, Shape::Flat(_)) {
                    " (conv, norm and pool layers come before `flatten`)"
                } else {
                    ""
                }
            ))),
        };
        let positive = |key: &str, v: usize| {
            if v == 0 {
                Err(err(format!("{key} must be at least 1")))
            } else {
                Ok(v)
            }
        };
        let window = |k: usize, stride: usize, pad: usize, [c, h, w]: [usize; 3]| {
            positive("kernel", k)?;
            positive("stride", stride)?;
            match (slide(h, k, stride, pad), slide(w, k, stride, pad)) {
                (Some(oh), Some(ow)) => Ok([c, oh, ow]),
                _ => Err(err(format!(
                    "kernel {k} is larger than the {h}×{w} map (padding {pad}) from {from} {shape}"
                ))),
            }
        };
        Ok(match *layer {
            LayerConfig::Conv2d {
                in_channels,
                out_channels,
                kernel,
                stride,
                padding,
                groups,
                bias,
            } => {
                let m = map()?;
                if let Some(c) = in_channels
                    && c != m[0]
                {
                    return Err(err(format!(
                        "expects {c} input channels, gets {} from {from} {shape}",
                        m[0]
                    )));
                }
                positive("out_channels", out_channels)?;
                positive("groups", groups)?;
                if m[0] % groups != 0 || out_channels % groups != 0 {
                    return Err(err(format!(
                        "groups = {groups} must divide the input channels ({}) and out_channels ({out_channels})",
                        m[0]
                    )));
                }
                let [_, oh, ow] = window(kernel, stride, padding, m)?;
                let weight = [out_channels, m[0] / groups, kernel, kernel];
                let at = self.weight_and_bias(name, weight.to_vec(), bias.then_some(out_channels));
                (
                    Op::Conv {
                        at,
                        bias,
                        stride,
                        pad: padding,
                        groups,
                        shape: weight,
                    },
                    Shape::Map([out_channels, oh, ow]),
                )
            }
            LayerConfig::BatchNorm {} => {
                let m = map()?;
                let c = m[0];
                let at = self.group(name, &[("weight", vec![c]), ("bias", vec![c])]);
                let offset = self.norms.last().map_or(0, |&(c, at)| at + 2 * c);
                self.norms.push((c, offset));
                self.bn_groups.push(name.to_string());
                let which = self.norms.len() - 1;
                (
                    Op::BatchNorm {
                        at,
                        which,
                        norm: (c, offset),
                    },
                    shape,
                )
            }
            LayerConfig::GroupNorm { groups } => {
                let m = map()?;
                positive("groups", groups)?;
                if m[0] % groups != 0 {
                    return Err(err(format!(
                        "groups = {groups} must divide the {} channels of {from} {shape}",
                        m[0]
                    )));
                }
                let at = self.group(name, &[("weight", vec![m[0]]), ("bias", vec![m[0]])]);
                self.gn_groups.push(name.to_string());
                (
                    Op::GroupNorm {
                        at,
                        groups,
                        channels: m[0],
                    },
                    shape,
                )
            }
            LayerConfig::Relu {} => (Op::Relu, self.activation(shape, &err)?),
            LayerConfig::Gelu {} => (Op::Gelu, self.activation(shape, &err)?),
            LayerConfig::Tanh {} => (Op::Tanh, self.activation(shape, &err)?),
            LayerConfig::MaxPool2d {
                kernel,
                stride,
                padding,
            }
            | LayerConfig::AvgPool2d {
                kernel,
                stride,
                padding,
            } => {
                let m = map()?;
                let stride = stride.unwrap_or(kernel);
                if 2 * padding > kernel {
                    return Err(err(format!(
                        "padding {padding} is more than half the kernel {kernel}"
                    )));
                }
                let out = window(kernel, stride, padding, m)?;
                let (k, pad) = (kernel, padding);
                let op = if matches!(layer, LayerConfig::MaxPool2d { .. }) {
                    Op::MaxPool { k, stride, pad }
                } else {
                    Op::AvgPool { k, stride, pad }
                };
                (op, Shape::Map(out))
            }
            LayerConfig::AdaptiveAvgPool2d { output } => {
                let [c, h, w] = map()?;
                positive("output", output)?;
                if output > h || output > w {
                    return Err(err(format!(
                        "output {output} is larger than the {h}×{w} map from {from} {shape}"
                    )));
                }
                (Op::AdaptiveAvg(output), Shape::Map([c, output, output]))
            }
            LayerConfig::Flatten {} => match shape {
                Shape::Map([c, h, w]) => (Op::Flatten, Shape::Flat(c * h * w)),
                Shape::Flat(_) => (Op::Flatten, shape),
                Shape::Tokens(_) => return Err(err(format!("gets {shape}; embed them first"))),
            },
            LayerConfig::Dropout { p } => {
                if !(0.0..1.0).contains(&p) {
                    return Err(err(format!("p must be in [0, 1), got {p}")));
                }
                self.not_batched
                    .get_or_insert_with(|| format!("{path} (dropout) has no batched form"));
                (Op::Dropout(p), self.activation(shape, &err)?)
            }
            LayerConfig::Linear {
                in_features,
                out_features,
                bias,
            } => {
                let Shape::Flat(n) = shape else {
                    return Err(err(format!(
                        "expects a flat input, gets {shape} from {from}; add {{ type = \"flatten\" }} before it"
                    )));
                };
                if let Some(want) = in_features
                    && want != n
                {
                    return Err(err(format!(
                        "expects {want} input features, gets {n} from {from} {shape}"
                    )));
                }
                let out = match out_features {
                    Some(Width::Count(0)) => {
                        return Err(err("out_features must be at least 1".into()));
                    }
                    Some(Width::Count(o)) => o,
                    Some(Width::Classes) => self.cx.classes,
                    None if last => self.cx.classes,
                    None => {
                        return Err(err(
                            "out_features is missing (only the last linear layer defaults to the class count)".into(),
                        ));
                    }
                };
                let at = self.weight_and_bias(name, vec![n, out], bias.then_some(out));
                (
                    Op::Linear {
                        at,
                        bias,
                        shape: [n, out],
                    },
                    Shape::Flat(out),
                )
            }
            LayerConfig::Embedding { dim } => {
                let (Shape::Tokens(len), InputValues::Tokens { vocab }) =
                    (shape, &self.cx.input.values)
                else {
                    return Err(err(format!(
                        "reads token ids (first layer, token datasets), gets {shape} from {from}"
                    )));
                };
                positive("dim", dim)?;
                let at = self.group(name, &[("weight", vec![*vocab, dim])]);
                self.not_batched
                    .get_or_insert_with(|| format!("{path} (embedding) has no batched form"));
                (
                    Op::Embedding {
                        at,
                        shape: [*vocab, dim],
                    },
                    Shape::Map([1, len, dim]),
                )
            }
            LayerConfig::Residual {
                ref layers,
                ref shortcut,
            } => {
                let mut branch =
                    |list: &[LayerConfig], part: &str| -> Result<(Vec<Op>, Shape), NnError> {
                        let mut s = shape;
                        let mut ops = Vec::with_capacity(list.len());
                        for (j, l) in list.iter().enumerate() {
                            let inner_from = if j == 0 {
                                format!("{path}'s input")
                            } else {
                                format!("{path}.{part}[{}] output", j - 1)
                            };
                            let (op, out) = self.layer(
                                l,
                                &format!("{name}.{part}.{j}"),
                                &format!("{path}.{part}[{j}]"),
                                s,
                                &inner_from,
                                false,
                            )?;
                            ops.push(op);
                            s = out;
                        }
                        Ok((ops, s))
                    };
                if layers.is_empty() {
                    return Err(err("layers is empty".into()));
                }
                let (body, a) = branch(layers, "layers")?;
                let (shortcut, b) = branch(shortcut, "shortcut")?;
                if a != b {
                    return Err(err(format!(
                        "its layers output {a} but its shortcut outputs {b}; they are added, so they must agree"
                    )));
                }
                (Op::Residual { body, shortcut }, a)
            }
        })
    }

    /// An element-wise layer keeps the shape (any but token ids).
    fn activation(&self, shape: Shape, err: &dyn Fn(String) -> NnError) -> Result<Shape, NnError> {
        match shape {
            Shape::Tokens(_) => Err(err(format!("gets {shape}; embed them first"))),
            s => Ok(s),
        }
    }
}

/// The configuration name of a layer's type.
fn layer_type(layer: &LayerConfig) -> &'static str {
    match layer {
        LayerConfig::Conv2d { .. } => "conv2d",
        LayerConfig::BatchNorm {} => "batch_norm",
        LayerConfig::GroupNorm { .. } => "group_norm",
        LayerConfig::Relu {} => "relu",
        LayerConfig::Gelu {} => "gelu",
        LayerConfig::Tanh {} => "tanh",
        LayerConfig::MaxPool2d { .. } => "max_pool2d",
        LayerConfig::AvgPool2d { .. } => "avg_pool2d",
        LayerConfig::AdaptiveAvgPool2d { .. } => "adaptive_avg_pool2d",
        LayerConfig::Flatten {} => "flatten",
        LayerConfig::Dropout { .. } => "dropout",
        LayerConfig::Linear { .. } => "linear",
        LayerConfig::Embedding { .. } => "embedding",
        LayerConfig::Residual { .. } => "residual",
    }
}

/// An activation between layers: a map `[B, C, H, W]` (the batched path:
/// `[B, K·C, H, W]`) or flat, `Tensor<F>` (`[B, n]`; batched `[K, B, n]`).
enum Act<const F: usize> {
    Map(Tensor<4>),
    Flat(Tensor<F>),
}

/// K clients' activations in the batched path.
type Stacked = Act<3>;

impl<const F: usize> Act<F> {
    fn map(self) -> Tensor<4> {
        match self {
            Act::Map(t) => t,
            Act::Flat(_) => unreachable!("checked when the model is built"),
        }
    }

    /// An element-wise function on either form.
    fn each(self, f: fn(Tensor<4>) -> Tensor<4>, g: fn(Tensor<F>) -> Tensor<F>) -> Self {
        match self {
            Act::Map(t) => Act::Map(f(t)),
            Act::Flat(t) => Act::Flat(g(t)),
        }
    }

    /// Runs `op` if it acts alike on one client's and K clients'
    /// activations ([`Op::is_stateless`]); the identity for the others.
    fn stateless(self, op: &Op) -> Self {
        match op {
            Op::Relu => self.each(relu, relu),
            Op::Gelu => self.each(gelu, gelu),
            Op::Tanh => self.each(tanh, tanh),
            Op::MaxPool { k, stride, pad } => {
                Act::Map(max_pool2d(self.map(), max_options(*k, *stride, *pad)))
            }
            Op::AvgPool { k, stride, pad } => {
                Act::Map(avg_pool2d(self.map(), avg_options(*k, *stride, *pad)))
            }
            Op::AdaptiveAvg(o) => Act::Map(adaptive_avg_pool2d(self.map(), [*o, *o])),
            _ => self,
        }
    }

    /// Two handles on the activation (a residual block's two branches).
    fn fork(self) -> (Self, Self) {
        match self {
            Act::Map(t) => (Act::Map(t.clone()), Act::Map(t)),
            Act::Flat(t) => (Act::Flat(t.clone()), Act::Flat(t)),
        }
    }
}

impl Act<2> {
    fn flat(self) -> Tensor<2> {
        match self {
            Act::Flat(t) => t,
            Act::Map(t) => flatten(t),
        }
    }
}

impl Act<3> {
    fn flat(self, cx: &BatchedCx) -> Tensor<3> {
        match self {
            Act::Flat(t) => t,
            Act::Map(t) => cx.flatten(t),
        }
    }
}

fn conv_options(stride: usize, pad: usize, groups: usize) -> ConvOptions<2> {
    ConvOptions::new([stride, stride], [pad, pad], [1, 1], groups)
}

fn max_options(k: usize, stride: usize, pad: usize) -> MaxPoolOptions<2> {
    MaxPoolOptions::new([k, k])
        .with_stride([stride, stride])
        .with_padding([pad, pad])
}

fn avg_options(k: usize, stride: usize, pad: usize) -> AvgPoolOptions<2> {
    AvgPoolOptions::new([k, k])
        .with_stride([stride, stride])
        .with_padding([pad, pad])
        .with_count_include_pad(true)
}

/// Group norm of `[B, C, H, W]` in `groups` groups of contiguous channels
/// (per sample), then the per-channel `scale` and `shift` `[1, C, 1, 1]`.
fn group_norm(y: Tensor<4>, groups: usize, scale: Tensor<4>, shift: Tensor<4>) -> Tensor<4> {
    let [b, c, h, w] = y.dims();
    let g: Tensor<3> = y.reshape([b, groups, c / groups * h * w]);
    let mean = g.clone().mean_dim(2);
    let centred = g - mean;
    let var = centred.clone().square().mean_dim(2);
    let normed: Tensor<3> = centred / (var + BN_EPS).sqrt();
    normed.reshape([b, c, h, w]) * scale + shift
}

/// Inverted dropout: keeps each element with probability 1 − p, scaled by
/// 1 / (1 − p), the mask drawn on the host from `rng`.
fn dropout<const D: usize>(x: Tensor<D>, p: f64, rng: &mut impl Rng) -> Tensor<D> {
    let dims = x.dims();
    let n: usize = dims.iter().product();
    let keep = (1.0 - p) as f32;
    let mask: Vec<f32> = (0..n)
        .map(|_| {
            if rng.random::<f32>() < keep {
                1.0 / keep
            } else {
                0.0
            }
        })
        .collect();
    let mask = Tensor::<D>::from_data(TensorData::new(mask, dims), &x.device());
    x * mask
}

impl Sequential {
    /// Runs `ops` from `x` (the one-client path).
    fn run(&self, ops: &[Op], mut x: Act<2>, p: &[ParamTensor], norm: &mut Norm) -> Act<2> {
        let mut ops = ops.iter().peekable();
        while let Some(op) = ops.next() {
            // Batch norm then ReLU, and ReLU then max pooling, each in one
            // kernel on the CPU (the bits of the two layers).
            match (op, ops.peek()) {
                (Op::BatchNorm { at, which, norm: n }, Some(Op::Relu)) => {
                    x = Act::Map(norm.apply_relu(*which, *n, x.map(), &p[*at], &p[at + 1]));
                    ops.next();
                    continue;
                }
                (Op::Relu, Some(Op::MaxPool { k, stride, pad })) if matches!(x, Act::Map(_)) => {
                    x = Act::Map(relu_max_pool2d(x.map(), max_options(*k, *stride, *pad)));
                    ops.next();
                    continue;
                }
                _ => {}
            }
            x = match op {
                _ if op.is_stateless() => x.stateless(op),
                Op::Linear { at, bias, .. } => {
                    let b = bias.then(|| p[at + 1].t1());
                    Act::Flat(linear(x.flat(), p[*at].t2(), b))
                }
                Op::Conv {
                    at,
                    bias,
                    stride,
                    pad,
                    groups,
                    ..
                } => {
                    let b = bias.then(|| p[at + 1].t1());
                    let options = conv_options(*stride, *pad, *groups);
                    Act::Map(conv2d(x.map(), p[*at].t4(), b, options))
                }
                Op::BatchNorm { at, which, norm: n } => {
                    Act::Map(norm.apply(*which, *n, x.map(), &p[*at], &p[at + 1]))
                }
                Op::GroupNorm {
                    at,
                    groups,
                    channels,
                } => {
                    let scale = p[*at].t1().reshape([1, *channels, 1, 1]);
                    let shift = p[at + 1].t1().reshape([1, *channels, 1, 1]);
                    Act::Map(group_norm(x.map(), *groups, scale, shift))
                }
                Op::Flatten => Act::Flat(x.flat()),
                Op::Dropout(rate) => match norm.dropout() {
                    None => x,
                    Some(rng) => match x {
                        Act::Map(t) => Act::Map(dropout(t, *rate, rng)),
                        Act::Flat(t) => Act::Flat(dropout(t, *rate, rng)),
                    },
                },
                Op::Embedding { at, .. } => {
                    let Act::Flat(ids) = x else {
                        unreachable!("checked when the model is built")
                    };
                    let [b, len] = ids.dims();
                    let e = embedding(p[*at].t2(), super::textcnn::ids(ids));
                    let [_, _, dim] = e.dims();
                    Act::Map(e.reshape([b, 1, len, dim]))
                }
                Op::Residual { body, shortcut } => {
                    let (y, s) = x.fork();
                    let y = self.run(body, y, p, norm);
                    let s = self.run(shortcut, s, p, norm);
                    match (y, s) {
                        (Act::Map(a), Act::Map(b)) => Act::Map(a + b),
                        (a, b) => Act::Flat(a.flat() + b.flat()),
                    }
                }
                // Element-wise and pooling layers: the first arm ran them.
                _ => x,
            };
        }
        x
    }

    /// Runs `ops` on the stacked activations of K clients.
    fn run_batched(&self, ops: &[Op], mut x: Stacked, cx: &mut BatchedCx) -> Stacked {
        for op in ops {
            x = match op {
                _ if op.is_stateless() => x.stateless(op),
                Op::Linear { at, bias, .. } => {
                    let x = x.flat(cx);
                    Stacked::Flat(if *bias {
                        cx.stack.linear(x, *at)
                    } else {
                        x.matmul(cx.stack.lin_w(*at))
                    })
                }
                Op::Conv {
                    at,
                    bias,
                    stride,
                    pad,
                    groups,
                    ..
                } => {
                    let b = bias.then(|| cx.stack.conv_bias(at + 1));
                    Stacked::Map(
                        cx.stack
                            .grouped_conv(x.map(), *at, b, *stride, *pad, *groups),
                    )
                }
                Op::BatchNorm { at, .. } => Stacked::Map(cx.batch_norm(x.map(), *at)),
                Op::GroupNorm { at, groups, .. } => {
                    let (scale, shift) = (cx.stack.channel(*at), cx.stack.channel(at + 1));
                    Stacked::Map(group_norm(x.map(), cx.k * groups, scale, shift))
                }
                Op::Flatten => Stacked::Flat(x.flat(cx)),
                Op::Residual { body, shortcut } => {
                    let (y, s) = x.fork();
                    let y = self.run_batched(body, y, cx);
                    let s = self.run_batched(shortcut, s, cx);
                    match (y, s) {
                        (Stacked::Map(a), Stacked::Map(b)) => Stacked::Map(a + b),
                        (a, b) => Stacked::Flat(a.flat(cx) + b.flat(cx)),
                    }
                }
                Op::Dropout(_) | Op::Embedding { .. } => {
                    unreachable!("models with these layers have no batched form")
                }
                // Element-wise and pooling layers: the first arm ran them.
                _ => x,
            };
        }
        x
    }

    /// Walks `ops` into export entries named under `prefix`.
    fn describe_ops(&self, ops: &[Op], prefix: &str) -> Vec<LayerDesc> {
        ops.iter()
            .enumerate()
            .map(|(i, op)| {
                let name = format!("{prefix}{i}");
                match op {
                    Op::Linear { shape, bias, .. } => LayerDesc::Linear {
                        name,
                        in_features: shape[0],
                        out_features: shape[1],
                        bias: *bias,
                    },
                    Op::Conv {
                        shape,
                        bias,
                        stride,
                        pad,
                        groups,
                        ..
                    } => LayerDesc::Conv2d {
                        name,
                        in_channels: shape[1] * groups,
                        out_channels: shape[0],
                        kernel_size: shape[2],
                        stride: *stride,
                        padding: *pad,
                        groups: *groups,
                        bias: *bias,
                    },
                    Op::BatchNorm { norm: (c, _), .. } => bn_desc(&name, *c),
                    Op::GroupNorm {
                        groups, channels, ..
                    } => LayerDesc::GroupNorm {
                        name,
                        num_groups: *groups,
                        num_channels: *channels,
                        eps: 1e-5,
                    },
                    Op::Relu => LayerDesc::Relu,
                    Op::Gelu => LayerDesc::Gelu,
                    Op::Tanh => LayerDesc::Tanh,
                    Op::MaxPool { k, stride, pad } => LayerDesc::MaxPool2d {
                        kernel_size: *k,
                        stride: *stride,
                        padding: *pad,
                    },
                    Op::AvgPool { k, stride, pad } => LayerDesc::AvgPool2d {
                        kernel_size: *k,
                        stride: *stride,
                        padding: *pad,
                    },
                    Op::AdaptiveAvg(o) => LayerDesc::AdaptiveAvgPool2d { output_size: *o },
                    Op::Flatten => LayerDesc::Flatten,
                    Op::Dropout(p) => LayerDesc::Dropout { p: *p },
                    Op::Embedding { shape, .. } => LayerDesc::Embedding {
                        name,
                        num_embeddings: shape[0],
                        embedding_dim: shape[1],
                    },
                    Op::Residual { body, shortcut } => LayerDesc::Residual {
                        name,
                        layers: self.describe_ops(body, "layers."),
                        shortcut: self.describe_ops(shortcut, "shortcut."),
                    },
                }
            })
            .collect()
    }
}

impl Net for Sequential {
    fn features(&self, p: &[ParamTensor], x: Tensor<2>, norm: &mut Norm) -> Tensor<2> {
        let x = match self.input {
            Shape::Map(m) => Act::Map(crate::model::to_image(x, m)),
            _ => Act::Flat(x),
        };
        self.run(&self.ops[..self.head], x, p, norm).flat()
    }

    fn head(&self, p: &[ParamTensor], features: Tensor<2>) -> Tensor<2> {
        let x = match self.features {
            Shape::Map(m) => Act::Map(crate::model::to_image(features, m)),
            _ => Act::Flat(features),
        };
        // The head holds no batch norm or dropout (checked when the model
        // is built), so it runs the same in training and evaluation.
        let mut norm = Norm::Running(&[]);
        self.run(&self.ops[self.head..], x, p, &mut norm).flat()
    }

    fn feature_len(&self) -> usize {
        match self.features {
            Shape::Map([c, h, w]) => c * h * w,
            Shape::Flat(n) | Shape::Tokens(n) => n,
        }
    }

    fn head_group(&self, _: &ParamLayout) -> usize {
        self.head_group
    }

    fn is_batch_norm(&self, group: &str) -> bool {
        self.bn_groups.iter().any(|g| g == group)
    }

    /// PyTorch's defaults: conv and linear U(−1/√fan_in, 1/√fan_in), norm
    /// scale 1 and shift 0, embedding N(0, 1).
    fn draw(&self, group: &str, t: &TensorSpec, fan_in: usize) -> Draw {
        if self.gn_groups.iter().any(|g| g == group) {
            return Draw::Fill(if t.name.ends_with(".weight") {
                1.0
            } else {
                0.0
            });
        }
        match self.ops.first() {
            Some(Op::Embedding { .. }) if t.name == "layers.0.weight" => Draw::Normal(1.0),
            _ => Draw::Uniform(1.0 / (fan_in as f32).sqrt()),
        }
    }

    fn batched(&self) -> Result<&dyn Batched, String> {
        match &self.not_batched {
            Some(why) => Err(why.clone()),
            None => Ok(self),
        }
    }

    fn describe(&self, _: &ParamLayout) -> Option<Vec<LayerDesc>> {
        Some(self.describe_ops(&self.ops, "layers."))
    }

    fn draws_in_training(&self) -> bool {
        fn any(ops: &[Op]) -> bool {
            ops.iter().any(|op| match op {
                Op::Dropout(_) => true,
                Op::Residual { body, shortcut } => any(body) || any(shortcut),
                _ => false,
            })
        }
        any(&self.ops)
    }
}

impl Batched for Sequential {
    fn input(&self) -> BatchedInput {
        match self.input {
            Shape::Map(_) => BatchedInput::Image,
            _ => BatchedInput::Flat,
        }
    }

    fn forward(&self, cx: &mut BatchedCx, x: Tensor<3>) -> Tensor<3> {
        let x = match self.input {
            Shape::Map(m) => Stacked::Map(cx.image(x, m)),
            _ => Stacked::Flat(x),
        };
        let out = self.run_batched(&self.ops, x, cx);
        out.flat(cx)
    }
}
