//! Residual networks as a list of stages: the layout and the forward pass
//! are both walks over the same list, so they cannot disagree.
//!
//! - `resnet8`: FedDWA's `resnet8` (He et al.'s CIFAR ResNet with one basic
//!   block per stage, channels 16/32/64, a 3×3 max pool of stride 2 after
//!   the stem, 1×1-conv shortcuts), global average pool, linear head.
//! - `resnet9`: SFL's "BResidual" (Myrtle/DAWNBench): conv-BN-ReLU blocks of
//!   64, 128 (+ residual), 256 (+ residual), 256 channels with 2×2 max pools,
//!   a global max pool and a bias-free linear head scaled by 0.2.
//! - `resnet18`: torchvision's `resnet18` as FedAGHN builds it (7×7 stride-2
//!   stem, 3×3 max pool, two basic blocks per stage of 64/128/256/512
//!   channels), global average pool, linear head.
//!
//! Every convolution is bias-free and followed by batch norm, whose running
//! statistics are per-client buffers; the scales and shifts are the `bn`
//! groups of [`crate::ModelSplit::batch_norm`] that FedBN keeps local.

use super::{
    Batched, BatchedInput, BuildCx, Built, Draw, LayerDesc, ModelInfo, Net, bn_desc,
    conv_desc_with, head_input,
};
use crate::NnError;
use crate::batched::BatchedCx;
use crate::kernels::linear;
use crate::kernels::{add_relu, conv2d, max_pool2d, swap_leading};
use crate::model::{Norm, ParamTensor, to_image};
use burn::tensor::Tensor;
use burn::tensor::ops::{ConvOptions, MaxPoolOptions};
use fedweave_core::{ParamLayout, TensorSpec};
use std::sync::Arc;

/// The registry entry of ResNet-8.
pub(crate) const RESNET8: ModelInfo = ModelInfo {
    name: "resnet8",
    summary: "FedDWA's ResNet-8: conv3×3→16, BN, maxpool, 3 basic blocks (16/32/64), avg pool, fc; 78,042 parameters on 3×32×32; any C×H×W ≥ 8×8",
    batched: true,
    embedding: false,
    build: |cx| build(cx, Plan::resnet8, Init::KaimingFanIn, true),
};

/// The registry entry of ResNet-9.
pub(crate) const RESNET9: ModelInfo = ModelInfo {
    name: "resnet9",
    summary: "SFL's ResNet-9 (BResidual): 64, 128+res, 256+res, 256, global max pool, fc without bias ×0.2; 2,440,256 parameters on 3×32×32; any C×H×W ≥ 8×8",
    batched: true,
    embedding: false,
    build: |cx| build(cx, Plan::resnet9, Init::Default, false),
};

/// The registry entry of ResNet-18.
pub(crate) const RESNET18: ModelInfo = ModelInfo {
    name: "resnet18",
    summary: "torchvision's ResNet-18 (FedAGHN): 7×7 stem, 8 basic blocks 64–512, avg pool, fc; 11.18M parameters on 3×32×32; any C×H×W ≥ 8×8",
    batched: true,
    embedding: false,
    build: |cx| build(cx, Plan::resnet18, Init::KaimingConvFanOut, true),
};

/// Smallest image side the ResNets take (three halvings leave a 1×1 map).
const MIN_SIDE: usize = 8;
/// ResNet-9's logit scale (SFL's `Mul(0.2)` after the head).
const RESNET9_SCALE: f32 = 0.2;

/// The weight initialisation of each reference.
#[derive(Clone, Copy, Debug)]
enum Init {
    /// PyTorch's defaults (SFL's ResNet-9).
    Default,
    /// FedDWA's `kaiming_normal_`: conv and linear weights ~ N(0, 2/fan_in).
    KaimingFanIn,
    /// torchvision: conv weights ~ N(0, 2/fan_out), fan_out = out·k·k.
    KaimingConvFanOut,
}

/// A residual network built for one input.
#[derive(Debug)]
struct ResNet {
    plan: Plan,
    image: [usize; 3],
    norms: Vec<(usize, usize)>,
    init: Init,
    /// Whether the head has a bias (all but ResNet-9's).
    head_bias: bool,
}

