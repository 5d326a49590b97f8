//! `sequential` models: a layer list equal to a built-in trains bit for
//! bit like it, trains batched to tolerance, and a list that does not fit
//! is a clean error naming the layer, never a panic.

use crate::batched::{compare_spec_on, epochs_cfg};
use fedweave_core::{Purpose, rng_stream};
use fedweave_nn::{
    Device, InputValues, LayerConfig, LocalData, ModelInput, ModelKind, ModelSpec, NnError,
    SequentialConfig, TrainConfig, Width, evaluate, predict, train_local,
};
use proptest::prelude::*;
use rand::Rng;

fn conv(out_channels: usize, kernel: usize) -> LayerConfig {
    LayerConfig::Conv2d {
        in_channels: None,
        out_channels,
        kernel,
        stride: 1,
        padding: 0,
        groups: 1,
        bias: true,
    }
}

fn pool(kernel: usize) -> LayerConfig {
    LayerConfig::MaxPool2d {
        kernel,
        stride: None,
        padding: 0,
    }
}

fn linear(out: Option<usize>) -> LayerConfig {
    LayerConfig::Linear {
        in_features: None,
        out_features: out.map(Width::Count),
        bias: true,
    }
}

fn input(layers: Vec<LayerConfig>, head: Option<usize>) -> ModelInput {
    ModelInput {
        sequential: Some(SequentialConfig { layers, head }),
        ..Default::default()
    }
}

fn sequential(shape: &[usize], classes: usize, layers: Vec<LayerConfig>) -> ModelSpec {
    ModelSpec::with_input(ModelKind::SEQUENTIAL, shape, classes, &input(layers, None)).unwrap()
}

/// The built-in `cnn` as a layer list.
fn cnn_layers() -> Vec<LayerConfig> {
    use LayerConfig::{Flatten, Relu};
    vec![
        conv(6, 5),
        Relu {},
        pool(2),
        conv(16, 5),
        Relu {},
        pool(2),
        Flatten {},
        linear(Some(120)),
        Relu {},
        linear(Some(84)),
        Relu {},
        linear(None),
    ]
}

/// The built-in `cnn-bn` as a layer list.
fn cnn_bn_layers() -> Vec<LayerConfig> {
    use LayerConfig::{BatchNorm, Flatten, Relu};
    vec![
        conv(32, 5),
        BatchNorm {},
        Relu {},
        pool(2),
        conv(64, 5),
        BatchNorm {},
        Relu {},
        pool(2),
        Flatten {},
        linear(Some(512)),
        Relu {},
        LayerConfig::Linear {
            in_features: None,
            out_features: Some(Width::Classes),
            bias: true,
        },
    ]
}

