//! Model architectures as pure functions of their flat parameter vector.

use crate::NnError;
use burn::tensor::activation::relu;
use burn::tensor::module::{conv2d, linear, max_pool2d};
use burn::tensor::ops::{ConvOptions, MaxPoolOptions};
use burn::tensor::{Device, Tensor, TensorData};
use fedweave_core::ParamLayout;
use rand::Rng;
use serde::{Deserialize, Serialize};

/// The architectures fedweave offers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ModelKind {
    /// input → 200 → 200 → classes, ReLU (FedAvg's MNIST MLP).
    Mlp,
    /// pFedGraph/DPFL SimpleCNN: conv 5×5→6, pool, conv 5×5→16, pool,
    /// fc 120, fc 84, fc classes (LeNet-5 style).
    Cnn,
}

impl ModelKind {
    /// Names and descriptions for `fedweave list`.
    pub fn catalogue() -> &'static [(&'static str, &'static str)] {
        &[
            ("mlp", "input → 200 → 200 → classes, ReLU; any input shape"),
            (
                "cnn",
                "SimpleCNN of pFedGraph/DPFL: conv5×5→6, pool, conv5×5→16, pool, fc120, fc84, fc; C×28×28 or C×32×32",
            ),
        ]
    }
}

/// A concrete model: architecture plus input and output sizes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelSpec {
    kind: ModelKind,
    input_shape: Vec<usize>,
    num_classes: usize,
    layout: ParamLayout,
}

const MLP_HIDDEN: usize = 200;

impl ModelSpec {
    /// Validates the input shape for the architecture and builds the layout.
    pub fn new(
        kind: ModelKind,
        input_shape: &[usize],
        num_classes: usize,
    ) -> Result<Self, NnError> {
        let bad = |reason: &str| NnError::BadInputShape {
            model: format!("{kind:?}").to_lowercase(),
            shape: input_shape.to_vec(),
            reason: reason.to_string(),
        };
        let mut layout = ParamLayout::new();
        match kind {
            ModelKind::Mlp => {
                let d: usize = input_shape.iter().product();
                if d == 0 {
                    return Err(bad("empty input"));
                }
                layout
                    .push_group(
                        "fc1",
                        &[("weight", vec![d, MLP_HIDDEN]), ("bias", vec![MLP_HIDDEN])],
                    )
                    .push_group(
                        "fc2",
                        &[
                            ("weight", vec![MLP_HIDDEN, MLP_HIDDEN]),
                            ("bias", vec![MLP_HIDDEN]),
                        ],
                    )
                    .push_group(
                        "fc3",
                        &[
                            ("weight", vec![MLP_HIDDEN, num_classes]),
                            ("bias", vec![num_classes]),
                        ],
                    );
            }
            ModelKind::Cnn => {
                let [c, h, w] = <[usize; 3]>::try_from(input_shape)
                    .map_err(|_| bad("needs a C×H×W image input"))?;
                if h != w || (h != 28 && h != 32) {
                    return Err(bad("needs 28×28 or 32×32 images"));
                }
                let s = ((h - 4) / 2 - 4) / 2;
                layout
                    .push_group("conv1", &[("weight", vec![6, c, 5, 5]), ("bias", vec![6])])
                    .push_group(
                        "conv2",
                        &[("weight", vec![16, 6, 5, 5]), ("bias", vec![16])],
                    )
                    .push_group(
                        "fc1",
                        &[("weight", vec![16 * s * s, 120]), ("bias", vec![120])],
                    )
                    .push_group("fc2", &[("weight", vec![120, 84]), ("bias", vec![84])])
                    .push_group(
                        "fc3",
                        &[
                            ("weight", vec![84, num_classes]),
                            ("bias", vec![num_classes]),
                        ],
                    );
            }
        }
        Ok(Self {
            kind,
            input_shape: input_shape.to_vec(),
            num_classes,
            layout,
        })
    }

    /// The architecture.
    pub fn kind(&self) -> ModelKind {
        self.kind
    }

    /// Number of output classes.
    pub fn num_classes(&self) -> usize {
        self.num_classes
    }

    /// Elements of one input sample.
    pub fn input_len(&self) -> usize {
        self.input_shape.iter().product()
    }

    /// Layout of the flat parameter vector.
    pub fn layout(&self) -> &ParamLayout {
        &self.layout
    }

    /// PyTorch's default initialisation: weights and biases ~ U(−1/√fan_in,
    /// 1/√fan_in) (kaiming-uniform with a = √5), so results compare with the
    /// authors' code.
    pub fn init(&self, rng: &mut impl Rng) -> Vec<f32> {
        let mut out = vec![0.0f32; self.layout.len()];
        for group in self.layout.groups() {
            let weight = &self
                .layout
                .tensors()
                .iter()
                .find(|t| t.offset == group.range.start)
                .expect("group starts at a tensor");
            let fan_in = match weight.shape.len() {
                4 => weight.shape[1] * weight.shape[2] * weight.shape[3],
                2 => weight.shape[0],
                _ => weight.shape[0],
            };
            let bound = 1.0 / (fan_in as f32).sqrt();
            for x in &mut out[group.range.clone()] {
                *x = rng.random_range(-bound..bound);
            }
        }
        out
    }

