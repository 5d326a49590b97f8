//! Tests of the embedding models, `textcnn` and `mf`.

use crate::arch::textcnn::{TEXTCNN_MAPS, TEXTCNN_WIDTHS};
use crate::model::{
    Norm,
    tests::{check_gradient, first_and_later_loss},
};
use crate::{InputValues, LocalData, ModelInput, ModelKind, ModelSpec};
use burn::tensor::{Device, Tensor, TensorData};

fn tokens(vocab: usize, embed_dim: Option<usize>) -> ModelInput {
    ModelInput {
        values: InputValues::Tokens { vocab },
        embed_dim,
        ..Default::default()
    }
}

fn forward(spec: &ModelSpec, p: &[f32], x: &[f32], batch: usize) -> Vec<f32> {
    let device = Device::flex();
    let tensors = spec.tensors(p, &device);
    let x = Tensor::<2>::from_data(
        TensorData::new(x.to_vec(), [batch, spec.input_len()]),
        &device,
    );
    spec.forward(&tensors, x, &mut Norm::Running(&[]))
        .into_data()
        .try_to_vec::<f32>()
        .unwrap()
}

#[test]
fn textcnn_matches_pfedgraphs_model() {
    // pFedGraph's TextCNN with a 1,000-token vocabulary, 10 classes:
    //   embedding 1000·256                       = 256,000
    //   convs (3 + 4 + 5)·100·256 + 3·100 biases = 307,500
    //   fc 300·10 + 10                           =   3,010
    assert_eq!(256_000 + 307_500 + 3_010, 566_510);
    let spec = ModelSpec::with_input(ModelKind::TEXTCNN, &[256], 10, &tokens(1000, None)).unwrap();
    assert_eq!(spec.layout().len(), 566_510);
    assert_eq!(spec.feature_len(), 300);
    let wide =
        ModelSpec::with_input(ModelKind::TEXTCNN, &[256], 10, &tokens(1000, Some(300))).unwrap();
    assert_eq!(
        wide.layout().len(),
        1000 * 300 + 12 * 100 * 300 + 300 + 3_010
    );
}

#[test]
fn textcnn_forward_is_max_over_time_of_relu_convolutions() {
    let (vocab, dim, len) = (7, 3, 6);
    let spec =
        ModelSpec::with_input(ModelKind::TEXTCNN, &[len], 2, &tokens(vocab, Some(dim))).unwrap();
    let p = spec.init(&mut fedweave_core::rng_stream(
        5,
        0,
        0,
        fedweave_core::Purpose::ModelInit,
    ));
    let x = [1.0f32, 6.0, 0.0, 3.0, 3.0, 2.0];
    let out = forward(&spec, &p, &x, 1);
    let t = |name: &str| &p[spec.layout().tensor(name).unwrap().range()];
    let emb = t("embedding.weight");
    let row = |pos: usize, k: usize| f64::from(emb[x[pos] as usize * dim + k]);
    let mut features = Vec::new();
    for w in TEXTCNN_WIDTHS {
        let (wt, b) = (
            t(&format!("convs.{w}.weight")),
            t(&format!("convs.{w}.bias")),
        );
        for m in 0..TEXTCNN_MAPS {
            let best = (0..=len - w)
                .map(|s| {
                    let mut z = f64::from(b[m]);
                    for i in 0..w {
                        for k in 0..dim {
                            z += f64::from(wt[(m * w + i) * dim + k]) * row(s + i, k);
                        }
                    }
                    z.max(0.0)
                })
                .fold(f64::NEG_INFINITY, f64::max);
            features.push(best);
        }
    }
    let (fw, fb) = (t("fc.weight"), t("fc.bias"));
    for o in 0..2 {
        let want = f64::from(fb[o])
            + features
                .iter()
                .enumerate()
                .map(|(j, f)| f * f64::from(fw[j * 2 + o]))
                .sum::<f64>();
        assert!(
            (f64::from(out[o]) - want).abs() < 1e-4,
            "{} vs {want}",
            out[o]
        );
    }
}

