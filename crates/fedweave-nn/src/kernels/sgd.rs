//! One momentum-SGD update of a parameter tensor: `g = grad + wd·θ;
//! buf ← m·buf + g; θ ← θ − lr·buf` (PyTorch, dampening 0).
//!
//! As burn's operations that is six element-wise kernels per tensor, each
//! one rounded `f32` operation per element: the arithmetic the goldens pin.
//! On the CPU those six passes, with the outputs they allocate, were ~12 %
//! of a FedDWA run on the `mlp` (docs/results.md, "The fused SGD step"):
//! Flex runs the same six roundings per element in one pass, in place
//! when θ and the buffer are not shared, so the bits stay. On a GPU a
//! batched step of small models is bound by the host's launches (~59 µs
//! each on an H100), and the update was a third of them (docs/results.md,
//! "GPU, session 19"): the cube backend computes it in one kernel per
//! tensor, writing θ and the buffer at once.

use burn::backend::tensor::FloatTensor;
use burn::backend::{Backend, Dispatch, Flex, backend_extension};
use burn::tensor::{DType, Tensor, TensorData};
use burn_flex::FlexTensor;
use fedweave_core::wide;

/// Momentum SGD's update as one operation.
#[backend_extension(
    Flex,
    Cube: cfg(any(feature = "cuda", feature = "wgpu"))
)]
pub trait SgdStep: Backend {
    /// θ and the momentum buffer after one step along `grad` (all three of
    /// one shape): `g = grad + weight_decay·θ`, `buf ← momentum·buf + g`,
    /// `θ ← θ − lr·buf`.
    fn sgd_momentum(
        theta: FloatTensor<Self>,
        buf: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        hyper: Sgd,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);
}

/// The step's constants.
#[derive(Clone, Copy, Debug)]
pub struct Sgd {
    /// Learning rate.
    pub lr: f32,
    /// Momentum factor.
    pub momentum: f32,
    /// L2 weight decay added to the gradient.
    pub weight_decay: f32,
}

/// [`SgdStep::sgd_momentum`] on tensors without autodiff (the trainers'
/// parameters, buffers and gradients).
pub(crate) fn sgd_momentum<const D: usize>(
    theta: Tensor<D>,
    buf: Tensor<D>,
    grad: Tensor<D>,
    hyper: Sgd,
) -> (Tensor<D>, Tensor<D>) {
    let (theta, buf) = <Dispatch as SgdStep>::sgd_momentum(
        theta.into_dispatch(),
        buf.into_dispatch(),
        grad.into_dispatch(),
        hyper,
    );
    (Tensor::from_dispatch(theta), Tensor::from_dispatch(buf))
}

/// The update as burn's element-wise operations, in the order the goldens
/// pin.
fn composed<B: Backend>(
    theta: FloatTensor<B>,
    buf: FloatTensor<B>,
    grad: FloatTensor<B>,
    hyper: Sgd,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let decay = B::float_mul_scalar(theta.clone(), hyper.weight_decay.into());
    let g = B::float_add(grad, decay);
    let buf = B::float_add(B::float_mul_scalar(buf, hyper.momentum.into()), g);
    let step = B::float_mul_scalar(buf.clone(), hyper.lr.into());
    (B::float_sub(theta, step), buf)
}

impl SgdStep for Flex {
    fn sgd_momentum(
        theta: FlexTensor,
        buf: FlexTensor,
        grad: FlexTensor,
        hyper: Sgd,
    ) -> (FlexTensor, FlexTensor) {
        let Some(n) = flat_f32_len(&grad) else {
            return composed::<Self>(theta, buf, grad, hyper);
        };
        let shape = theta.layout().shape().clone();
        if flat_f32_len(&theta) != Some(n)
            || flat_f32_len(&buf) != Some(n)
            || *buf.layout().shape() != shape
            || *grad.layout().shape() != shape
        {
            return composed::<Self>(theta, buf, grad, hyper);
        }
        let (mut theta, mut buf) = (writable(theta), writable(buf));
        let g = grad.as_slice::<f32>().expect("checked: contiguous f32");
        let t = theta.try_storage_mut::<f32>().expect("writable");
        let b = buf.try_storage_mut::<f32>().expect("writable");
        update(&mut t[..n], &mut b[..n], &g[..n], hyper);
        (theta, buf)
    }
}