    /// Forward pass: a batch of flattened inputs `[batch, input_len]` to logits.
    pub(crate) fn forward(&self, p: &[ParamTensor], x: Tensor<2>) -> Tensor<2> {
        match self.kind {
            ModelKind::Mlp => {
                let h = relu(linear(x, p[0].t2(), Some(p[1].t1())));
                let h = relu(linear(h, p[2].t2(), Some(p[3].t1())));
                linear(h, p[4].t2(), Some(p[5].t1()))
            }
            ModelKind::Cnn => {
                let [batch, _] = x.dims();
                let [c, h, w] = [
                    self.input_shape[0],
                    self.input_shape[1],
                    self.input_shape[2],
                ];
                let x: Tensor<4> = x.reshape([batch, c, h, w]);
                let conv = || ConvOptions::new([1, 1], [0, 0], [1, 1], 1);
                let pool = || MaxPoolOptions::new([2, 2]);
                let y = max_pool2d(relu(conv2d(x, p[0].t4(), Some(p[1].t1()), conv())), pool());
                let y = max_pool2d(relu(conv2d(y, p[2].t4(), Some(p[3].t1()), conv())), pool());
                let [b, ch, hh, ww] = y.dims();
                let y: Tensor<2> = y.reshape([b, ch * hh * ww]);
                let y = relu(linear(y, p[4].t2(), Some(p[5].t1())));
                let y = relu(linear(y, p[6].t2(), Some(p[7].t1())));
                linear(y, p[8].t2(), Some(p[9].t1()))
            }
        }
    }

    /// Builds the parameter tensors from a flat vector, optionally tracking
    /// gradients.
    pub(crate) fn tensors(&self, flat: &[f32], device: &Device, track: bool) -> Vec<ParamTensor> {
        self.layout
            .tensors()
            .iter()
            .map(|t| {
                let data = TensorData::new(flat[t.range()].to_vec(), t.shape.clone());
                let pt = match t.shape.len() {
                    1 => ParamTensor::T1(Tensor::from_data(data, device)),
                    2 => ParamTensor::T2(Tensor::from_data(data, device)),
                    4 => ParamTensor::T4(Tensor::from_data(data, device)),
                    r => unreachable!("layouts only hold rank 1, 2 and 4 tensors, got {r}"),
                };
                if track { pt.require_grad() } else { pt }
            })
            .collect()
    }
}

/// A parameter tensor of rank 1, 2 or 4.
#[derive(Clone)]
pub(crate) enum ParamTensor {
    T1(Tensor<1>),
    T2(Tensor<2>),
    T4(Tensor<4>),
}

impl ParamTensor {
    fn require_grad(self) -> Self {
        match self {
            Self::T1(t) => Self::T1(t.require_grad()),
            Self::T2(t) => Self::T2(t.require_grad()),
            Self::T4(t) => Self::T4(t.require_grad()),
        }
    }
    fn t1(&self) -> Tensor<1> {
        match self {
            Self::T1(t) => t.clone(),
            _ => unreachable!("layout rank mismatch"),
        }
    }
    fn t2(&self) -> Tensor<2> {
        match self {
            Self::T2(t) => t.clone(),
            _ => unreachable!("layout rank mismatch"),
        }
    }
    fn t4(&self) -> Tensor<4> {
        match self {
            Self::T4(t) => t.clone(),
            _ => unreachable!("layout rank mismatch"),
        }
    }

    /// Copies this tensor's gradient into `out` (zeros if it has none).
    pub(crate) fn grad_into(&self, grads: &burn::tensor::Gradients, out: &mut [f32]) {
        let data = match self {
            Self::T1(t) => t.grad(grads).map(|g| g.into_data()),
            Self::T2(t) => t.grad(grads).map(|g| g.into_data()),
            Self::T4(t) => t.grad(grads).map(|g| g.into_data()),
        };
        match data.as_ref().and_then(|d| d.as_slice::<f32>().ok()) {
            Some(s) => out.copy_from_slice(s),
            None => out.fill(0.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameter_counts_match_the_reference_models() {
        // pFedGraph's SimpleCNN for 1×28×28 has 44,426 parameters (fc1 256→120).
        let cnn = ModelSpec::new(ModelKind::Cnn, &[1, 28, 28], 10).unwrap();
        assert_eq!(cnn.layout().len(), 44_426);
        // LeNet-5 for 3×32×32 (fc1 400→120): 62,006.
        let cnn32 = ModelSpec::new(ModelKind::Cnn, &[3, 32, 32], 10).unwrap();
        assert_eq!(cnn32.layout().len(), 62_006);
        let mlp = ModelSpec::new(ModelKind::Mlp, &[1, 28, 28], 10).unwrap();
        assert_eq!(mlp.layout().len(), 784 * 200 + 200 + 200 * 200 + 200 + 2010);
    }

    #[test]
    fn cnn_rejects_small_images() {
        let err = ModelSpec::new(ModelKind::Cnn, &[1, 8, 8], 10).unwrap_err();
        assert!(err.to_string().contains("28×28"), "{err}");
    }
}
