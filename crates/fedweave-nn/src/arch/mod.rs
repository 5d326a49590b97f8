//! The architectures as a registry: one file per architecture, each a
//! [`ModelInfo`] entry (its name, summary and builder) and a built type
//! implementing `Net`, the one trait the rest of the crate calls. A
//! [`crate::ModelSpec`] stores the built `Net` (its resolved shapes and
//! layer plan), so nothing outside this module matches on the
//! architecture. Adding a model is a file here plus one line in the
//! `REGISTRY` list below.

pub(crate) mod cnn;
pub(crate) mod cnn_bn;
pub(crate) mod cnn_dwa;
#[cfg(test)]
mod embed_tests;
pub(crate) mod gru;
pub(crate) mod mf;
pub(crate) mod mlp;
pub(crate) mod resnet;
pub(crate) mod sequential;
pub(crate) mod textcnn;

use crate::NnError;
use crate::batched::BatchedCx;
use crate::kernels::linear;
use crate::model::{ModelInput, Norm, ParamTensor, RegressionLoss};
use burn::tensor::Tensor;
use fedweave_core::{ParamLayout, TensorSpec};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::sync::Arc;

/// Every architecture, in `fedweave list` order.
const REGISTRY: &[ModelInfo] = &[
    mlp::INFO,
    cnn::INFO,
    cnn_bn::INFO,
    cnn_dwa::INFO,
    gru::INFO,
    resnet::RESNET8,
    resnet::RESNET9,
    resnet::RESNET18,
    textcnn::INFO,
    mf::INFO,
    sequential::INFO,
];

/// The names of [`REGISTRY`], for serde's "unknown variant" message (which
/// the configuration turns into "did you mean").
const NAMES: [&str; REGISTRY.len()] = {
    let mut names = [""; REGISTRY.len()];
    let mut i = 0;
    while i < REGISTRY.len() {
        names[i] = REGISTRY[i].name;
        i += 1;
    }
    names
};

/// One registered architecture.
#[derive(Clone, Copy, Debug)]
pub struct ModelInfo {
    /// Its name in configurations (`cnn-bn`).
    pub name: &'static str,
    /// One line for `fedweave list`.
    pub summary: &'static str,
    /// Whether K clients' copies can train in one kernel set
    /// ([`crate::BatchedTrainer`]); a `sequential` model may still refuse
    /// for a layer without a batched form.
    pub batched: bool,
    /// Whether `[model] embed_dim` applies.
    pub embedding: bool,
    build: fn(&BuildCx) -> Result<Built, NnError>,
}

/// What a model is built for: the sample shape, the output width and the
/// input description.
pub(crate) struct BuildCx<'a> {
    pub name: &'static str,
    pub input_shape: &'a [usize],
    pub classes: usize,
    pub input: &'a ModelInput,
}

impl BuildCx<'_> {
    /// A [`NnError::BadInputShape`] for this model and input.
    pub fn bad(&self, reason: &str) -> NnError {
        NnError::BadInputShape {
            model: self.name.to_string(),
            shape: self.input_shape.to_vec(),
            reason: reason.to_string(),
        }
    }

    /// `[model] embed_dim`, or the model's `default`.
    pub fn embed_dim(&self, default: usize) -> Result<usize, NnError> {
        match self.input.embed_dim {
            Some(0) => Err(self.bad("model.embed_dim must be at least 1")),
            Some(d) => Ok(d),
            None => Ok(default),
        }
    }

    /// The input as a `C×H×W` image.
    pub fn image(&self) -> Result<[usize; 3], NnError> {
        <[usize; 3]>::try_from(self.input_shape).map_err(|_| self.bad("needs a C×H×W image input"))
    }
}

/// An architecture built for one input: its layout, its batch-norm layers
/// (channels, offset of the running mean in the buffer vector; the running
/// variance follows it) and the forward pass.
pub(crate) struct Built {
    pub layout: ParamLayout,
    pub batch_norms: Vec<(usize, usize)>,
    pub net: Arc<dyn Net>,
}

impl Built {
    /// A model without batch norm.
    pub fn plain(layout: ParamLayout, net: impl Net + 'static) -> Self {
        Self {
            layout,
            batch_norms: Vec::new(),
            net: Arc::new(net),
        }
    }
}

