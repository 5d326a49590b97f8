//! Many clients at once: `train_local_batched` equals K separate
//! `train_local` calls to floating-point tolerance, for every architecture
//! with a batched formulation, with clients of different sizes (padded last
//! batches, different step counts in epoch mode, one client without data).

use fedweave_core::{Purpose, rng_stream};
use fedweave_nn::{
    BatchedClient, BatchedTrainer, Device, LocalData, ModelKind, ModelSpec, NnError, SgdConfig,
    TrainConfig, train_local, train_local_batched,
};
use rand::Rng;

/// A client's own random classification data.
struct Data {
    x: Vec<f32>,
    y: Vec<u32>,
    idx: Vec<usize>,
}

impl Data {
    fn new(n: usize, input_len: usize, classes: u32, seed: u64) -> Self {
        let mut rng = rng_stream(seed, 0, 0, Purpose::Dataset);
        Self {
            x: (0..n * input_len)
                .map(|_| rng.random_range(-1.0f32..1.0))
                .collect(),
            y: (0..n).map(|_| rng.random_range(0..classes)).collect(),
            idx: (0..n).collect(),
        }
    }
    fn view(&self) -> LocalData<'_> {
        LocalData::new(&self.x, &self.y, &self.idx)
    }
}

/// Largest |a − b| relative to the largest |b|.
pub(crate) fn rel_max_diff(a: &[f32], b: &[f32]) -> f64 {
    let scale = b.iter().fold(0.0f64, |m, x| m.max(f64::from(x.abs())));
    let diff = a
        .iter()
        .zip(b)
        .fold(0.0f64, |m, (x, y)| m.max(f64::from((x - y).abs())));
    diff / scale.max(1e-12)
}

/// Trains `sizes.len()` clients (different data, different initial models)
/// one at a time and batched, both on `device`; returns the worst relative
/// difference of parameters and of buffers, and how far training moved the
/// parameters.
pub(crate) fn compare_on(
    device: &Device,
    kind: ModelKind,
    shape: &[usize],
    sizes: &[usize],
    cfg: &TrainConfig,
) -> (f64, f64, f64) {
    let spec = ModelSpec::new(kind, shape, 4).unwrap();
    compare_spec_on(device, &spec, sizes, cfg)
}

/// [`compare_on`] for a built `spec` (4 classes).
pub(crate) fn compare_spec_on(
    device: &Device,
    spec: &ModelSpec,
    sizes: &[usize],
    cfg: &TrainConfig,
) -> (f64, f64, f64) {
    let classes = spec.num_classes();
    let spec = spec.clone().on(device.clone());
    let data: Vec<Data> = sizes
        .iter()
        .enumerate()
        .map(|(c, &n)| Data::new(n, spec.input_len(), classes as u32, 100 + c as u64))
        .collect();
    let inits: Vec<Vec<f32>> = (0..sizes.len())
        .map(|c| spec.init(&mut rng_stream(7, c as u64, 0, Purpose::ModelInit)))
        .collect();
    let rng = |c: usize| rng_stream(9, c as u64, 0, Purpose::Batches);

    let mut want = inits.clone();
    let mut want_buf = vec![spec.init_buffers(); sizes.len()];
    let mut want_stats = Vec::new();
    for c in 0..sizes.len() {
        want_stats.push(train_local(
            &spec,
            &mut want[c],
            &mut want_buf[c],
            &data[c].view(),
            cfg,
            &[],
            &[],
            None,
            &mut rng(c),
        ));
    }

    let mut got = inits.clone();
    let mut got_buf = vec![spec.init_buffers(); sizes.len()];
    let mut rngs: Vec<_> = (0..sizes.len()).map(rng).collect();
    let mut clients: Vec<BatchedClient<_>> = got
        .iter_mut()
        .zip(got_buf.iter_mut())
        .zip(rngs.iter_mut())
        .zip(&data)
        .map(|(((params, buffers), rng), d)| BatchedClient {
            params,
            buffers,
            data: d.view(),
            rng,
        })
        .collect();
    let stats = train_local_batched(&spec, device, &mut clients, cfg).unwrap();
    drop(clients);

    let (mut dp, mut db, mut moved) = (0.0f64, 0.0f64, f64::INFINITY);
    for c in 0..sizes.len() {
        assert_eq!(stats[c].steps, want_stats[c].steps, "client {c} steps");
        assert_eq!(
            stats[c].samples, want_stats[c].samples,
            "client {c} samples"
        );
        let loss_diff = (stats[c].mean_loss - want_stats[c].mean_loss).abs();
        assert!(
            loss_diff <= 1e-4 * want_stats[c].mean_loss.abs().max(1e-3),
            "client {c}: loss {} vs {}",
            stats[c].mean_loss,
            want_stats[c].mean_loss
        );
        dp = dp.max(rel_max_diff(&got[c], &want[c]));
        db = db.max(rel_max_diff(&got_buf[c], &want_buf[c]));
        if sizes[c] > 0 {
            moved = moved.min(rel_max_diff(&want[c], &inits[c]));
        } else {
            assert_eq!(got[c], inits[c], "a client without data is untouched");
        }
    }
    (dp, db, moved)
}

