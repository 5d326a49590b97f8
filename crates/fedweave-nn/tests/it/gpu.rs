//! The GPU code paths on a real GPU backend: built only with `--features
//! wgpu` or `--features cuda`, and they expect the backend's device to work
//! (a GPU, or a software Vulkan device such as Mesa's lavapipe for wgpu).
//! CI builds neither feature; run them with
//! `cargo test -p fedweave-nn --features wgpu --test it gpu`.
//!
//! What they pin: training on the GPU ends where training on the CPU ends,
//! the batched trainer on the GPU equals one client at a time on the GPU,
//! the extra terms' tensor form on the GPU trains as the host form on the
//! CPU, and the server kernels either run on the device within their bounds
//! or are refused for lack of `f64`.

use crate::batched::{compare_on, epochs_cfg, rel_max_diff};
use fedweave_core::pairwise::{Kernels, SQ_DIST_REL_TOL, View};
use fedweave_core::{Purpose, rng_stream};
use fedweave_nn::{
    Backend, BatchSampler, BurnOffload, Device, ExtraLoss, LocalData, LocalTrainer, ModelKind,
    ModelSpec, NnError, Proximal, TrainConfig, train_local,
};
use rand::Rng;
use std::sync::Arc;

/// The GPU backend this build has (CUDA first), and its device.
fn gpu() -> (Backend, Device) {
    for backend in [Backend::Cuda, Backend::Wgpu] {
        if backend.available() {
            let device = backend
                .device()
                .unwrap_or_else(|e| panic!("the {} device does not work: {e}", backend.name()));
            return (backend, device);
        }
    }
    unreachable!("this module is built only with a GPU feature")
}

fn data(n: usize, input_len: usize, seed: u64) -> (Vec<f32>, Vec<u32>, Vec<usize>) {
    let mut rng = rng_stream(seed, 0, 0, Purpose::Dataset);
    (
        (0..n * input_len)
            .map(|_| rng.random_range(-1.0f32..1.0))
            .collect(),
        (0..n).map(|_| rng.random_range(0..4)).collect(),
        (0..n).collect(),
    )
}

#[test]
fn training_on_the_gpu_ends_where_the_cpu_ends() {
    let (_, device) = gpu();
    for (kind, shape) in [
        (ModelKind::CNN, vec![1, 28, 28]),
        (ModelKind::CNN_BN, vec![1, 28, 28]),
        (ModelKind::RESNET8, vec![3, 32, 32]),
    ] {
        let cpu = ModelSpec::new(kind, &shape, 4).unwrap();
        let on_gpu = cpu.clone().on(device.clone());
        let (x, y, idx) = data(24, cpu.input_len(), 5);
        let local = LocalData::new(&x, &y, &idx);
        let init = cpu.init(&mut rng_stream(1, 0, 0, Purpose::ModelInit));
        let cfg = epochs_cfg();
        let run = |spec: &ModelSpec| {
            let (mut p, mut b) = (init.clone(), spec.init_buffers());
            let mut rng = rng_stream(2, 0, 0, Purpose::Batches);
            let stats = train_local(spec, &mut p, &mut b, &local, &cfg, &[], &[], None, &mut rng);
            (p, b, stats.mean_loss)
        };
        let (pc, bc, lc) = run(&cpu);
        let (pg, bg, lg) = run(&on_gpu);
        assert!(rel_max_diff(&pc, &init) > 1e-3, "{kind:?}: training moved");
        let dp = rel_max_diff(&pg, &pc);
        eprintln!("{kind:?}: GPU vs CPU parameters {dp:e}, loss {lg} vs {lc}");
        assert!(dp < 1e-4, "{kind:?}: parameters differ by {dp:e}");
        assert!(rel_max_diff(&bg, &bc) < 1e-4, "{kind:?}: buffers");
        assert!(
            (lg - lc).abs() < 1e-4 * lc.abs().max(1.0),
            "{kind:?}: {lg} vs {lc}"
        );
    }
}

#[test]
fn batched_training_on_the_gpu_matches_one_client_at_a_time() {
    let (_, device) = gpu();
    for (kind, shape) in [
        (ModelKind::MLP, vec![12]),
        (ModelKind::CNN, vec![1, 28, 28]),
        (ModelKind::CNN_BN, vec![1, 28, 28]),
        (ModelKind::RESNET8, vec![3, 32, 32]),
    ] {
        let (dp, db, moved) = compare_on(&device, kind, &shape, &[20, 13, 8, 0], &epochs_cfg());
        eprintln!(
            "{kind:?}: batched vs one at a time on the GPU: parameters {dp:e}, buffers {db:e}"
        );
        assert!(moved > 1e-3, "{kind:?}: training moved ({moved})");
        assert!(dp < 1e-4, "{kind:?}: parameters differ by {dp:e}");
        assert!(db < 1e-4, "{kind:?}: buffers differ by {db:e}");
    }
}

