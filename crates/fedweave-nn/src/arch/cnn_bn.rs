//! `cnn-bn`: FedAGHN's "4-layer CNN with BN" (PFLlib `FedAvgCNN` plus batch
//! norm): conv 5×5→32, BN, ReLU, pool; conv 5×5→64, BN, ReLU, pool; fc 512;
//! fc classes. Its running statistics are local buffers. `cnn-dwa`
//! (`cnn_dwa.rs`) is the same layout with 3×3 kernels and batch norm after
//! the pool; both run the [`ConvBnFc`] below.

use super::cnn::{conv, pool, two_conv_side};
use super::{
    Batched, BatchedInput, BuildCx, Built, LayerDesc, ModelInfo, Net, bn_desc, conv_desc,
    linear_desc, pool2_desc,
};
use crate::NnError;
use crate::batched::BatchedCx;
use crate::kernels::linear_relu;
use crate::kernels::{conv2d, max_pool2d, on_cpu, relu_max_pool2d};
use crate::model::{Norm, ParamTensor, flatten, to_image};
use burn::tensor::Tensor;
use fedweave_core::ParamLayout;
use std::sync::Arc;

/// The registry entry.
pub(crate) const INFO: ModelInfo = ModelInfo {
    name: "cnn-bn",
    summary: "FedAGHN's 4-layer CNN: conv5×5→32, BN, pool, conv5×5→64, BN, pool, fc512, fc; C×28×28 or C×32×32; BN statistics stay local",
    batched: true,
    embedding: false,
    build,
};

/// Width of the hidden fully connected layer.
const FC: usize = 512;

/// Two conv + BN blocks and two fully connected layers.
#[derive(Debug)]
pub(crate) struct ConvBnFc {
    image: [usize; 3],
    /// FedDWA's order (conv, ReLU, pool, BN) rather than conv, BN, ReLU,
    /// pool.
    bn_after_pool: bool,
}

fn build(cx: &BuildCx) -> Result<Built, NnError> {
    build_conv_bn_fc(cx, 5, false)
}

/// The layout shared by `cnn-bn` (`k` = 5) and `cnn-dwa` (`k` = 3): conv
/// 32, BN, conv 64, BN, fc 512, fc classes.
pub(crate) fn build_conv_bn_fc(
    cx: &BuildCx,
    k: usize,
    bn_after_pool: bool,
) -> Result<Built, NnError> {
    let (image, s) = two_conv_side(cx, k)?;
    let c = image[0];
    let mut layout = ParamLayout::new();
    layout
        .push_group(
            "conv1",
            &[("weight", vec![32, c, k, k]), ("bias", vec![32])],
        )
        .push_group("bn1", &[("weight", vec![32]), ("bias", vec![32])])
        .push_group(
            "conv2",
            &[("weight", vec![64, 32, k, k]), ("bias", vec![64])],
        )
        .push_group("bn2", &[("weight", vec![64]), ("bias", vec![64])])
        .push_group(
            "fc1",
            &[("weight", vec![64 * s * s, FC]), ("bias", vec![FC])],
        )
        .push_group(
            "fc",
            &[("weight", vec![FC, cx.classes]), ("bias", vec![cx.classes])],
        );
    Ok(Built {
        layout,
        batch_norms: vec![(32, 0), (64, 64)],
        net: Arc::new(ConvBnFc {
            image,
            bn_after_pool,
        }),
    })
}

impl Net for ConvBnFc {
    fn features(&self, p: &[ParamTensor], x: Tensor<2>, norm: &mut Norm) -> Tensor<2> {
        let mut y = to_image(x, self.image);
        for (i, (at, bn)) in [(0, (32, 0)), (4, (64, 64))].into_iter().enumerate() {
            let z = conv2d(y, p[at].t4(), Some(p[at + 1].t1()), conv());
            y = if self.bn_after_pool {
                let z = relu_max_pool2d(z, pool());
                norm.apply(i, bn, z, &p[at + 2], &p[at + 3])
            } else if on_cpu(&z) {
                max_pool2d(norm.apply_relu(i, bn, z, &p[at + 2], &p[at + 3]), pool())
            } else {
                // One kernel each way for the ReLU and the pooling together.
                relu_max_pool2d(norm.apply(i, bn, z, &p[at + 2], &p[at + 3]), pool())
            };
        }
        linear_relu(flatten(y), p[8].t2(), p[9].t1())
    }

    fn feature_len(&self) -> usize {
        FC
    }

    fn batched(&self) -> Result<&dyn Batched, String> {
        Ok(self)
    }

    fn describe(&self, layout: &ParamLayout) -> Option<Vec<LayerDesc>> {
        let mut list = Vec::new();
        for (conv, bn, c) in [("conv1", "bn1", 32), ("conv2", "bn2", 64)] {
            list.push(conv_desc(layout, conv));
            if self.bn_after_pool {
                list.extend([LayerDesc::Relu, pool2_desc(), bn_desc(bn, c)]);
            } else {
                list.extend([bn_desc(bn, c), LayerDesc::Relu, pool2_desc()]);
            }
        }
        list.extend([
            LayerDesc::Flatten,
            linear_desc(layout, "fc1"),
            LayerDesc::Relu,
            linear_desc(layout, "fc"),
        ]);
        Some(list)
    }
}

impl Batched for ConvBnFc {
    fn input(&self) -> BatchedInput {
        BatchedInput::Image
    }

    fn forward(&self, cx: &mut BatchedCx, x: Tensor<3>) -> Tensor<3> {
        let mut y = cx.image(x, self.image);
        for at in [0, 4] {
            y = if self.bn_after_pool {
                let z = relu_max_pool2d(cx.stack.conv(y, at), pool());
                cx.batch_norm(z, at + 2)
            } else {
                relu_max_pool2d(cx.conv_batch_norm(y, at, at + 2), pool())
            };
        }
        let y = cx.stack.linear_relu(cx.flatten(y), 8);
        cx.output_layer(y, 10)
    }
}