fn build(
    cx: &BuildCx,
    plan: fn(usize) -> Plan,
    init: Init,
    head_bias: bool,
) -> Result<Built, NnError> {
    let [c, h, w] = cx.image()?;
    if c == 0 || h < MIN_SIDE || w < MIN_SIDE {
        return Err(cx.bad("needs images of at least 8×8 with a channel"));
    }
    let plan = plan(c);
    let mut layout = ParamLayout::new();
    let mut norms = Vec::new();
    plan.push_layout(&mut layout, &mut norms);
    let head = vec![plan.channels(), cx.classes];
    if head_bias {
        layout.push_group("fc", &[("weight", head), ("bias", vec![cx.classes])]);
    } else {
        layout.push_group("fc", &[("weight", head)]);
    }
    Ok(Built {
        layout,
        batch_norms: norms.clone(),
        net: Arc::new(ResNet {
            plan,
            image: [c, h, w],
            norms,
            init,
            head_bias,
        }),
    })
}

impl Net for ResNet {
    fn features(&self, p: &[ParamTensor], x: Tensor<2>, norm: &mut Norm) -> Tensor<2> {
        self.plan
            .features(p, &self.norms, to_image(x, self.image), norm)
    }

    fn head(&self, p: &[ParamTensor], features: Tensor<2>) -> Tensor<2> {
        let k = p.len();
        if self.head_bias {
            linear(features, p[k - 2].t2(), Some(p[k - 1].t1()))
        } else {
            linear(features, p[k - 1].t2(), None) * RESNET9_SCALE
        }
    }

    fn feature_len(&self) -> usize {
        self.plan.channels()
    }

    fn draw(&self, _: &str, t: &TensorSpec, fan_in: usize) -> Draw {
        let weight = t.name.ends_with(".weight");
        match self.init {
            Init::KaimingFanIn if weight => Draw::Normal((2.0 / fan_in as f32).sqrt()),
            Init::KaimingConvFanOut if weight && t.shape.len() == 4 => {
                let fan_out = t.shape[0] * t.shape[2] * t.shape[3];
                Draw::Normal((2.0 / fan_out as f32).sqrt())
            }
            _ => Draw::Uniform(1.0 / (fan_in as f32).sqrt()),
        }
    }

    fn batched(&self) -> Result<&dyn Batched, String> {
        Ok(self)
    }

