//! `gru`: SFL's "pure RNN with 64 hidden": a GRU over the input sequence
//! (`[steps, features]`) and a linear head from the last hidden state to
//! the forecast horizon.

use super::{BuildCx, Built, Draw, LayerDesc, ModelInfo, Net};
use crate::NnError;
use crate::model::{Norm, ParamTensor};
use burn::tensor::Tensor;
use burn::tensor::activation::{sigmoid, tanh};
use burn::tensor::module::linear;
use fedweave_core::{ParamLayout, TensorSpec};

/// The registry entry.
pub(crate) const INFO: ModelInfo = ModelInfo {
    name: "gru",
    summary: "GRU with 64 hidden units + linear head to the horizon (SFL's forecasting RNN); input steps×features",
    batched: false,
    embedding: false,
    build,
};

/// Hidden units (SFL: "pure RNN with 64 hidden").
pub(crate) const GRU_HIDDEN: usize = 64;

#[derive(Debug)]
struct Gru {
    steps: usize,
    features: usize,
}

fn build(cx: &BuildCx) -> Result<Built, NnError> {
    let [steps, features] = <[usize; 2]>::try_from(cx.input_shape)
        .map_err(|_| cx.bad("needs a steps×features sequence input"))?;
    if steps == 0 || features == 0 {
        return Err(cx.bad("empty sequence"));
    }
    let g = 3 * GRU_HIDDEN;
    let mut layout = ParamLayout::new();
    layout
        .push_group(
            "gru",
            &[
                ("weight_ih", vec![features, g]),
                ("weight_hh", vec![GRU_HIDDEN, g]),
                ("bias_ih", vec![g]),
                ("bias_hh", vec![g]),
            ],
        )
        .push_group(
            "head",
            &[
                ("weight", vec![GRU_HIDDEN, cx.classes]),
                ("bias", vec![cx.classes]),
            ],
        );
    Ok(Built::plain(layout, Gru { steps, features }))
}

impl Net for Gru {
    /// PyTorch's GRU cell (gates ordered r, z, n) unrolled over the steps;
    /// the last hidden state is the feature vector. The input projections
    /// of all steps are one matrix product.
    fn features(&self, p: &[ParamTensor], x: Tensor<2>, _: &mut Norm) -> Tensor<2> {
        let [batch, _] = x.dims();
        let (steps, features) = (self.steps, self.features);
        let (hd, g) = (GRU_HIDDEN, 3 * GRU_HIDDEN);
        let gx: Tensor<3> = linear(
            x.reshape([batch * steps, features]),
            p[0].t2(),
            Some(p[2].t1()),
        )
        .reshape([batch, steps, g]);
        let mut h: Tensor<2> = Tensor::zeros([batch, hd], &gx.device());
        for t in 0..steps {
            let gx_t: Tensor<2> = gx.clone().narrow(1, t, 1).reshape([batch, g]);
            let gh = linear(h.clone(), p[1].t2(), Some(p[3].t1()));
            let r = sigmoid(gx_t.clone().narrow(1, 0, hd) + gh.clone().narrow(1, 0, hd));
            let z = sigmoid(gx_t.clone().narrow(1, hd, hd) + gh.clone().narrow(1, hd, hd));
            let n = tanh(gx_t.narrow(1, 2 * hd, hd) + r * gh.narrow(1, 2 * hd, hd));
            // h' = (1 − z)·n + z·h = n + z·(h − n)
            h = n.clone() + z * (h - n);
        }
        h
    }

    fn feature_len(&self) -> usize {
        GRU_HIDDEN
    }

    /// `nn.GRU`'s U(−1/√hidden, 1/√hidden) for the recurrent weights.
    fn draw(&self, group: &str, _: &TensorSpec, fan_in: usize) -> Draw {
        let fan_in = if group == "gru" { GRU_HIDDEN } else { fan_in };
        Draw::Uniform(1.0 / (fan_in as f32).sqrt())
    }

    fn describe(&self, _: &ParamLayout) -> Option<Vec<LayerDesc>> {
        None
    }
}