/// How one parameter tensor is initialised.
pub(crate) enum Draw {
    /// U(−b, b).
    Uniform(f32),
    /// N(0, std²).
    Normal(f32),
    /// A constant.
    Fill(f32),
}

/// A built architecture: what training, evaluation, the split methods and
/// export ask of a model. `p` are the parameter tensors in layout order.
pub(crate) trait Net: Send + Sync + std::fmt::Debug {
    /// The body: `[batch, input_len]` inputs to the `[batch, feature_len]`
    /// features the head reads. `norm` says whether batch norm uses the
    /// batch's statistics (training) or the running ones (evaluation).
    fn features(&self, p: &[ParamTensor], x: Tensor<2>, norm: &mut Norm) -> Tensor<2>;

    /// The head: features to outputs. The default is one linear layer with
    /// a bias, the layout's last two tensors.
    fn head(&self, p: &[ParamTensor], features: Tensor<2>) -> Tensor<2> {
        let k = p.len();
        linear(features, p[k - 2].t2(), Some(p[k - 1].t1()))
    }

    /// Width of the features.
    fn feature_len(&self) -> usize;

    /// Where the head begins in the layout: by default its last group.
    fn head_group(&self, layout: &ParamLayout) -> usize {
        layout.groups().len() - 1
    }

    /// Whether a layer group is a batch norm (FedBN's local groups). The
    /// built-ins name them `bn…` (`bn1`, `layer1.0.bn2`,
    /// `layer2.0.downsample.bn`).
    fn is_batch_norm(&self, group: &str) -> bool {
        group
            .rsplit('.')
            .next()
            .is_some_and(|last| last.starts_with("bn"))
    }

    /// How `tensor` of `group` is drawn, `fan_in` being its group's first
    /// tensor's: PyTorch's default U(−1/√fan_in, 1/√fan_in) unless the
    /// reference code of the model says otherwise.
    fn draw(&self, group: &str, tensor: &TensorSpec, fan_in: usize) -> Draw {
        let _ = (group, tensor);
        Draw::Uniform(1.0 / (fan_in as f32).sqrt())
    }

    /// The batched formulation, if the architecture has one.
    fn batched(&self) -> Result<&dyn Batched, String> {
        Err("no batched formulation (mlp, cnn, cnn-bn, cnn-dwa, the ResNets and sequential models of linear, conv, norm, pool and activation layers have one)".into())
    }

    /// The layer list export writes (PyTorch names and arguments); `None`
    /// where the architecture is not a plain sequence of layers.
    fn describe(&self, layout: &ParamLayout) -> Option<Vec<LayerDesc>>;

    /// Whether training draws randomness in the forward pass (dropout).
    fn draws_in_training(&self) -> bool {
        false
    }

    /// The loss the model trains on for regression targets.
    fn regression_loss(&self) -> RegressionLoss {
        RegressionLoss::Mae
    }
}

/// How a batched architecture wants its stacked input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BatchedInput {
    /// `[K, B, input_len]`.
    Flat,
    /// `[B, K·C, H, W]`: client k's channels are the k-th group.
    Image,
}

/// K clients' copies in one set of kernels (see [`crate::batched`]).
pub(crate) trait Batched {
    /// The arrangement of the stacked input.
    fn input(&self) -> BatchedInput;
    /// The stacked forward pass to logits `[K, B, classes]`.
    fn forward(&self, cx: &mut BatchedCx, x: Tensor<3>) -> Tensor<3>;
}