    /// The stages as layers, each basic block and Myrtle residual a
    /// `residual` entry whose inner names (`conv1`, `downsample.conv`) are
    /// relative to the block's (`layer1.0`): the state_dict keys are the
    /// layout's names.
    fn describe(&self, layout: &ParamLayout) -> Option<Vec<LayerDesc>> {
        let conv = |group: &str, name: &str, stride: usize, pad: usize| {
            conv_desc_with(layout, group, name, stride, pad)
        };
        let c_of = |group: &str| {
            layout
                .tensor(&format!("{group}.weight"))
                .map_or(0, |t| t.shape[0])
        };
        let mut list = Vec::new();
        for (name, stage) in &self.plan.stages {
            match *stage {
                Stage::ConvBn { stride, pad, .. } => {
                    let (cv, bn) = conv_bn_names(name);
                    list.extend([
                        conv(&cv, &cv, stride, pad),
                        bn_desc(&bn, c_of(&bn)),
                        LayerDesc::Relu,
                    ]);
                }
                Stage::MaxPool { k, stride, pad } => list.push(LayerDesc::MaxPool2d {
                    kernel_size: k,
                    stride,
                    padding: pad,
                }),
                Stage::Basic { cin, cout, stride } => {
                    let at = |part: &str| format!("{name}.{part}");
                    let shortcut = if stride != 1 || cin != cout {
                        vec![
                            conv(&at("downsample.conv"), "downsample.conv", stride, 0),
                            bn_desc("downsample.bn", cout),
                        ]
                    } else {
                        Vec::new()
                    };
                    list.push(LayerDesc::Residual {
                        name: name.clone(),
                        layers: vec![
                            conv(&at("conv1"), "conv1", stride, 1),
                            bn_desc("bn1", cout),
                            LayerDesc::Relu,
                            conv(&at("conv2"), "conv2", 1, 1),
                            bn_desc("bn2", cout),
                        ],
                        shortcut,
                    });
                    list.push(LayerDesc::Relu);
                }
                Stage::Residual { c } => {
                    let mut layers = Vec::new();
                    for r in ["res1", "res2"] {
                        layers.extend([
                            conv(&format!("{name}.{r}.conv"), &format!("{r}.conv"), 1, 1),
                            bn_desc(&format!("{r}.bn"), c),
                            LayerDesc::Relu,
                        ]);
                    }
                    list.push(LayerDesc::Residual {
                        name: name.clone(),
                        layers,
                        shortcut: Vec::new(),
                    });
                }
            }
        }
        list.push(match self.plan.pool {
            GlobalPool::Avg => LayerDesc::AdaptiveAvgPool2d { output_size: 1 },
            GlobalPool::Max => LayerDesc::AdaptiveMaxPool2d { output_size: 1 },
        });
        list.push(LayerDesc::Flatten);
        list.push(LayerDesc::Linear {
            name: "fc".into(),
            in_features: head_input(layout, self.head_bias),
            out_features: layout
                .tensors()
                .last()
                .map_or(0, |t| *t.shape.last().unwrap_or(&0)),
            bias: self.head_bias,
        });
        if !self.head_bias {
            list.push(LayerDesc::Scale {
                factor: f64::from(RESNET9_SCALE),
            });
        }
        Some(list)
    }
}

impl Batched for ResNet {
    fn input(&self) -> BatchedInput {
        BatchedInput::Image
    }

    /// The walk of [`Plan::features`] with grouped convolutions and
    /// per-client batch norm, then the head.
    fn forward(&self, cx: &mut BatchedCx, x: Tensor<3>) -> Tensor<3> {
        let k = cx.k;
        let mut x = cx.image(x, self.image);
        // Tensors in layout order: each conv's weight, then its batch
        // norm's scale and shift.
        let mut at = 0;
        let mut conv_bn =
            |cx: &mut BatchedCx, x: Tensor<4>, stride: usize, pad: usize, then_relu: bool| {
                let y = cx.stack.grouped_conv(x, at, None, stride, pad, 1);
                let y = cx.batch_norm_relu(y, at + 1, then_relu);
                at += 3;
                y
            };
        for (_, stage) in &self.plan.stages {
            x = match *stage {
                Stage::ConvBn { stride, pad, .. } => conv_bn(cx, x, stride, pad, true),
                Stage::MaxPool { k, stride, pad } => max_pool2d(x, max_pool(k, stride, pad)),
                Stage::Basic { cin, cout, stride } => {
                    let y = conv_bn(cx, x.clone(), stride, 1, true);
                    let y = conv_bn(cx, y, 1, 1, false);
                    let shortcut = if stride != 1 || cin != cout {
                        conv_bn(cx, x, stride, 0, false)
                    } else {
                        x
                    };
                    add_relu(y, shortcut)
                }
                Stage::Residual { .. } => {
                    let y = conv_bn(cx, x.clone(), 1, 1, true);
                    x + conv_bn(cx, y, 1, 1, true)
                }
            };
        }
        let [b, kc, _, _] = x.dims();
        let pooled = self.plan.pool.apply(x);
        // [B, K·C] to [K, B, C].
        let features = swap_leading(pooled.reshape([b, k, kc / k]));
        let last = cx.stack.leaves.len() - 1;
        if self.head_bias {
            cx.output_layer(features, last - 1)
        } else {
            features.matmul(cx.stack.lin_w(last)) * RESNET9_SCALE
        }
    }
}

/// The conv and batch-norm group names of a conv-BN stage.
fn conv_bn_names(name: &str) -> (String, String) {
    if name == "conv1" {
        ("conv1".to_string(), "bn1".to_string())
    } else {
        (format!("{name}.conv"), format!("{name}.bn"))
    }
}

