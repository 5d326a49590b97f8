//! What fedweave's own cube kernels (CUDA, wgpu) share: a sum across one
//! cube's units, and the setup of a launch (the widest address any of its
//! tensors needs, fresh `f32` outputs, one unit per element).

use burn::tensor::{DType, Shape};
use burn_cubecl::ops::numeric::empty_device_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::ir::{AddressType, FloatKind};
use cubecl::prelude::*;
use cubecl::{CubeDim, calculate_cube_count_elemwise};

/// Units per cube of the kernels that give each channel or client a cube:
/// a power of two ([`cube_sum`] halves it).
pub(crate) const THREADS: u32 = 256;

/// The element type of every launch here.
pub(crate) const F32: ElemType = ElemType::Float(FloatKind::F32);

/// The sum of every unit's `v`, returned to every unit. `shared` holds one
/// value per unit (a fresh slice per sum: units read the total from it
/// after the last meeting); the cube meets after each halving.
#[cube]
pub(crate) fn cube_sum<F: Float>(v: F, shared: &mut Shared<[F]>) -> F {
    shared[UNIT_POS as usize] = v;
    sync_cube();
    let mut active = CUBE_DIM;
    while active > 1 {
        active /= 2;
        if UNIT_POS < active {
            let other = shared[(UNIT_POS + active) as usize];
            shared[UNIT_POS as usize] += other;
        }
        sync_cube();
    }
    shared[0]
}

/// Index of value `i` (of the channel's B·H·W) of channel `ch` in a
/// contiguous `[B, C, H, W]` tensor of `channels` channels.
#[cube]
pub(crate) fn channel_value(i: usize, ch: usize, channels: usize, plane: usize) -> usize {
    let b = i / plane;
    (b * channels + ch) * plane + i % plane
}

/// A running mean and variance folded with a batch's, as
/// `RunningStats::fold_rows` does: `keep·old + momentum·batch`, the batch's
/// variance unbiased by `count / (count − 1)` (1 for a count of at most 1),
/// `count` the values per channel of the batch.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn folded<F: Float>(
    old_mean: F,
    old_var: F,
    mean: F,
    var: F,
    count: F,
    momentum: F,
    keep: F,
) -> (F, F) {
    let mut unbias = F::new(1.0);
    if count > F::new(1.0) {
        unbias = count / (count - F::new(1.0));
    }
    (
        old_mean * keep + mean * momentum,
        old_var * keep + var * momentum * unbias,
    )
}

/// The address type wide enough for every one of a launch's `tensors`.
pub(crate) fn address(tensors: &[&CubeTensor]) -> AddressType {
    tensors
        .iter()
        .map(|t| t.required_address_type())
        .max()
        .unwrap_or_default()
}

/// A fresh `f32` tensor of `shape` on `like`'s device.
pub(crate) fn empty_f32(like: &CubeTensor, shape: Shape) -> CubeTensor {
    empty_device_dtype(like.client.clone(), like.device.clone(), shape, DType::F32)
}

/// Cubes and their size for one unit per element of `n`, on `like`'s device.
pub(crate) fn units(like: &CubeTensor, n: usize) -> (CubeCount, CubeDim) {
    let dim = CubeDim::new(&like.client, n);
    (calculate_cube_count_elemwise(&like.client, n, dim), dim)
}
