//! `mf`: biased matrix factorisation for ratings: user and item embeddings
//! (`[model] embed_dim`, default 32) and biases; the head reads
//! [u ⊙ v, b_u, b_i]. Categorical (user, item) inputs only; trained on MSE.

use super::textcnn::ids;
use super::{BuildCx, Built, Draw, LayerDesc, ModelInfo, Net};
use crate::NnError;
use crate::model::{InputValues, MF_EMBED_DIM, Norm, ParamTensor, RegressionLoss};
use burn::tensor::module::embedding;
use burn::tensor::{Int, Tensor};
use fedweave_core::{ParamLayout, TensorSpec};

/// The registry entry.
pub(crate) const INFO: ModelInfo = ModelInfo {
    name: "mf",
    summary: "biased matrix factorisation: user/item embeddings (embed_dim 32) and biases, trained on MSE; categorical datasets (movielens-100k)",
    batched: false,
    embedding: true,
    build,
};

/// Std of the initial embeddings and biases, N(0, 0.1²).
const INIT_STD: f32 = 0.1;

#[derive(Debug)]
struct Mf {
    dim: usize,
}

fn build(cx: &BuildCx) -> Result<Built, NnError> {
    let InputValues::Categorical { cardinalities } = &cx.input.values else {
        return Err(cx.bad("reads (user, item) ids; use a ratings dataset (movielens-100k)"));
    };
    let &[users, items] = cardinalities.as_slice() else {
        return Err(cx.bad("needs exactly two categorical ids: user, item"));
    };
    let dim = cx.embed_dim(MF_EMBED_DIM)?;
    // Per user and per item an embedding row and a bias (`[count, dim]`,
    // `[count, 1]`).
    let mut layout = ParamLayout::new();
    for (name, n) in [("user", users), ("item", items)] {
        layout.push_group(name, &[("embedding", vec![n, dim]), ("bias", vec![n, 1])]);
    }
    layout.push_group(
        "fc",
        &[
            ("weight", vec![dim + 2, cx.classes]),
            ("bias", vec![cx.classes]),
        ],
    );
    Ok(Built::plain(layout, Mf { dim }))
}

impl Net for Mf {
    /// The element-wise product of the user's and the item's embeddings,
    /// then the user's and the item's biases: `[batch, dim + 2]`. With the
    /// head's weights at 1 the prediction is biased MF, ⟨u, v⟩ + b_u + b_i + b.
    fn features(&self, p: &[ParamTensor], x: Tensor<2>, _: &mut Norm) -> Tensor<2> {
        let [b, _] = x.dims();
        let user = ids(x.clone().narrow(1, 0, 1));
        let item = ids(x.narrow(1, 1, 1));
        let row = |table: &ParamTensor, idx: Tensor<2, Int>| {
            let t = embedding(table.t2(), idx);
            let [_, _, d] = t.dims();
            t.reshape([b, d])
        };
        let (u, bu) = (row(&p[0], user.clone()), row(&p[1], user));
        let (v, bi) = (row(&p[2], item.clone()), row(&p[3], item));
        Tensor::cat(vec![u * v, bu, bi], 1)
    }

    fn feature_len(&self) -> usize {
        self.dim + 2
    }

    /// Embeddings and biases ~ N(0, 0.1²); head weights 1 and bias 0 (plain
    /// biased MF at the start).
    fn draw(&self, group: &str, tensor: &TensorSpec, _: usize) -> Draw {
        match group {
            "fc" if tensor.name.ends_with(".weight") => Draw::Fill(1.0),
            "fc" => Draw::Fill(0.0),
            _ => Draw::Normal(INIT_STD),
        }
    }

    fn describe(&self, _: &ParamLayout) -> Option<Vec<LayerDesc>> {
        None
    }

    fn regression_loss(&self) -> RegressionLoss {
        RegressionLoss::Mse
    }
}
