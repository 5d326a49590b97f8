//! `mlp`: input → 200 → 200 → classes with ReLU (FedAvg's MNIST MLP).

use super::{Batched, BatchedInput, BuildCx, Built, LayerDesc, ModelInfo, Net, linear_desc};
use crate::NnError;
use crate::batched::BatchedCx;
use crate::kernels::linear_relu;
use crate::model::{Norm, ParamTensor};
use burn::tensor::Tensor;
use fedweave_core::ParamLayout;

/// The registry entry.
pub(crate) const INFO: ModelInfo = ModelInfo {
    name: "mlp",
    summary: "input → 200 → 200 → classes, ReLU; any input shape",
    batched: true,
    embedding: false,
    build,
};

const HIDDEN: usize = 200;

#[derive(Debug)]
struct Mlp;

fn build(cx: &BuildCx) -> Result<Built, NnError> {
    let d: usize = cx.input_shape.iter().product();
    if d == 0 {
        return Err(cx.bad("empty input"));
    }
    let mut layout = ParamLayout::new();
    layout
        .push_group(
            "fc1",
            &[("weight", vec![d, HIDDEN]), ("bias", vec![HIDDEN])],
        )
        .push_group(
            "fc2",
            &[("weight", vec![HIDDEN, HIDDEN]), ("bias", vec![HIDDEN])],
        )
        .push_group(
            "fc3",
            &[
                ("weight", vec![HIDDEN, cx.classes]),
                ("bias", vec![cx.classes]),
            ],
        );
    Ok(Built::plain(layout, Mlp))
}

impl Net for Mlp {
    fn features(&self, p: &[ParamTensor], x: Tensor<2>, _: &mut Norm) -> Tensor<2> {
        let h = linear_relu(x, p[0].t2(), p[1].t1());
        linear_relu(h, p[2].t2(), p[3].t1())
    }

    fn feature_len(&self) -> usize {
        HIDDEN
    }

    fn batched(&self) -> Result<&dyn Batched, String> {
        Ok(self)
    }

    fn describe(&self, layout: &ParamLayout) -> Option<Vec<LayerDesc>> {
        Some(vec![
            LayerDesc::Flatten,
            linear_desc(layout, "fc1"),
            LayerDesc::Relu,
            linear_desc(layout, "fc2"),
            LayerDesc::Relu,
            linear_desc(layout, "fc3"),
        ])
    }
}

impl Batched for Mlp {
    fn input(&self) -> BatchedInput {
        BatchedInput::Flat
    }

    fn forward(&self, cx: &mut BatchedCx, x: Tensor<3>) -> Tensor<3> {
        let p = &cx.stack;
        let h = p.linear_relu(x, 0);
        let h = p.linear_relu(h, 2);
        cx.output_layer(h, 4)
    }
}