/// [`compare_on`] on the CPU.
fn compare(
    kind: ModelKind,
    shape: &[usize],
    sizes: &[usize],
    cfg: &TrainConfig,
) -> (f64, f64, f64) {
    compare_on(&Device::flex(), kind, shape, sizes, cfg)
}

pub(crate) fn epochs_cfg() -> TrainConfig {
    TrainConfig {
        lr: 0.05,
        momentum: 0.9,
        weight_decay: 1e-3,
        batch_size: 8,
        iterations: 0,
        epochs: 2,
    }
}

fn check(kind: ModelKind, shape: &[usize]) {
    check_with(kind, shape, &epochs_cfg());
}

fn check_with(kind: ModelKind, shape: &[usize], cfg: &TrainConfig) {
    // Sizes 20, 13, 8 in batches of 8: steps 6, 4, 2 (epoch mode, 2
    // epochs), last batches of 4 and 5 samples; the fourth client has no
    // data.
    let (dp, db, moved) = compare(kind, shape, &[20, 13, 8, 0], cfg);
    assert!(
        moved > 1e-3,
        "{kind:?}: training moved the parameters ({moved})"
    );
    // Measured (Zen 4): mlp 0 (bit-identical), cnn 8e-8, cnn-bn 2e-7,
    // cnn-dwa 1e-7, resnet8 1.7e-7, resnet9 1.2e-7; (Zen 3) cnn-bn 2.5e-7,
    // cnn-dwa 1.2e-7, resnet8 2.3e-7, resnet9 (one epoch) 5.2e-7.
    assert!(
        dp < 1e-5,
        "{kind:?}: parameters differ by {dp:e} (relative)"
    );
    assert!(db < 1e-5, "{kind:?}: buffers differ by {db:e} (relative)");
}

#[test]
fn batched_mlp_matches_one_client_at_a_time() {
    check(ModelKind::MLP, &[12]);
}

#[test]
fn batched_cnn_matches_one_client_at_a_time() {
    check(ModelKind::CNN, &[1, 28, 28]);
}

#[test]
fn batched_cnn_bn_matches_one_client_at_a_time() {
    check(ModelKind::CNN_BN, &[1, 28, 28]);
}

#[test]
fn batched_cnn_dwa_matches_one_client_at_a_time() {
    check(ModelKind::CNN_DWA, &[3, 32, 32]);
}

/// He et al.'s basic blocks (strided 3×3 and 1×1 shortcut convolutions,
/// padding), a 3×3 max pool of stride 2 and the global average pool.
#[test]
fn batched_resnet8_matches_one_client_at_a_time() {
    check(ModelKind::RESNET8, &[3, 32, 32]);
}

/// Myrtle's residuals, 2×2 pools, the global max pool and the bias-free
/// head scaled by 0.2, over one epoch (steps 3, 2, 1; the same partial
/// batches). At this input size ReLU leaves many exact ties in the max
/// pools, and a last-bit difference that moves an argmax sends a gradient
/// elsewhere: the two orders of summation drift apart chaotically with more
/// steps and by CPU (two epochs: 1.2e-7 on Zen 4, 8.6e-5 on Zen 3; six
/// iterations 1.9e-3 on Zen 3), one epoch stays near rounding (5.2e-7).
#[test]
fn batched_resnet9_matches_one_client_at_a_time() {
    let one_epoch = TrainConfig {
        epochs: 1,
        ..epochs_cfg()
    };
    check_with(ModelKind::RESNET9, &[1, 16, 16], &one_epoch);
}

#[test]
fn fixed_iterations_cycle_passes_of_different_lengths() {
    let cfg = TrainConfig {
        iterations: 5,
        epochs: 0,
        ..epochs_cfg()
    };
    let (dp, _, moved) = compare(ModelKind::MLP, &[12], &[11, 30, 5], &cfg);
    assert!(moved > 1e-3);
    assert!(dp < 1e-4, "parameters differ by {dp:e}");
}