/// k×k max pooling with stride and padding.
fn max_pool(k: usize, stride: usize, pad: usize) -> MaxPoolOptions<2> {
    MaxPoolOptions::new([k, k])
        .with_stride([stride, stride])
        .with_padding([pad, pad])
}

/// One step of a residual network's body.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Stage {
    /// A k×k convolution (no bias) with stride and padding, then batch norm
    /// and ReLU.
    ConvBn {
        cin: usize,
        cout: usize,
        k: usize,
        stride: usize,
        pad: usize,
    },
    /// k×k max pooling with stride and padding.
    MaxPool { k: usize, stride: usize, pad: usize },
    /// He et al.'s basic block: conv 3×3 (stride)–BN–ReLU–conv 3×3–BN, plus
    /// the input (identity, or conv 1×1 (stride)–BN when the shape changes),
    /// then ReLU.
    Basic {
        cin: usize,
        cout: usize,
        stride: usize,
    },
    /// Myrtle's residual: x + (conv-BN-ReLU ∘ conv-BN-ReLU)(x) at `c` channels.
    Residual { c: usize },
}

/// How the last feature map becomes the feature vector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum GlobalPool {
    /// Mean over the spatial positions (ResNet-8, ResNet-18).
    Avg,
    /// Max over the spatial positions (ResNet-9).
    Max,
}

impl GlobalPool {
    /// `[B, C, H, W]` to `[B, C, 1, 1]`.
    fn apply(self, x: Tensor<4>) -> Tensor<4> {
        match self {
            GlobalPool::Avg => x.mean_dims(&[2, 3]),
            GlobalPool::Max => x.max_dim(2).max_dim(3),
        }
    }
}

/// A residual network's body: named stages and the final pooling.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Plan {
    stages: Vec<(String, Stage)>,
    pool: GlobalPool,
}

impl Plan {
    /// FedDWA's ResNet-8 on `c` input channels.
    fn resnet8(c: usize) -> Self {
        Self {
            stages: vec![
                stem(c, 16, 3, 1, 1),
                pool("maxpool", 3, 2, 1),
                ("layer1.0".into(), basic(16, 16, 1)),
                ("layer2.0".into(), basic(16, 32, 2)),
                ("layer3.0".into(), basic(32, 64, 2)),
            ],
            pool: GlobalPool::Avg,
        }
    }

    /// SFL's ResNet-9 ("BResidual") on `c` input channels.
    fn resnet9(c: usize) -> Self {
        let conv = |cin, cout| Stage::ConvBn {
            cin,
            cout,
            k: 3,
            stride: 1,
            pad: 1,
        };
        Self {
            stages: vec![
                ("prep".into(), conv(c, 64)),
                ("layer1".into(), conv(64, 128)),
                pool("layer1.pool", 2, 2, 0),
                ("layer1.residual".into(), Stage::Residual { c: 128 }),
                ("layer2".into(), conv(128, 256)),
                pool("layer2.pool", 2, 2, 0),
                ("layer2.residual".into(), Stage::Residual { c: 256 }),
                ("layer3".into(), conv(256, 256)),
                pool("layer3.pool", 2, 2, 0),
            ],
            pool: GlobalPool::Max,
        }
    }

    /// torchvision's ResNet-18 on `c` input channels.
    fn resnet18(c: usize) -> Self {
        let mut stages = vec![stem(c, 64, 7, 2, 3), pool("maxpool", 3, 2, 1)];
        let mut cin = 64;
        for (layer, cout) in [64, 128, 256, 512].into_iter().enumerate() {
            for block in 0..2 {
                let stride = if layer > 0 && block == 0 { 2 } else { 1 };
                stages.push((
                    format!("layer{}.{block}", layer + 1),
                    basic(cin, cout, stride),
                ));
                cin = cout;
            }
        }
        Self {
            stages,
            pool: GlobalPool::Avg,
        }
    }