/// The element count of a contiguous `f32` tensor that starts at its
/// buffer's first element; `None` for any other (the composed path takes it).
pub(crate) fn flat_f32_len(t: &FlexTensor) -> Option<usize> {
    match t.layout().contiguous_offsets() {
        Some((0, end)) if t.dtype() == DType::F32 => Some(end),
        _ => None,
    }
}

/// `t` itself when nothing else holds its buffer, else a private copy of its
/// values (the trainers' θ is shared with the last backward's leaves only
/// until they are dropped).
pub(crate) fn writable(mut t: FlexTensor) -> FlexTensor {
    if t.try_storage_mut::<f32>().is_some() {
        return t;
    }
    let shape = t.layout().shape().clone();
    let values = t
        .as_slice::<f32>()
        .expect("checked: contiguous f32")
        .to_vec();
    FlexTensor::from_data(TensorData::new(values, shape))
}

wide! {
    /// `composed`'s six roundings per element, in its order.
    fn update(theta: &mut [f32], buf: &mut [f32], grad: &[f32], hyper: Sgd) => update_body
}

#[inline(always)]
fn update_body(theta: &mut [f32], buf: &mut [f32], grad: &[f32], hyper: Sgd) {
    let Sgd {
        lr,
        momentum,
        weight_decay,
    } = hyper;
    for ((t, b), &g) in theta.iter_mut().zip(buf.iter_mut()).zip(grad) {
        let g = g + *t * weight_decay;
        *b = *b * momentum + g;
        *t -= *b * lr;
    }
}

// With burn's `fusion` (`cuda-tuned`) the cube backend fuses the
// element-wise operations itself.
#[cfg(feature = "cuda-tuned")]
impl SgdStep for burn::backend::Cube {
    fn sgd_momentum(
        theta: FloatTensor<Self>,
        buf: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        hyper: Sgd,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        composed::<Self>(theta, buf, grad, hyper)
    }
}

#[cfg(all(any(feature = "cuda", feature = "wgpu"), not(feature = "cuda-tuned")))]
mod cube {
    use super::super::cube::{F32, address, empty_f32, units};
    use super::{Sgd, SgdStep, composed};
    use burn::backend::tensor::FloatTensor;
    use burn::tensor::DType;
    use burn_cubecl::CubeBackend;
    use burn_cubecl::tensor::CubeTensor;
    use cubecl::prelude::*;
    use cubecl::std::tensor::layout::linear::{LinearView, LinearViewMut};

    /// One thread per element: reads θ, the buffer and the gradient once,
    /// writes the new θ and buffer.
    #[cube(launch_unchecked, address_type = "dynamic")]
    #[allow(clippy::too_many_arguments)]
    fn sgd_momentum_kernel<F: Float>(
        theta: LinearView<'_, F>,
        buf: LinearView<'_, F>,
        grad: LinearView<'_, F>,
        mut theta_out: LinearViewMut<'_, F>,
        mut buf_out: LinearViewMut<'_, F>,
        lr: InputScalar,
        momentum: InputScalar,
        weight_decay: InputScalar,
        #[define(F)] _dtype: ElemType,
    ) {
        if !theta_out.is_in_bounds(ABSOLUTE_POS) {
            terminate!();
        }
        let t = theta.read(ABSOLUTE_POS);
        let g = grad.read(ABSOLUTE_POS) + t * weight_decay.get::<F>();
        let b = buf.read(ABSOLUTE_POS) * momentum.get::<F>() + g;
        buf_out.write(ABSOLUTE_POS, b);
        theta_out.write(ABSOLUTE_POS, t - b * lr.get::<F>());
    }

