//! `textcnn`: Kim's TextCNN as in pFedGraph's code: embedding (`[model]
//! embed_dim`, default 256), filters of widths 3/4/5 × 100 maps, ReLU, max
//! over time (300 features), linear head. Token inputs only; ids arrive as
//! f32 features (exact below 2²⁴) and are cast to integers here.

use super::{BuildCx, Built, Draw, LayerDesc, ModelInfo, Net};
use crate::NnError;
use crate::kernels::conv2d;
use crate::model::{InputValues, Norm, ParamTensor, TEXTCNN_EMBED_DIM};
use burn::tensor::activation::relu;
use burn::tensor::module::embedding;
use burn::tensor::ops::ConvOptions;
use burn::tensor::{Int, Tensor};
use fedweave_core::{ParamLayout, TensorSpec};

/// The registry entry.
pub(crate) const INFO: ModelInfo = ModelInfo {
    name: "textcnn",
    summary: "TextCNN (pFedGraph): embedding embed_dim (256), conv widths 3/4/5 × 100, ReLU, max over time, fc; token datasets (yahoo-answers, shakespeare)",
    batched: false,
    embedding: true,
    build,
};

/// Filter widths of Kim's TextCNN as pFedGraph's code sets them.
pub(crate) const TEXTCNN_WIDTHS: [usize; 3] = [3, 4, 5];
/// Feature maps per filter width (pFedGraph: 100).
pub(crate) const TEXTCNN_MAPS: usize = 100;
/// Bound of the initial embeddings, U(−0.1, 0.1) (pFedGraph).
const INIT_BOUND: f32 = 0.1;

#[derive(Debug)]
struct TextCnn;

fn build(cx: &BuildCx) -> Result<Built, NnError> {
    let [len] = <[usize; 1]>::try_from(cx.input_shape)
        .map_err(|_| cx.bad("needs a sequence of token ids"))?;
    let InputValues::Tokens { vocab } = cx.input.values else {
        return Err(cx.bad("reads token ids; use a text dataset (yahoo-answers, shakespeare)"));
    };
    if len < TEXTCNN_WIDTHS[TEXTCNN_WIDTHS.len() - 1] {
        return Err(cx.bad("sequences must be at least 5 tokens (the widest filter)"));
    }
    let dim = cx.embed_dim(TEXTCNN_EMBED_DIM)?;
    // `embedding` `[vocab, dim]`, then one conv per width (`[maps, 1,
    // width, dim]` + bias, PyTorch's `Conv2d(1, maps, (width, dim))`).
    let mut layout = ParamLayout::new();
    layout.push_group("embedding", &[("weight", vec![vocab, dim])]);
    for w in TEXTCNN_WIDTHS {
        layout.push_group(
            &format!("convs.{w}"),
            &[
                ("weight", vec![TEXTCNN_MAPS, 1, w, dim]),
                ("bias", vec![TEXTCNN_MAPS]),
            ],
        );
    }
    let features = TEXTCNN_MAPS * TEXTCNN_WIDTHS.len();
    layout.push_group(
        "fc",
        &[
            ("weight", vec![features, cx.classes]),
            ("bias", vec![cx.classes]),
        ],
    );
    Ok(Built::plain(layout, TextCnn))
}

impl Net for TextCnn {
    /// Embeds the `[batch, len]` ids, runs every width's convolution over
    /// the whole embedding, ReLU, and takes the maximum over time of each
    /// map: `[batch, 3·maps]`.
    fn features(&self, p: &[ParamTensor], x: Tensor<2>, _: &mut Norm) -> Tensor<2> {
        let [b, len] = x.dims();
        let emb = embedding(p[0].t2(), ids(x));
        let [_, _, dim] = emb.dims();
        let emb: Tensor<4> = emb.reshape([b, 1, len, dim]);
        let pooled: Vec<Tensor<2>> = TEXTCNN_WIDTHS
            .iter()
            .enumerate()
            .map(|(i, _)| {
                let y = relu(conv2d(
                    emb.clone(),
                    p[1 + 2 * i].t4(),
                    Some(p[2 + 2 * i].t1()),
                    ConvOptions::new([1, 1], [0, 0], [1, 1], 1),
                ));
                y.max_dim(2).reshape([b, TEXTCNN_MAPS])
            })
            .collect();
        Tensor::cat(pooled, 1)
    }

    fn feature_len(&self) -> usize {
        TEXTCNN_MAPS * TEXTCNN_WIDTHS.len()
    }

    fn draw(&self, group: &str, _: &TensorSpec, fan_in: usize) -> Draw {
        match group {
            "embedding" => Draw::Uniform(INIT_BOUND),
            _ => Draw::Uniform(1.0 / (fan_in as f32).sqrt()),
        }
    }

    fn describe(&self, _: &ParamLayout) -> Option<Vec<LayerDesc>> {
        None
    }
}

/// Integer ids from f32 features (exact: every id is below 2²⁴).
pub(crate) fn ids(x: Tensor<2>) -> Tensor<2, Int> {
    x.detach().int()
}