    /// Channels of the feature vector (the last stage's output).
    fn channels(&self) -> usize {
        self.stages
            .iter()
            .rev()
            .find_map(|(_, s)| match *s {
                Stage::ConvBn { cout, .. } | Stage::Basic { cout, .. } => Some(cout),
                Stage::Residual { c } => Some(c),
                Stage::MaxPool { .. } => None,
            })
            .expect("a plan has a convolution")
    }

    /// Appends the body's groups to `layout` and the batch-norm layers
    /// (channels, buffer offset) to `norms`.
    fn push_layout(&self, layout: &mut ParamLayout, norms: &mut Vec<(usize, usize)>) {
        let mut conv_bn = |name: &str, bn: &str, cin: usize, cout: usize, k: usize| {
            layout.push_group(name, &[("weight", vec![cout, cin, k, k])]);
            layout.push_group(bn, &[("weight", vec![cout]), ("bias", vec![cout])]);
            let at = norms.last().map_or(0, |&(c, at)| at + 2 * c);
            norms.push((cout, at));
        };
        for (name, stage) in &self.stages {
            match *stage {
                Stage::ConvBn { cin, cout, k, .. } => {
                    let (conv, bn) = conv_bn_names(name);
                    conv_bn(&conv, &bn, cin, cout, k);
                }
                Stage::MaxPool { .. } => {}
                Stage::Basic { cin, cout, stride } => {
                    conv_bn(
                        &format!("{name}.conv1"),
                        &format!("{name}.bn1"),
                        cin,
                        cout,
                        3,
                    );
                    conv_bn(
                        &format!("{name}.conv2"),
                        &format!("{name}.bn2"),
                        cout,
                        cout,
                        3,
                    );
                    if stride != 1 || cin != cout {
                        conv_bn(
                            &format!("{name}.downsample.conv"),
                            &format!("{name}.downsample.bn"),
                            cin,
                            cout,
                            1,
                        );
                    }
                }
                Stage::Residual { c } => {
                    for r in ["res1", "res2"] {
                        conv_bn(
                            &format!("{name}.{r}.conv"),
                            &format!("{name}.{r}.bn"),
                            c,
                            c,
                            3,
                        );
                    }
                }
            }
        }
    }

    /// The body's forward pass on `[batch, C, H, W]`: the pooled features
    /// `[batch, channels]`. `p` are the model's tensors in layout order (the
    /// body's come first).
    fn features(
        &self,
        p: &[ParamTensor],
        norms: &[(usize, usize)],
        x: Tensor<4>,
        norm: &mut Norm,
    ) -> Tensor<2> {
        let mut walk = Walk {
            p,
            norms,
            at: 0,
            bn: 0,
            norm,
        };
        let mut x = x;
        for (_, stage) in &self.stages {
            x = match *stage {
                Stage::ConvBn { stride, pad, .. } => walk.conv_bn(x, stride, pad, true),
                Stage::MaxPool { k, stride, pad } => max_pool2d(x, max_pool(k, stride, pad)),
                Stage::Basic { cin, cout, stride } => {
                    let y = walk.conv_bn(x.clone(), stride, 1, true);
                    let y = walk.conv_bn(y, 1, 1, false);
                    let shortcut = if stride != 1 || cin != cout {
                        walk.conv_bn(x, stride, 0, false)
                    } else {
                        x
                    };
                    add_relu(y, shortcut)
                }
                Stage::Residual { .. } => {
                    let y = walk.conv_bn(x.clone(), 1, 1, true);
                    x + walk.conv_bn(y, 1, 1, true)
                }
            };
        }
        let [b, c, _, _] = x.dims();
        self.pool.apply(x).reshape([b, c])
    }
}

fn stem(c: usize, cout: usize, k: usize, stride: usize, pad: usize) -> (String, Stage) {
    (
        "conv1".into(),
        Stage::ConvBn {
            cin: c,
            cout,
            k,
            stride,
            pad,
        },
    )
}

fn pool(name: &str, k: usize, stride: usize, pad: usize) -> (String, Stage) {
    (name.into(), Stage::MaxPool { k, stride, pad })
}

