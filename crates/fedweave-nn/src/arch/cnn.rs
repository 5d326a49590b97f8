//! `cnn`: pFedGraph/DPFL's SimpleCNN (LeNet-5 style): conv 5×5→6, pool,
//! conv 5×5→16, pool, fc 120, fc 84, fc classes.

use super::{
    Batched, BatchedInput, BuildCx, Built, LayerDesc, ModelInfo, Net, conv_desc, linear_desc,
    pool2_desc,
};
use crate::NnError;
use crate::batched::BatchedCx;
use crate::kernels::linear_relu;
use crate::kernels::{conv2d, relu_max_pool2d};
use crate::model::{Norm, ParamTensor, flatten, to_image};
use burn::tensor::Tensor;
use burn::tensor::ops::{ConvOptions, MaxPoolOptions};
use fedweave_core::ParamLayout;

/// The registry entry.
pub(crate) const INFO: ModelInfo = ModelInfo {
    name: "cnn",
    summary: "SimpleCNN of pFedGraph/DPFL: conv5×5→6, pool, conv5×5→16, pool, fc120, fc84, fc; C×28×28 or C×32×32",
    batched: true,
    embedding: false,
    build,
};

#[derive(Debug)]
struct Cnn {
    image: [usize; 3],
}

/// The side of the last feature map of two `k`×`k` convs, each followed
/// by a 2×2 pool, on a 28×28 or 32×32 image.
pub(crate) fn two_conv_side(cx: &BuildCx, k: usize) -> Result<([usize; 3], usize), NnError> {
    let [c, h, w] = cx.image()?;
    if h != w || (h != 28 && h != 32) {
        return Err(cx.bad("needs 28×28 or 32×32 images"));
    }
    Ok(([c, h, w], ((h - (k - 1)) / 2 - (k - 1)) / 2))
}

fn build(cx: &BuildCx) -> Result<Built, NnError> {
    let ([c, h, w], s) = two_conv_side(cx, 5)?;
    let mut layout = ParamLayout::new();
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
            &[("weight", vec![84, cx.classes]), ("bias", vec![cx.classes])],
        );
    Ok(Built::plain(layout, Cnn { image: [c, h, w] }))
}

/// Stride 1, no padding, one group.
pub(crate) fn conv() -> ConvOptions<2> {
    ConvOptions::new([1, 1], [0, 0], [1, 1], 1)
}

/// 2×2 max pooling of stride 2.
pub(crate) fn pool() -> MaxPoolOptions<2> {
    MaxPoolOptions::new([2, 2])
}

impl Net for Cnn {
    fn features(&self, p: &[ParamTensor], x: Tensor<2>, _: &mut Norm) -> Tensor<2> {
        let x = to_image(x, self.image);
        let y = relu_max_pool2d(conv2d(x, p[0].t4(), Some(p[1].t1()), conv()), pool());
        let y = relu_max_pool2d(conv2d(y, p[2].t4(), Some(p[3].t1()), conv()), pool());
        let y = flatten(y);
        let y = linear_relu(y, p[4].t2(), p[5].t1());
        linear_relu(y, p[6].t2(), p[7].t1())
    }

    fn feature_len(&self) -> usize {
        84
    }

    fn batched(&self) -> Result<&dyn Batched, String> {
        Ok(self)
    }

    fn describe(&self, layout: &ParamLayout) -> Option<Vec<LayerDesc>> {
        Some(vec![
            conv_desc(layout, "conv1"),
            LayerDesc::Relu,
            pool2_desc(),
            conv_desc(layout, "conv2"),
            LayerDesc::Relu,
            pool2_desc(),
            LayerDesc::Flatten,
            linear_desc(layout, "fc1"),
            LayerDesc::Relu,
            linear_desc(layout, "fc2"),
            LayerDesc::Relu,
            linear_desc(layout, "fc3"),
        ])
    }
}

impl Batched for Cnn {
    fn input(&self) -> BatchedInput {
        BatchedInput::Image
    }

    fn forward(&self, cx: &mut BatchedCx, x: Tensor<3>) -> Tensor<3> {
        let x = cx.image(x, self.image);
        let p = &cx.stack;
        let y = relu_max_pool2d(p.conv(x, 0), pool());
        let y = relu_max_pool2d(p.conv(y, 2), pool());
        let y = p.linear_relu(cx.flatten(y), 4);
        let y = p.linear_relu(y, 6);
        cx.output_layer(y, 8)
    }
}