/// One layer of an exported model's description: `scripts/load_exported.py`
/// builds each as the PyTorch module of that `type`, attached under `name`
/// (dotted names are nested modules), so the exported `state_dict` loads
/// with `strict=True`.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum LayerDesc {
    /// `nn.Linear`.
    Linear {
        /// Module name.
        name: String,
        /// Input width.
        in_features: usize,
        /// Output width.
        out_features: usize,
        /// Whether it has a bias.
        bias: bool,
    },
    /// `nn.Conv2d` (square kernel).
    Conv2d {
        /// Module name.
        name: String,
        /// Input channels.
        in_channels: usize,
        /// Output channels.
        out_channels: usize,
        /// Kernel side.
        kernel_size: usize,
        /// Stride.
        stride: usize,
        /// Zero padding.
        padding: usize,
        /// Channel groups.
        groups: usize,
        /// Whether it has a bias.
        bias: bool,
    },
    /// `nn.BatchNorm2d`.
    #[serde(rename = "batch_norm2d")]
    BatchNorm2d {
        /// Module name.
        name: String,
        /// Channels.
        num_features: usize,
        /// ε.
        eps: f64,
        /// Running-average momentum.
        momentum: f64,
    },
    /// `nn.GroupNorm`.
    GroupNorm {
        /// Module name.
        name: String,
        /// Groups.
        num_groups: usize,
        /// Channels.
        num_channels: usize,
        /// ε.
        eps: f64,
    },
    /// `nn.ReLU`.
    Relu,
    /// `nn.GELU`.
    Gelu,
    /// `nn.Tanh`.
    Tanh,
    /// `nn.MaxPool2d`.
    #[serde(rename = "max_pool2d")]
    MaxPool2d {
        /// Window side.
        kernel_size: usize,
        /// Stride.
        stride: usize,
        /// Padding.
        padding: usize,
    },
    /// `nn.AvgPool2d` (padding counted, PyTorch's default).
    #[serde(rename = "avg_pool2d")]
    AvgPool2d {
        /// Window side.
        kernel_size: usize,
        /// Stride.
        stride: usize,
        /// Padding.
        padding: usize,
    },
    /// `nn.AdaptiveAvgPool2d`.
    #[serde(rename = "adaptive_avg_pool2d")]
    AdaptiveAvgPool2d {
        /// Output side.
        output_size: usize,
    },
    /// `nn.AdaptiveMaxPool2d`.
    #[serde(rename = "adaptive_max_pool2d")]
    AdaptiveMaxPool2d {
        /// Output side.
        output_size: usize,
    },
    /// `nn.Flatten`.
    Flatten,
    /// `nn.Dropout`.
    Dropout {
        /// Drop probability.
        p: f64,
    },
    /// `nn.Embedding` over token ids; its `[batch, len, dim]` output is
    /// read as a one-channel `len × dim` map.
    Embedding {
        /// Module name.
        name: String,
        /// Rows.
        num_embeddings: usize,
        /// Width.
        embedding_dim: usize,
    },
    /// `layers(x) + shortcut(x)` (an empty shortcut is the identity);
    /// inner names are relative to `name`.
    Residual {
        /// Module name.
        name: String,
        /// The residual branch.
        layers: Vec<LayerDesc>,
        /// The shortcut branch.
        shortcut: Vec<LayerDesc>,
    },
    /// Multiplies by a constant (ResNet-9's logit scale).
    Scale {
        /// The factor.
        factor: f64,
    },
}

/// Batch-norm ε and momentum (PyTorch's defaults), as exported.
pub(crate) fn bn_desc(name: &str, c: usize) -> LayerDesc {
    LayerDesc::BatchNorm2d {
        name: name.into(),
        num_features: c,
        eps: 1e-5,
        momentum: 0.1,
    }
}

/// The export entry of linear layer `name` (weight stored `[in, out]`).
pub(crate) fn linear_desc(layout: &ParamLayout, name: &str) -> LayerDesc {
    let s = shape(layout, &format!("{name}.weight"));
    LayerDesc::Linear {
        name: name.into(),
        in_features: s[0],
        out_features: s[1],
        bias: layout.tensor(&format!("{name}.bias")).is_some(),
    }
}

/// The export entry of a stride-1, unpadded conv layer `name`.
pub(crate) fn conv_desc(layout: &ParamLayout, name: &str) -> LayerDesc {
    conv_desc_with(layout, name, name, 1, 0)
}

/// The export entry of conv tensor group `group`, exported as `name`.
pub(crate) fn conv_desc_with(
    layout: &ParamLayout,
    group: &str,
    name: &str,
    stride: usize,
    padding: usize,
) -> LayerDesc {
    let s = shape(layout, &format!("{group}.weight"));
    LayerDesc::Conv2d {
        name: name.into(),
        in_channels: s[1],
        out_channels: s[0],
        kernel_size: s[2],
        stride,
        padding,
        groups: 1,
        bias: layout.tensor(&format!("{group}.bias")).is_some(),
    }
}

/// A 2×2 max pool of stride 2.
pub(crate) fn pool2_desc() -> LayerDesc {
    LayerDesc::MaxPool2d {
        kernel_size: 2,
        stride: 2,
        padding: 0,
    }
}