fn basic(cin: usize, cout: usize, stride: usize) -> Stage {
    Stage::Basic { cin, cout, stride }
}

/// A cursor over the body's tensors and batch-norm layers in layout order.
struct Walk<'a, 'n, 'b> {
    p: &'a [ParamTensor],
    norms: &'a [(usize, usize)],
    at: usize,
    bn: usize,
    norm: &'n mut Norm<'b>,
}

impl Walk<'_, '_, '_> {
    /// The next conv (weight) and batch norm (scale, shift), then ReLU if asked.
    fn conv_bn(&mut self, x: Tensor<4>, stride: usize, pad: usize, then_relu: bool) -> Tensor<4> {
        let w = self.p[self.at].t4();
        let options = ConvOptions::new([stride, stride], [pad, pad], [1, 1], 1);
        let y = conv2d(x, w, None, options);
        let (gamma, beta) = (&self.p[self.at + 1], &self.p[self.at + 2]);
        let (which, channels) = (self.bn, self.norms[self.bn]);
        let y = if then_relu {
            self.norm.apply_relu(which, channels, y, gamma, beta)
        } else {
            self.norm.apply(which, channels, y, gamma, beta)
        };
        self.at += 3;
        self.bn += 1;
        y
    }
}

#[cfg(test)]
mod tests {
    use crate::model::tests::check_gradient;
    use crate::{LocalData, ModelKind, ModelSpec};

    fn spec(kind: ModelKind, shape: &[usize]) -> ModelSpec {
        ModelSpec::new(kind, shape, 10).unwrap()
    }

    #[test]
    fn resnet_parameter_counts_match_the_reference_models() {
        // FedDWA's resnet8 = ResNet(BasicBlock, [1, 1, 1]) on 3×32×32, 10 classes:
        //   conv1 3·16·9 = 432, bn1 2·16 = 32                                 =    464
        //   layer1.0 2·(16·16·9) + 2·32                                       =  4,672
        //   layer2.0 16·32·9 + 32·32·9 + 1×1 shortcut 16·32 + 3 BN·64         = 14,528
        //   layer3.0 32·64·9 + 64·64·9 + 32·64 + 3·128                        = 57,728
        //   fc 64·10 + 10                                                     =    650
        assert_eq!(464 + 4_672 + 14_528 + 57_728 + 650, 78_042);
        let r8 = spec(ModelKind::RESNET8, &[3, 32, 32]);
        assert_eq!(r8.layout().len(), 78_042);
        // Buffers: running mean and variance of 16 + 2·16 + 3·32 + 3·64 = 336 channels.
        assert_eq!(r8.buffer_len(), 2 * 336);

        // SFL's BResidual: prep 3·64·9 + 128; layer1 64·128·9 + 256 and two
        // 128·128·9 + 256; layer2 128·256·9 + 512 and two 256·256·9 + 512;
        // layer3 256·256·9 + 512; linear 256·10 (no bias).
        let r9_parts = [
            1_728 + 128,
            73_728 + 256 + 2 * (147_456 + 256),
            294_912 + 512 + 2 * (589_824 + 512),
            589_824 + 512,
            2_560,
        ];
        assert_eq!(r9_parts.iter().sum::<usize>(), 2_440_256);
        let r9 = spec(ModelKind::RESNET9, &[3, 32, 32]);
        assert_eq!(r9.layout().len(), 2_440_256);
        assert_eq!(r9.buffer_len(), 2 * (64 + 3 * 128 + 4 * 256));

        // torchvision resnet18(num_classes=10): 11,689,512 with the
        // 1000-class head, minus 512·1000 + 1000, plus 512·10 + 10.
        //   conv1 3·64·49 + bn 128                  =      9,536
        //   layer1 2·(2·64·64·9 + 2·128)            =    147,968
        //   layer2 (64·128·9 + 128·128·9 + 64·128 + 3·256) + (2·128·128·9 + 2·256)
        //                                           =    525,568
        //   layer3 (same pattern, 128 → 256)        =  2,099,712
        //   layer4 (256 → 512)                      =  8,393,728
        //   fc 512·10 + 10                          =      5,130
        assert_eq!(11_689_512 - 513_000 + 5_130, 11_181_642);
        assert_eq!(
            9_536 + 147_968 + 525_568 + 2_099_712 + 8_393_728 + 5_130,
            11_181_642
        );
        let r18 = spec(ModelKind::RESNET18, &[3, 32, 32]);
        assert_eq!(r18.layout().len(), 11_181_642);
    }