#[test]
fn the_proximal_term_on_the_gpu_trains_as_on_the_host() {
    let (_, device) = gpu();
    let cpu = ModelSpec::new(ModelKind::CNN, &[1, 28, 28], 4).unwrap();
    let (x, y, idx) = data(32, cpu.input_len(), 6);
    let local = LocalData::new(&x, &y, &idx);
    let init = cpu.init(&mut rng_stream(1, 0, 0, Purpose::ModelInit));
    let anchor: Vec<f32> = init.iter().map(|p| p * 0.5).collect();
    let prox = Proximal {
        mu: 0.5,
        anchor: &anchor,
    };
    let extras: [&dyn ExtraLoss; 1] = [&prox];
    let cfg = TrainConfig {
        lr: 0.05,
        momentum: 0.9,
        weight_decay: 0.0,
        batch_size: 8,
        iterations: 12,
        epochs: 0,
    };
    let run = |on: &Device| {
        let mut rng = rng_stream(4, 1, 0, Purpose::Batches);
        let mut sampler = BatchSampler::new(idx.len(), cfg.batch_size, &mut rng);
        let spec = cpu.clone().on(on.clone());
        let mut trainer = LocalTrainer::new(&spec, on, &init, &[], cfg.sgd(), None);
        let terms = trainer.prepare(&extras);
        for _ in 0..cfg.iterations {
            let batch = sampler.next_batch(&mut rng);
            trainer.loss_and_grad_prepared(&local, batch, &terms, None);
            trainer.step(&[], cfg.lr);
        }
        let mut params = vec![0.0; init.len()];
        trainer.store(&mut params, &mut []);
        params
    };
    let (host, dev) = (run(&Device::flex()), run(&device));
    assert!(rel_max_diff(&host, &init) > 1e-3);
    let d = rel_max_diff(&dev, &host);
    eprintln!("proximal term, GPU tensor form vs CPU host form: {d:e}");
    assert!(d < 1e-4, "the GPU's tensor-form term differs by {d:e}");
}

#[test]
fn server_kernels_run_on_the_gpu_or_are_refused_for_lack_of_f64() {
    let (backend, _) = gpu();
    let offload = match BurnOffload::new(backend) {
        Ok(o) => o,
        Err(NnError::NoF64 { backend: name }) => {
            eprintln!("{name} has no f64: server kernels stay on the host");
            assert_eq!(name, backend.name());
            return;
        }
        Err(e) => panic!("{e}"),
    };
    eprintln!("server kernels on the {} device", backend.name());
    let kernels = Kernels::offloaded(Arc::new(offload), 0.0);
    let host = Kernels::cpu();
    let d = 40_000;
    let rows: Vec<Vec<f32>> = (0..9)
        .map(|i| {
            let (x, _, _) = data(1, d, 20 + i);
            x
        })
        .collect();
    let init = &rows[8];
    let view = View::all().with_shift(init);
    let (c, ch) = (
        kernels.cosine_matrix_sym(&rows[..8], &view),
        host.cosine_matrix_sym(&rows[..8], &view),
    );
    for (a, b) in c.as_slice().iter().zip(ch.as_slice()) {
        assert!((a - b).abs() < 1e-12, "cosine {a} vs {b}");
    }
    let (s, sh) = (
        kernels.sq_dist_matrix(&rows[..3], &rows[3..], &View::all()),
        host.sq_dist_matrix(&rows[..3], &rows[3..], &View::all()),
    );
    for (a, b) in s.as_slice().iter().zip(sh.as_slice()) {
        assert!(
            (a - b).abs() <= 2.0 * SQ_DIST_REL_TOL * b,
            "distance {a} vs {b}"
        );
    }
    let w: Vec<Vec<f64>> = (0..6)
        .map(|r| (0..9).map(|j| 1.0 / (1 + (j + r) % 9 + r) as f64).collect())
        .collect();
    let (m, mh) = (kernels.mix(&w, &rows), host.mix(&w, &rows));
    for r in 0..6 {
        for (a, b) in m.row(r).iter().zip(mh.row(r)) {
            assert!((a - b).abs() <= f32::EPSILON * b.abs(), "mix {a} vs {b}");
        }
    }
}