fn shape(layout: &ParamLayout, name: &str) -> Vec<usize> {
    layout
        .tensor(name)
        .map(|t| t.shape.clone())
        .unwrap_or_default()
}

/// The width read by the linear head ending the layout (weight `[in, out]`,
/// then `bias` when it has one).
pub(crate) fn head_input(layout: &ParamLayout, bias: bool) -> usize {
    let t = layout.tensors();
    t[t.len() - 1 - usize::from(bias)].shape[0]
}

/// Which architecture a model is: a handle on a registered name, cheap to
/// copy and compare. Configurations spell it as its name (`cnn-bn`).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ModelKind(&'static str);

impl ModelKind {
    /// input → 200 → 200 → classes, ReLU (FedAvg's MNIST MLP).
    pub const MLP: Self = Self("mlp");
    /// pFedGraph/DPFL SimpleCNN (LeNet-5 style).
    pub const CNN: Self = Self("cnn");
    /// FedAGHN's 4-layer CNN with batch norm.
    pub const CNN_BN: Self = Self("cnn-bn");
    /// FedDWA's CIFAR CNN.
    pub const CNN_DWA: Self = Self("cnn-dwa");
    /// SFL's forecasting GRU.
    pub const GRU: Self = Self("gru");
    /// FedDWA's ResNet-8.
    pub const RESNET8: Self = Self("resnet8");
    /// SFL's ResNet-9.
    pub const RESNET9: Self = Self("resnet9");
    /// torchvision's ResNet-18.
    pub const RESNET18: Self = Self("resnet18");
    /// Kim's TextCNN (pFedGraph).
    pub const TEXTCNN: Self = Self("textcnn");
    /// Biased matrix factorisation.
    pub const MF: Self = Self("mf");
    /// A layer list from the configuration ([`crate::SequentialConfig`]).
    pub const SEQUENTIAL: Self = Self("sequential");

    /// The registered architecture called `name`.
    ///
    /// # Errors
    ///
    /// The known names, when `name` is not one.
    pub fn from_name(name: &str) -> Result<Self, String> {
        REGISTRY
            .iter()
            .find(|i| i.name == name)
            .map(|i| Self(i.name))
            .ok_or_else(|| {
                format!(
                    "unknown model `{name}`; known: {}",
                    Self::names().join(", ")
                )
            })
    }

    /// Its name in configurations.
    pub fn name(self) -> &'static str {
        self.0
    }

    /// Its registry entry.
    pub fn info(self) -> &'static ModelInfo {
        REGISTRY
            .iter()
            .find(|i| i.name == self.0)
            .expect("a ModelKind is only made from a registered name")
    }

    /// Every registered architecture, in list order (`fedweave list`).
    pub fn catalogue() -> &'static [ModelInfo] {
        REGISTRY
    }

    /// Every registered name.
    pub fn names() -> &'static [&'static str] {
        &NAMES
    }

    /// Builds the architecture for one input.
    pub(crate) fn build(
        self,
        input_shape: &[usize],
        classes: usize,
        input: &ModelInput,
    ) -> Result<Built, NnError> {
        let info = self.info();
        (info.build)(&BuildCx {
            name: info.name,
            input_shape,
            classes,
            input,
        })
    }
}

impl std::fmt::Debug for ModelKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::fmt::Display for ModelKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl Serialize for ModelKind {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.0)
    }
}

impl<'de> Deserialize<'de> for ModelKind {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        Self::from_name(&name).map_err(|_| serde::de::Error::unknown_variant(&name, &NAMES))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_constant_is_registered_once() {
        let mut names = NAMES.to_vec();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), REGISTRY.len(), "names are unique");
        for kind in [
            ModelKind::MLP,
            ModelKind::CNN,
            ModelKind::CNN_BN,
            ModelKind::CNN_DWA,
            ModelKind::GRU,
            ModelKind::RESNET8,
            ModelKind::RESNET9,
            ModelKind::RESNET18,
            ModelKind::TEXTCNN,
            ModelKind::MF,
            ModelKind::SEQUENTIAL,
        ] {
            assert_eq!(ModelKind::from_name(kind.name()), Ok(kind));
        }
        assert!(ModelKind::from_name("cnnn").unwrap_err().contains("cnn-bn"));
    }
}