    impl SgdStep for CubeBackend {
        fn sgd_momentum(
            theta: CubeTensor,
            buf: CubeTensor,
            grad: CubeTensor,
            hyper: Sgd,
        ) -> (FloatTensor<Self>, FloatTensor<Self>) {
            let shape = theta.meta.shape().clone();
            let fits = theta.dtype == DType::F32
                && [&buf, &grad]
                    .iter()
                    .all(|t| t.dtype == DType::F32 && *t.meta.shape() == shape);
            let n = shape.num_elements();
            if !fits || n == 0 {
                return composed::<Self>(theta, buf, grad, hyper);
            }
            let client = theta.client.clone();
            let (theta_out, buf_out) = (
                empty_f32(&theta, shape.clone()),
                empty_f32(&theta, shape.clone()),
            );
            let address = address(&[&theta, &buf, &grad, &theta_out, &buf_out]);
            let (cube_count, cube_dim) = units(&theta, n);
            let scalar = |v: f32| InputScalar::new(v, F32);
            // SAFETY: every view covers `n` elements of a live buffer and the
            // kernel returns for positions past `n`.
            unsafe {
                sgd_momentum_kernel::launch_unchecked(
                    &client,
                    cube_count,
                    cube_dim,
                    address,
                    theta.into_linear_view(),
                    buf.into_linear_view(),
                    grad.into_linear_view(),
                    theta_out.clone().into_linear_view(),
                    buf_out.clone().into_linear_view(),
                    scalar(hyper.lr),
                    scalar(hyper.momentum),
                    scalar(hyper.weight_decay),
                    F32,
                );
            }
            (theta_out, buf_out)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{Device, TensorData};

    /// On the CPU the operation is the six element-wise tensor operations
    /// the trainers used before, bit for bit (in place on tensors nothing
    /// else holds, and into new ones when θ and the buffer are shared, at
    /// lengths around the vector widths and with −0, ±∞ and NaN among the
    /// values), and equals the formula.
    #[test]
    fn the_cpu_update_is_the_composed_one_bit_for_bit() {
        let device = Device::flex();
        let hyper = Sgd {
            lr: 0.05,
            momentum: 0.9,
            weight_decay: 1e-3,
        };
        let bits = |t: Tensor<1>| -> Vec<u32> {
            t.into_data()
                .try_to_vec::<f32>()
                .expect("f32")
                .iter()
                .map(|v| v.to_bits())
                .collect()
        };
        let composed = |theta: &Tensor<1>, buf: &Tensor<1>, grad: &Tensor<1>| {
            let g = grad
                .clone()
                .add(theta.clone().mul_scalar(hyper.weight_decay));
            let b = buf.clone().mul_scalar(hyper.momentum).add(g);
            (theta.clone().sub(b.clone().mul_scalar(hyper.lr)), b)
        };
        for n in [0, 1, 15, 16, 17, 37, 1031] {
            let values = |seed: f32| -> Vec<f32> {
                let mut v: Vec<f32> = (0..n).map(|i| (i as f32 * seed).sin() * 3.0).collect();
                for (i, special) in [-0.0, f32::INFINITY, f32::NAN, f32::NEG_INFINITY]
                    .into_iter()
                    .enumerate()
                {
                    if let Some(x) = v.get_mut(3 + 7 * i + seed as usize) {
                        *x = special;
                    }
                }
                v
            };
            let make =
                |seed: f32| Tensor::<1>::from_data(TensorData::new(values(seed), [n]), &device);
            let (theta, buf, grad) = (make(1.3), make(0.7), make(2.9));
            let (t2, b2) = composed(&theta, &buf, &grad);
            let (t2, b2) = (bits(t2), bits(b2));
            // Shared θ and buffer: the update writes new tensors.
            let (t1, b1) = sgd_momentum(theta.clone(), buf.clone(), grad.clone(), hyper);
            assert_eq!(
                (bits(t1), bits(b1)),
                (t2.clone(), b2.clone()),
                "shared, n = {n}"
            );
            // Sole owners: the update writes in place.
            let (t1, b1) = sgd_momentum(make(1.3), make(0.7), grad.clone(), hyper);
            assert_eq!((bits(t1), bits(b1)), (t2, b2), "unique, n = {n}");
        }
        let make = |seed: f32| {
            let v: Vec<f32> = (0..37).map(|i| (i as f32 * seed).sin() * 3.0).collect();
            Tensor::<1>::from_data(TensorData::new(v, [37]), &device)
        };
        let (theta, buf, grad) = (make(1.3), make(0.7), make(2.9));
        let (t1, b1) = sgd_momentum(theta.clone(), buf.clone(), grad.clone(), hyper);
        let read = |t: Tensor<1>| t.into_data().try_to_vec::<f32>().expect("f32");
        let (th, bu, gr) = (read(theta), read(buf), read(grad));
        for (i, (t, b)) in read(t1).into_iter().zip(read(b1)).enumerate() {
            let want_b = 0.9 * bu[i] + gr[i] + 1e-3 * th[i];
            assert!((b - want_b).abs() < 1e-5, "buf[{i}]: {b} vs {want_b}");
            assert!((t - (th[i] - 0.05 * want_b)).abs() < 1e-5, "θ[{i}]");
        }
    }
}