#[test]
fn unsupported_models_and_bad_inputs_are_typed_errors() {
    let gru = ModelSpec::new(ModelKind::GRU, &[4, 2], 1).unwrap();
    let p = vec![0.0f32; gru.layout().len()];
    let err = BatchedTrainer::new(&gru, &Device::flex(), &[&p], &[&[]], SgdConfig::default());
    assert!(matches!(err, Err(NnError::NotBatched { .. })));
    let mlp = ModelSpec::new(ModelKind::MLP, &[3], 2).unwrap();
    let short = vec![0.0f32; 5];
    let err = BatchedTrainer::new(
        &mlp,
        &Device::flex(),
        &[&short],
        &[&[]],
        SgdConfig::default(),
    );
    assert!(matches!(err, Err(NnError::NotBatched { .. })));
    let none = BatchedTrainer::new(&mlp, &Device::flex(), &[], &[], SgdConfig::default());
    assert!(matches!(none, Err(NnError::NotBatched { .. })));
}

/// A step that gathers its inputs on the device from the clients' resident
/// samples trains exactly what the host's gather trains (both only copy):
/// clients as index sets of one shared table (two of them the same set,
/// whose rows are shared), batches of different sizes, a client sitting
/// steps out, both input layouts (an image model's `[B, K, ·]` and the mlp's
/// `[K, B, ·]`); a step whose client reads other samples takes the host's
/// gather.
#[test]
fn device_resident_features_train_bit_identically() {
    for (kind, shape) in [
        (ModelKind::CNN_BN, &[1, 28, 28][..]),
        (ModelKind::MLP, &[12][..]),
    ] {
        let spec = ModelSpec::new(kind, shape, 4).unwrap();
        let shared = Data::new(40, spec.input_len(), 4, 31);
        let other = Data::new(9, spec.input_len(), 4, 32);
        // Clients 0 and 2 read the same samples.
        let subsets: [Vec<usize>; 2] = [(13..20).collect(), (20..40).rev().collect()];
        let views: Vec<LocalData> = [1, 0, 1]
            .iter()
            .map(|&i| LocalData::new(&shared.x, &shared.y, &subsets[i]))
            .collect();
        let inits: Vec<Vec<f32>> = (0..3)
            .map(|c| spec.init(&mut rng_stream(5, c, 0, Purpose::ModelInit)))
            .collect();
        let params: Vec<&[f32]> = inits.iter().map(Vec::as_slice).collect();
        let buffers = vec![spec.init_buffers(); 3];
        let buffers: Vec<&[f32]> = buffers.iter().map(Vec::as_slice).collect();
        let sgd = SgdConfig {
            momentum: 0.9,
            weight_decay: 1e-3,
        };
        let new = || BatchedTrainer::new(&spec, &Device::flex(), &params, &buffers, sgd).unwrap();
        let (mut host, mut resident) = (new(), new());
        resident.keep_samples_on_device(&views);
        let steps: [[&[usize]; 3]; 4] = [
            [&[0, 1, 2, 3], &[0, 1, 2], &[5, 6]],
            [&[4, 5], &[], &[0, 3, 1]],
            [&[6, 0, 19], &[6, 2, 5], &[2]],
            [&[], &[3, 4], &[4, 5, 6]],
        ];
        for (t, batches) in steps.iter().enumerate() {
            let step: Vec<(LocalData, &[usize])> =
                views.iter().copied().zip(batches.iter().copied()).collect();
            host.step(&step, 0.05);
            resident.step(&step, 0.05);
            if t == 2 {
                // Other samples for client 0: this step gathers on the host.
                let mut step = step;
                step[0] = (other.view(), &[0, 8]);
                host.step(&step, 0.05);
                resident.step(&step, 0.05);
            }
        }
        assert_eq!(
            host.take_losses(),
            resident.take_losses(),
            "{kind:?}: losses"
        );
        for (c, init) in inits.iter().enumerate() {
            let (mut p1, mut b1) = (init.clone(), spec.init_buffers());
            let (mut p2, mut b2) = (p1.clone(), b1.clone());
            host.store(c, &mut p1, &mut b1);
            resident.store(c, &mut p2, &mut b2);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&p1), bits(&p2), "{kind:?}: client {c}'s parameters");
            assert_eq!(bits(&b1), bits(&b2), "{kind:?}: client {c}'s buffers");
            assert_ne!(&p1, init, "{kind:?}: client {c} trained");
        }
    }
}