/// `n` random images of `shape` in `classes` classes.
fn images(n: usize, len: usize, classes: u32, seed: u64) -> (Vec<f32>, Vec<u32>) {
    let mut rng = rng_stream(seed, 0, 0, Purpose::Dataset);
    let y: Vec<u32> = (0..n).map(|_| rng.random_range(0..classes)).collect();
    let x = (0..n * len)
        .map(|i| y[i / len] as f32 * 0.3 + rng.random_range(-1.0f32..1.0))
        .collect();
    (x, y)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Same seed: same init, then three local rounds of momentum SGD with
/// weight decay, bit for bit (parameters, buffers, losses), and the same
/// split for the split methods.
fn trains_like(builtin: ModelKind, layers: Vec<LayerConfig>) {
    let shape = [1, 28, 28];
    let a = ModelSpec::new(builtin, &shape, 10).unwrap();
    let b = sequential(&shape, 10, layers);
    assert_eq!(a.layout().len(), b.layout().len());
    assert_eq!(a.buffer_len(), b.buffer_len());
    assert_eq!(a.feature_len(), b.feature_len());
    assert_eq!(a.split(), b.split(), "{builtin:?}");
    let init = |s: &ModelSpec| s.init(&mut rng_stream(5, 0, 0, Purpose::ModelInit));
    let (mut pa, mut pb) = (init(&a), init(&b));
    assert_eq!(bits(&pa), bits(&pb), "{builtin:?}: same init draws");
    let (mut ba, mut bb) = (a.init_buffers(), b.init_buffers());
    let (x, y) = images(24, 784, 10, 3);
    let idx: Vec<usize> = (0..24).collect();
    let data = LocalData::new(&x, &y, &idx);
    let cfg = TrainConfig {
        lr: 0.05,
        momentum: 0.9,
        weight_decay: 1e-3,
        batch_size: 8,
        iterations: 4,
        epochs: 0,
    };
    for round in 0..3 {
        let run = |spec: &ModelSpec, p: &mut Vec<f32>, buf: &mut Vec<f32>| {
            let mut rng = rng_stream(5, round, 0, Purpose::Batches);
            train_local(spec, p, buf, &data, &cfg, &[], &[], None, &mut rng).mean_loss
        };
        let la = run(&a, &mut pa, &mut ba);
        let lb = run(&b, &mut pb, &mut bb);
        assert_eq!(la.to_bits(), lb.to_bits(), "{builtin:?} round {round}");
    }
    assert_eq!(bits(&pa), bits(&pb), "{builtin:?}: parameters");
    assert_eq!(bits(&ba), bits(&bb), "{builtin:?}: running statistics");
    assert_ne!(pa, init(&a), "training moved the parameters");
    let (ea, eb) = (evaluate(&a, &pa, &ba, &data), evaluate(&b, &pb, &bb, &data));
    assert_eq!(ea.loss_sum.to_bits(), eb.loss_sum.to_bits());
    let (fa, fb) = (predict(&a, &pa, &ba, &data), predict(&b, &pb, &bb, &data));
    assert_eq!(bits(&fa.features), bits(&fb.features));
}

#[test]
fn a_layer_list_equal_to_cnn_trains_bit_identically() {
    trains_like(ModelKind::CNN, cnn_layers());
}

#[test]
fn a_layer_list_equal_to_cnn_bn_trains_bit_identically() {
    trains_like(ModelKind::CNN_BN, cnn_bn_layers());
}

/// Grouped, strided and padded convolutions, batch and group norm, a
/// residual block with a conv shortcut, average and adaptive pooling, GELU
/// and tanh, a bias-free linear layer: the batched path agrees with one
/// client at a time.
#[test]
fn a_sequential_model_trains_batched_to_tolerance() {
    use LayerConfig::{BatchNorm, Flatten, Gelu, Relu, Tanh};
    let layers = vec![
        LayerConfig::Conv2d {
            in_channels: Some(3),
            out_channels: 4,
            kernel: 3,
            stride: 1,
            padding: 1,
            groups: 1,
            bias: true,
        },
        BatchNorm {},
        Relu {},
        LayerConfig::Residual {
            layers: vec![
                LayerConfig::Conv2d {
                    in_channels: None,
                    out_channels: 8,
                    kernel: 3,
                    stride: 2,
                    padding: 1,
                    groups: 2,
                    bias: false,
                },
                LayerConfig::GroupNorm { groups: 2 },
                Gelu {},
            ],
            shortcut: vec![LayerConfig::Conv2d {
                in_channels: None,
                out_channels: 8,
                kernel: 1,
                stride: 2,
                padding: 0,
                groups: 1,
                bias: false,
            }],
        },
        LayerConfig::AvgPool2d {
            kernel: 2,
            stride: None,
            padding: 0,
        },
        LayerConfig::AdaptiveAvgPool2d { output: 2 },
        Flatten {},
        LayerConfig::Linear {
            in_features: None,
            out_features: Some(Width::Count(12)),
            bias: false,
        },
        Tanh {},
        linear(None),
    ];
    let spec = sequential(&[3, 12, 12], 4, layers);
    let (dp, db, moved) = compare_spec_on(&Device::flex(), &spec, &[20, 13, 8, 0], &epochs_cfg());
    assert!(moved > 1e-3, "training moved the parameters ({moved})");
    assert!(dp < 1e-5, "parameters differ by {dp:e} (relative)");
    assert!(db < 1e-5, "buffers differ by {db:e} (relative)");
    // A flat input: linear layers only, as the mlp.
    let mlp = sequential(&[12], 4, vec![linear(Some(16)), Relu {}, linear(None)]);
    let (dp, _, moved) = compare_spec_on(&Device::flex(), &mlp, &[20, 13, 8, 0], &epochs_cfg());
    assert!(moved > 1e-3 && dp < 1e-5, "mlp-like: {dp:e}, moved {moved}");
}

fn error(shape: &[usize], layers: Vec<LayerConfig>, head: Option<usize>) -> String {
    match ModelSpec::with_input(ModelKind::SEQUENTIAL, shape, 10, &input(layers, head)) {
        Err(e @ (NnError::BadLayer { .. } | NnError::BadInputShape { .. })) => e.to_string(),
        Err(e) => panic!("another error: {e}"),
        Ok(_) => panic!("the list was accepted"),
    }
}

#[test]
fn layer_lists_that_do_not_fit_name_the_layer_and_the_shapes() {
    use LayerConfig::{Flatten, Relu};
    // The cnn's list written for 3×32×32 (fc1 reads 16·5·5 = 400) on
    // 1×28×28, where it reads 16·4·4 = 256.
    let mut wrong = cnn_layers();
    wrong[7] = LayerConfig::Linear {
        in_features: Some(400),
        out_features: Some(Width::Count(120)),
        bias: true,
    };
    let e = error(&[1, 28, 28], wrong, None);
    assert_eq!(
        e,
        "model.layers[7] (linear): expects 400 input features, gets 256 from layers[6] output [256]"
    );
    // No linear layer to start the head, and no head given.
    let e = error(&[1, 16, 16], vec![conv(16, 5), pool(2), Flatten {}], None);
    assert!(
        e.starts_with("model.head") && e.contains("no linear layer"),
        "{e}"
    );
    // The output width does not match the classes.
    let e = error(
        &[1, 16, 16],
        vec![Flatten {}, linear(Some(7)), Relu {}, linear(Some(3))],
        None,
    );
    assert!(
        e.contains("model.layers") && e.contains("[3]") && e.contains("[10]"),
        "{e}"
    );
    // Kernel larger than the map, with the map and where it came from.
    let e = error(
        &[1, 8, 8],
        vec![conv(4, 5), conv(4, 5), Flatten {}, linear(None)],
        None,
    );
    assert!(
        e.contains("model.layers[1] (conv2d)")
            && e.contains("kernel 5 is larger than the 4×4 map")
            && e.contains("layers[0] output [4, 4, 4]"),
        "{e}"
    );
    // Conv on a flat input.
    let e = error(&[64], vec![conv(4, 3), Flatten {}, linear(None)], None);
    assert!(
        e.contains("model.layers[0] (conv2d)") && e.contains("gets [64] from the input"),
        "{e}"
    );
    // Linear on a map.
    let e = error(&[1, 8, 8], vec![conv(2, 3), linear(None)], None);
    assert!(
        e.contains("model.layers[1] (linear)") && e.contains("[2, 6, 6]") && e.contains("flatten"),
        "{e}"
    );
    // An empty input.
    assert!(error(&[0], vec![Flatten {}, linear(None)], None).contains("empty input"));
    // Empty list, head out of range, a missing width.
    assert!(error(&[4], vec![], None).contains("empty"));
    assert!(error(&[4], vec![linear(None)], Some(5)).contains("model.head"));
    let e = error(&[4], vec![linear(None), Relu {}, linear(None)], None);
    assert!(
        e.contains("model.layers[0] (linear)") && e.contains("out_features"),
        "{e}"
    );
    // A residual whose branches disagree.
    let res = LayerConfig::Residual {
        layers: vec![conv(3, 3)],
        shortcut: vec![],
    };
    let e = error(
        &[1, 8, 8],
        vec![res, Flatten {}, linear(Some(4)), linear(None)],
        None,
    );
    assert!(
        e.contains("model.layers[0] (residual)") && e.contains("[3, 6, 6]"),
        "{e}"
    );
    // A batch norm in the head.
    let e = error(
        &[1, 8, 8],
        vec![
            conv(2, 3),
            LayerConfig::BatchNorm {},
            Flatten {},
            linear(None),
        ],
        Some(1),
    );
    assert!(e.contains("model.head") && e.contains("batch_norm"), "{e}");
    // An embedding needs token ids.
    let e = error(
        &[6],
        vec![LayerConfig::Embedding { dim: 4 }, Flatten {}, linear(None)],
        None,
    );
    assert!(e.contains("model.layers[0] (embedding)"), "{e}");
}

/// Token inputs: embedding, a conv over the `len × dim` map, pooling.
#[test]
fn an_embedding_reads_token_ids() {
    use LayerConfig::{Flatten, Relu};
    let tokens = ModelInput {
        values: InputValues::Tokens { vocab: 9 },
        ..input(
            vec![
                LayerConfig::Embedding { dim: 4 },
                conv(3, 2),
                Relu {},
                LayerConfig::AdaptiveAvgPool2d { output: 1 },
                Flatten {},
                linear(None),
            ],
            None,
        )
    };
    let spec = ModelSpec::with_input(ModelKind::SEQUENTIAL, &[6], 2, &tokens).unwrap();
    assert_eq!(spec.layout().len(), 9 * 4 + 3 * 4 + 3 + 3 * 2 + 2);
    let x: Vec<f32> = (0..24).map(|i| (i % 9) as f32).collect();
    let y = vec![0, 1, 0, 1];
    let idx: Vec<usize> = (0..4).collect();
    let data = LocalData::new(&x, &y, &idx);
    let mut p = spec.init(&mut rng_stream(1, 0, 0, Purpose::ModelInit));
    let before = p.clone();
    let cfg = TrainConfig {
        lr: 0.1,
        momentum: 0.0,
        weight_decay: 0.0,
        batch_size: 4,
        iterations: 3,
        epochs: 0,
    };
    let mut rng = rng_stream(1, 1, 0, Purpose::Batches);
    train_local(
        &spec,
        &mut p,
        &mut [],
        &data,
        &cfg,
        &[],
        &[],
        None,
        &mut rng,
    );
    assert_ne!(p, before);
    assert!(
        fedweave_nn::BatchedTrainer::check(&spec).is_err(),
        "no batched embedding"
    );
}

/// Dropout: the identity in evaluation, a reproducible mask in training
/// that differs from no dropout.
#[test]
fn dropout_is_reproducible_in_training_and_the_identity_in_evaluation() {
    use LayerConfig::{Flatten, Relu};
    let with = |p: f64| {
        sequential(
            &[1, 6, 6],
            3,
            vec![
                Flatten {},
                linear(Some(16)),
                Relu {},
                LayerConfig::Dropout { p },
                linear(None),
            ],
        )
    };
    let (drop, none) = (with(0.5), with(0.0));
    assert!(drop.draws_in_training());
    let (x, y) = images(16, 36, 3, 4);
    let idx: Vec<usize> = (0..16).collect();
    let data = LocalData::new(&x, &y, &idx);
    let init = drop.init(&mut rng_stream(2, 0, 0, Purpose::ModelInit));
    let e1 = evaluate(&drop, &init, &[], &data);
    let e0 = evaluate(&none, &init, &[], &data);
    assert_eq!(
        e1.loss_sum.to_bits(),
        e0.loss_sum.to_bits(),
        "identity in evaluation"
    );
    let cfg = TrainConfig {
        lr: 0.1,
        momentum: 0.0,
        weight_decay: 0.0,
        batch_size: 8,
        iterations: 4,
        epochs: 0,
    };
    let train = |spec: &ModelSpec| {
        let mut p = init.clone();
        let mut rng = rng_stream(2, 1, 0, Purpose::Batches);
        train_local(spec, &mut p, &mut [], &data, &cfg, &[], &[], None, &mut rng);
        p
    };
    assert_eq!(bits(&train(&drop)), bits(&train(&drop)), "reproducible");
    assert_ne!(train(&drop), train(&none), "the mask drops units");
}

/// A random layer from a small alphabet.
fn any_layer() -> impl Strategy<Value = LayerConfig> {
    prop_oneof![
        (1usize..5, 1usize..4, 1usize..3, 0usize..2, 1usize..3).prop_map(|(o, k, s, p, g)| {
            LayerConfig::Conv2d {
                in_channels: None,
                out_channels: o * g,
                kernel: k,
                stride: s,
                padding: p,
                groups: g,
                bias: true,
            }
        }),
        Just(LayerConfig::BatchNorm {}),
        (1usize..3).prop_map(|groups| LayerConfig::GroupNorm { groups }),
        Just(LayerConfig::Relu {}),
        Just(LayerConfig::Tanh {}),
        (1usize..4, 0usize..2).prop_map(|(kernel, padding)| LayerConfig::MaxPool2d {
            kernel,
            stride: None,
            padding,
        }),
        (1usize..4).prop_map(|kernel| LayerConfig::AvgPool2d {
            kernel,
            stride: None,
            padding: 0,
        }),
        (1usize..3).prop_map(|output| LayerConfig::AdaptiveAvgPool2d { output }),
        Just(LayerConfig::Flatten {}),
        (0usize..8).prop_map(|o| LayerConfig::Linear {
            in_features: None,
            out_features: (o > 0).then_some(Width::Count(o)),
            bias: o % 2 == 0,
        }),
        (1usize..4).prop_map(|dim| LayerConfig::Embedding { dim }),
        prop::collection::vec(
            prop_oneof![
                Just(LayerConfig::Relu {}),
                (1usize..4).prop_map(|o| conv(o, 1)),
            ],
            1..3
        )
        .prop_map(|layers| LayerConfig::Residual {
            layers,
            shortcut: vec![],
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Any layer list on any small input is a clean error or a model whose
    /// forward gives `[batch, classes]` and whose split covers the layout.
    #[test]
    fn a_random_layer_list_is_an_error_or_a_working_model(
        layers in prop::collection::vec(any_layer(), 0..7),
        image in any::<bool>(),
        side in 1usize..7,
        head in prop::option::of(0usize..8),
    ) {
        let shape = if image { vec![2, side, side] } else { vec![side * 3] };
        let classes = 3;
        match ModelSpec::with_input(ModelKind::SEQUENTIAL, &shape, classes, &input(layers, head)) {
            Err(NnError::BadLayer { at, .. }) => prop_assert!(at.starts_with("model.")),
            Err(e) => prop_assert!(matches!(e, NnError::BadInputShape { .. }), "{e}"),
            Ok(spec) => {
                let split = spec.split();
                prop_assert_eq!(split.head.end, spec.layout().len());
                prop_assert!(!split.head.is_empty());
                let n = 3;
                let len = spec.input_len();
                let x: Vec<f32> = (0..n * len).map(|i| (i % 5) as f32 * 0.1).collect();
                let y = vec![0u32, 1, 2];
                let idx: Vec<usize> = (0..n).collect();
                let data = LocalData::new(&x, &y, &idx);
                let p = spec.init(&mut rng_stream(3, 0, 0, Purpose::ModelInit));
                let out = predict(&spec, &p, &spec.init_buffers(), &data);
                prop_assert_eq!(out.logits.len(), n * classes);
                prop_assert_eq!(out.features.len(), n * spec.feature_len());
            }
        }
    }
}
