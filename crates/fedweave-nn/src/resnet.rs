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

use crate::model::{Norm, ParamTensor};
use burn::tensor::Tensor;
use burn::tensor::activation::relu;
use burn::tensor::module::{conv2d, max_pool2d};
use burn::tensor::ops::{ConvOptions, MaxPoolOptions};
use fedweave_core::ParamLayout;

/// One step of a residual network's body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Stage {
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
pub(crate) enum GlobalPool {
    /// Mean over the spatial positions (ResNet-8, ResNet-18).
    Avg,
    /// Max over the spatial positions (ResNet-9).
    Max,
}

/// A residual network's body: named stages and the final pooling.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    pub stages: Vec<(String, Stage)>,
    pub pool: GlobalPool,
}

impl Plan {
    /// FedDWA's ResNet-8 on `c` input channels.
    pub fn resnet8(c: usize) -> Self {
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
    pub fn resnet9(c: usize) -> Self {
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
    pub fn resnet18(c: usize) -> Self {
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
    pub fn channels(&self) -> usize {
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
    pub fn push_layout(&self, layout: &mut ParamLayout, norms: &mut Vec<(usize, usize)>) {
        let mut conv_bn = |name: &str, bn: &str, cin: usize, cout: usize, k: usize| {
            layout.push_group(name, &[("weight", vec![cout, cin, k, k])]);
            layout.push_group(bn, &[("weight", vec![cout]), ("bias", vec![cout])]);
            let at = norms.last().map_or(0, |&(c, at)| at + 2 * c);
            norms.push((cout, at));
        };
        for (name, stage) in &self.stages {
            match *stage {
                Stage::ConvBn { cin, cout, k, .. } => {
                    let (conv, bn) = if name == "conv1" {
                        ("conv1".to_string(), "bn1".to_string())
                    } else {
                        (format!("{name}.conv"), format!("{name}.bn"))
                    };
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
    pub fn features(
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
                Stage::MaxPool { k, stride, pad } => max_pool2d(
                    x,
                    MaxPoolOptions::new([k, k])
                        .with_stride([stride, stride])
                        .with_padding([pad, pad]),
                ),
                Stage::Basic { cin, cout, stride } => {
                    let y = walk.conv_bn(x.clone(), stride, 1, true);
                    let y = walk.conv_bn(y, 1, 1, false);
                    let shortcut = if stride != 1 || cin != cout {
                        walk.conv_bn(x, stride, 0, false)
                    } else {
                        x
                    };
                    relu(y + shortcut)
                }
                Stage::Residual { .. } => {
                    let y = walk.conv_bn(x.clone(), 1, 1, true);
                    x + walk.conv_bn(y, 1, 1, true)
                }
            };
        }
        let [b, c, _, _] = x.dims();
        let pooled = match self.pool {
            GlobalPool::Avg => x.mean_dims(&[2, 3]),
            GlobalPool::Max => x.max_dim(2).max_dim(3),
        };
        pooled.reshape([b, c])
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
        let y = self.norm.apply(
            self.bn,
            self.norms[self.bn],
            y,
            &self.p[self.at + 1],
            &self.p[self.at + 2],
        );
        self.at += 3;
        self.bn += 1;
        if then_relu { relu(y) } else { y }
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
        let r8 = spec(ModelKind::ResNet8, &[3, 32, 32]);
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
        let r9 = spec(ModelKind::ResNet9, &[3, 32, 32]);
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
        let r18 = spec(ModelKind::ResNet18, &[3, 32, 32]);
        assert_eq!(r18.layout().len(), 11_181_642);
    }

    #[test]
    fn every_batch_norm_is_in_the_split_and_the_head_is_the_classifier() {
        let r18 = spec(ModelKind::ResNet18, &[3, 32, 32]);
        let split = r18.split();
        // stem + 8 blocks × 2 + 3 downsample shortcuts = 20 BN layers.
        assert_eq!(split.batch_norm.len(), 20);
        let bn_params: usize = split.batch_norm.iter().map(|r| r.len()).sum();
        assert_eq!(bn_params, r18.buffer_len(), "scale + shift per channel");
        assert_eq!(split.head.len(), 512 * 10 + 10);
        assert_eq!(split.base.end, split.head.start);
        assert_eq!(r18.feature_len(), 512);
        // ResNet-9's head has no bias.
        let r9 = spec(ModelKind::ResNet9, &[3, 32, 32]);
        assert_eq!(r9.split().head.len(), 256 * 10);
        assert_eq!(r9.feature_len(), 256);
    }

    #[test]
    fn resnets_adapt_to_the_input_and_reject_tiny_images() {
        // Tiny-ImageNet 3×64×64 and 1×28×28 only change the first conv.
        let tiny = spec(ModelKind::ResNet8, &[3, 64, 64]);
        assert_eq!(tiny.layout().len(), 78_042);
        let gray = spec(ModelKind::ResNet9, &[1, 28, 28]);
        assert_eq!(gray.layout().len(), 2_440_256 - 2 * 64 * 9);
        let err = ModelSpec::new(ModelKind::ResNet18, &[3, 4, 4], 10).unwrap_err();
        assert!(err.to_string().contains("8×8"), "{err}");
        assert!(ModelSpec::new(ModelKind::ResNet8, &[64], 10).is_err());
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
            (ModelKind::ResNet8, [3, 16, 16], 4),
            (ModelKind::ResNet9, [3, 16, 16], 4),
            // Four images: with two, ResNet-18's last stage normalises two
            // 1×1 maps per channel (outputs ±1 whatever the input), the
            // gradient reaches 4e5 and no finite step resolves the slope.
            (ModelKind::ResNet18, [3, 32, 32], 4),
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