#[test]
fn textcnn_gradient_matches_its_loss_and_it_needs_tokens() {
    // Class 1 sequences hold token 5, class 0 sequences token 2.
    let y: Vec<u32> = vec![0, 1, 0, 1];
    let x: Vec<f32> = y
        .iter()
        .flat_map(|&c| {
            let t = if c == 1 { 5.0 } else { 2.0 };
            [1.0, t, 3.0, t, 4.0, 0.0, 0.0, 0.0]
        })
        .collect();
    let spec = ModelSpec::with_input(ModelKind::TEXTCNN, &[8], 2, &tokens(8, Some(16))).unwrap();
    let idx: Vec<usize> = (0..4).collect();
    // Max-over-time pooling has kinks: a smaller step stays on one piece.
    let (slope, loss, down) = check_gradient(&spec, &LocalData::new(&x, &y, &idx), 1e-3);
    assert!((slope - 1.0).abs() < 0.05, "slope / |g| = {slope}");
    assert!(down < loss, "{loss} → {down}");
    let err = ModelSpec::new(ModelKind::TEXTCNN, &[8], 2).unwrap_err();
    assert!(err.to_string().contains("token ids"), "{err}");
    let short = ModelSpec::with_input(ModelKind::TEXTCNN, &[4], 2, &tokens(8, None));
    assert!(short.unwrap_err().to_string().contains("at least 5"));
}

fn ratings(users: usize, items: usize, dim: Option<usize>) -> ModelInput {
    ModelInput {
        values: InputValues::Categorical {
            cardinalities: vec![users, items],
        },
        embed_dim: dim,
        ..Default::default()
    }
}

#[test]
fn mf_starts_as_biased_matrix_factorisation() {
    let (users, items, k) = (4, 5, 3);
    let spec =
        ModelSpec::with_input(ModelKind::MF, &[2], 1, &ratings(users, items, Some(k))).unwrap();
    // users·(k + 1) + items·(k + 1) + head (k + 2)·1 + 1.
    assert_eq!(spec.layout().len(), 4 * 4 + 5 * 4 + 5 + 1);
    assert_eq!(spec.split().head.len(), k + 2 + 1);
    let p = spec.init(&mut fedweave_core::rng_stream(
        6,
        0,
        0,
        fedweave_core::Purpose::ModelInit,
    ));
    let t = |name: &str| &p[spec.layout().tensor(name).unwrap().range()];
    let (u, bu, v, bi) = (
        t("user.embedding"),
        t("user.bias"),
        t("item.embedding"),
        t("item.bias"),
    );
    let pairs = [(0usize, 4usize), (3, 1), (2, 2)];
    let x: Vec<f32> = pairs
        .iter()
        .flat_map(|&(a, b)| [a as f32, b as f32])
        .collect();
    let out = forward(&spec, &p, &x, pairs.len());
    for (o, &(a, b)) in out.iter().zip(&pairs) {
        let dot: f32 = (0..k).map(|j| u[a * k + j] * v[b * k + j]).sum();
        let want = dot + bu[a] + bi[b];
        assert!((o - want).abs() < 1e-6, "{o} vs {want}");
    }
    let err = ModelSpec::new(ModelKind::MF, &[2], 1).unwrap_err();
    assert!(err.to_string().contains("(user, item)"), "{err}");
}

#[test]
fn mf_fits_a_rank_one_rating_matrix_on_squared_error() {
    assert_eq!(
        ModelSpec::with_input(ModelKind::MF, &[2], 1, &ratings(2, 2, None))
            .unwrap()
            .regression_loss(),
        crate::RegressionLoss::Mse
    );
    let (users, items) = (4, 5);
    let (a, b) = ([1.0f32, -0.5, 0.8, -1.2], [0.9f32, -1.0, 0.3, 1.1, -0.4]);
    let mut x = Vec::new();
    let mut targets = Vec::new();
    for (i, ai) in a.iter().enumerate() {
        for (j, bj) in b.iter().enumerate() {
            x.extend([i as f32, j as f32]);
            targets.push(ai * bj);
        }
    }
    let spec =
        ModelSpec::with_input(ModelKind::MF, &[2], 1, &ratings(users, items, Some(4))).unwrap();
    let idx: Vec<usize> = (0..users * items).collect();
    let data = LocalData::forecasting(&x, &targets, 1, (0.0, 1.0), &idx);
    let (first, later) = first_and_later_loss(&spec, &data, 0.05, 200);
    assert!(later < 0.5 * first, "{first} → {later}");
}