    #[test]
    fn every_batch_norm_is_in_the_split_and_the_head_is_the_classifier() {
        let r18 = spec(ModelKind::RESNET18, &[3, 32, 32]);
        let split = r18.split();
        // stem + 8 blocks × 2 + 3 downsample shortcuts = 20 BN layers.
        assert_eq!(split.batch_norm.len(), 20);
        let bn_params: usize = split.batch_norm.iter().map(|r| r.len()).sum();
        assert_eq!(bn_params, r18.buffer_len(), "scale + shift per channel");
        assert_eq!(split.head.len(), 512 * 10 + 10);
        assert_eq!(split.base.end, split.head.start);
        assert_eq!(r18.feature_len(), 512);
        // ResNet-9's head has no bias.
        let r9 = spec(ModelKind::RESNET9, &[3, 32, 32]);
        assert_eq!(r9.split().head.len(), 256 * 10);
        assert_eq!(r9.feature_len(), 256);
    }

    #[test]
    fn resnets_adapt_to_the_input_and_reject_tiny_images() {
        // Tiny-ImageNet 3×64×64 and 1×28×28 only change the first conv.
        let tiny = spec(ModelKind::RESNET8, &[3, 64, 64]);
        assert_eq!(tiny.layout().len(), 78_042);
        let gray = spec(ModelKind::RESNET9, &[1, 28, 28]);
        assert_eq!(gray.layout().len(), 2_440_256 - 2 * 64 * 9);
        let err = ModelSpec::new(ModelKind::RESNET18, &[3, 4, 4], 10).unwrap_err();
        assert!(err.to_string().contains("8×8"), "{err}");
        assert!(ModelSpec::new(ModelKind::RESNET8, &[64], 10).is_err());
    }

    /// Two classes told apart by the sign of the image mean.
    fn two_class_images(n: usize, shape: [usize; 3]) -> (Vec<f32>, Vec<u32>) {
        use rand::Rng;
        let len: usize = shape.iter().product();
        let mut rng = fedweave_core::rng_stream(3, 0, 0, fedweave_core::Purpose::Dataset);
        let y: Vec<u32> = (0..n as u32).map(|i| i % 2).collect();
        let x = (0..n * len)
            .map(|i| 2.0 * y[i / len] as f32 - 1.0 + rng.random_range(-0.5f32..0.5))
            .collect();
        (x, y)
    }

    /// The ResNets' backward (convolutions, batch norm in training mode,
    /// shortcuts, pools) agrees with their forward: see
    /// [`check_gradient`]. (A loss that must fall after a few momentum
    /// steps on two images is luck, not a property: it held on one CPU and
    /// not on another.)
    #[test]
    fn resnet_gradients_match_the_loss() {
        for (kind, shape, n) in [
            (ModelKind::RESNET8, [3, 16, 16], 4),
            (ModelKind::RESNET9, [3, 16, 16], 4),
            // Four images: with two, ResNet-18's last stage normalises two
            // 1×1 maps per channel (outputs ±1 whatever the input), the
            // gradient reaches 4e5 and no finite step resolves the slope.
            (ModelKind::RESNET18, [3, 32, 32], 4),
        ] {
            let s = ModelSpec::new(kind, &shape, 2).unwrap();
            let (x, y) = two_class_images(n, shape);
            let idx: Vec<usize> = (0..n).collect();
            let (slope, loss, down) = check_gradient(&s, &LocalData::new(&x, &y, &idx), 1e-2);
            assert!(
                (slope - 1.0).abs() < 0.05,
                "{kind:?}: slope / |g| = {slope}"
            );
            assert!(down < loss, "{kind:?}: {loss} → {down}");
        }
    }
}
