//! fedweave's own CPU kernels for the operations that dominate a conv
//! model's training step: 2-d convolution ([`conv`]: im2col into
//! cache-sized blocks + one `gemm` per block, forward and backward), max
//! pooling ([`pool`]) and training-mode batch norm ([`batch_norm`]).
//! burn-flex builds the column matrix element by element, pools through a
//! general 3-d kernel, and batch norm is a composition of about twenty
//! element-wise passes; together they were most of a `cnn-bn` step.
//!
//! They enter burn as a backend extension ([`CpuKernels`]) implemented for
//! `Flex` (evaluation) and `Autodiff<Flex>` (training, with hand-written
//! backward steps). [`conv2d`] and [`max_pool2d`] are drop-in replacements
//! for burn's functions and [`batch_norm_train`] replaces the composition
//! in `Norm::apply`: shapes the kernels do not cover (dilation, groups,
//! non-square windows, ceil mode) take burn's own operations.
//!
//! The GPU backends (CUDA, wgpu) take burn's operations where they are
//! fast there and fedweave's own cube kernels, with hand-written backward
//! steps, where a step of small models would otherwise be dozens of small
//! launches: convolutions through [`grouped`] (columns written by one
//! kernel and one batched matmul, forward and weight gradient; the batched
//! trainer's K clients take it on every backend), batch norm with the
//! convolution's bias, a ReLU and the running statistics
//! ([`masked_batch_norm`], one client for one model), the loss with the
//! output layer's bias ([`weighted_cross_entropy`]), a hidden dense layer's
//! bias and ReLU ([`bias_relu`]), ReLU with tiled max pooling
//! ([`relu_pool`]), the flatten ([`swap_leading`]), the step's samples and
//! targets from the round's plan ([`plan_row`]), momentum SGD ([`sgd`]) and
//! a step's new state written into the old state's buffers, a few tensors a
//! launch ([`in_place`]), which CUDA graphs need.
//!
//! Element-wise loops run at the CPU's widest vectors through
//! [`fedweave_core::wide`].

mod add_relu;
mod batch_norm;
mod batch_norm_ops;
mod bias_relu;
mod channels_last;
mod conv;
#[cfg(all(any(feature = "cuda", feature = "wgpu"), not(feature = "cuda-tuned")))]
mod cube;
mod dense;
mod grouped;
mod in_place;
mod masked_batch_norm;
mod plan_row;
mod pool;
mod relu_pool;
mod sgd;
mod swap_leading;
mod vectors;
mod weighted_cross_entropy;
mod winograd;

use batch_norm::BnGeom;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::ops::FloatTensorOps;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, AutodiffBackend, Backend, Dispatch, Flex, backend_extension};
use burn::tensor::ops::{ConvOptions, MaxPoolOptions};
use burn::tensor::{DType, Device, Shape, Tensor, TensorData};
use burn_flex::FlexTensor;
use conv::ConvGeom;
use pool::PoolGeom;
use std::borrow::Cow;
use std::sync::Arc;

/// The operations fedweave computes itself on the CPU backend.
#[backend_extension(Flex, Autodiff)]
pub trait CpuKernels: Backend {
    /// Convolution of `x` (`[b, c, h, w]`) by `weight` (`[o, c, kh, kw]`)
    /// plus `bias` (`[o]`), with `stride` and zero `padding` on both axes.
    fn conv2d_im2col(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        stride: usize,
        padding: usize,
    ) -> FloatTensor<Self>;

    /// k×k max pooling with `stride` and `padding` on both axes (floor
    /// mode), then ReLU on its output when `relu` (the same values and
    /// gradients as max pooling after ReLU, on a quarter of the values).
    fn max_pool2d_square(
        x: FloatTensor<Self>,
        k: usize,
        stride: usize,
        padding: usize,
        relu: bool,
    ) -> FloatTensor<Self>;

    /// Training-mode batch norm of `y` (`[b, c, h, w]`) with scale `gamma`
    /// and shift `beta` (`[c]`): the output, and the batch's mean and
    /// biased variance (`[c]`, outside the autodiff graph).
    fn batch_norm_train(
        y: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        eps: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);

    /// `x · weight + bias` for `x` of `[m, k]`, `weight` of `[k, n]` and
    /// `bias` of `[n]`: burn's `linear`, into buffers of its own ([`dense`]).
    fn linear_bias(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
    ) -> FloatTensor<Self>;

    /// [`CpuKernels::batch_norm_train`] followed by ReLU, in one kernel
    /// each way.
    fn batch_norm_relu_train(
        y: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        eps: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);
}

/// burn's `conv2d`, through [`conv`] where it applies: the CPU backend,
/// `f32`, no dilation, one group, equal stride and padding on both axes.
/// Grouped convolutions on every backend, and every convolution off the
/// CPU, through [`grouped`] (one convolution for a grouped weight gradient
/// instead of one per group; a batched matmul for a dense one).
pub(crate) fn conv2d(
    x: Tensor<4>,
    weight: Tensor<4>,
    bias: Option<Tensor<1>>,
    options: ConvOptions<2>,
) -> Tensor<4> {
    if options.groups > 1 || !on_cpu(&x) {
        return grouped::conv2d(x, weight, bias, options);
    }
    let Some((s, p)) = square_geometry(&options)
        .filter(|&(s, p)| on_cpu_f32(&x) && ConvGeom::new(x.dims(), weight.dims(), s, p).is_some())
    else {
        return burn::tensor::module::conv2d(x, weight, bias, options);
    };
    let bias = bias.unwrap_or_else(|| Tensor::zeros([weight.dims()[0]], &weight.device()));
    Tensor::from_dispatch(<Dispatch as CpuKernels>::conv2d_im2col(
        x.into_dispatch(),
        weight.into_dispatch(),
        bias.into_dispatch(),
        s,
        p,
    ))
}

/// burn's `linear` of a batch of rows (`x` of `[m, k]`, `weight` of
/// `[k, n]`), through [`dense`] on the CPU backend in `f32` with a bias:
/// the same products and bits, without burn-flex's zeroed and then
/// realigned copy of each one. (The bits are burn's for row-major
/// operands, which every model here passes: a parameter reshaped, a
/// flattened activation.)
pub(crate) fn linear(x: Tensor<2>, weight: Tensor<2>, bias: Option<Tensor<1>>) -> Tensor<2> {
    match bias {
        Some(bias) if on_cpu(&x) && x.dtype() == DType::F32 => {
            Tensor::from_dispatch(<Dispatch as CpuKernels>::linear_bias(
                x.into_dispatch(),
                weight.into_dispatch(),
                bias.into_dispatch(),
            ))
        }
        bias => burn::tensor::module::linear(x, weight, bias),
    }
}

/// ReLU after [`linear`] with a bias: off the CPU the bias and ReLU are one
/// kernel each way ([`bias_relu`], one client), four launches fewer a
/// layer; the CPU keeps [`linear`] then burn's ReLU.
pub(crate) fn linear_relu(x: Tensor<2>, weight: Tensor<2>, bias: Tensor<1>) -> Tensor<2> {
    if on_cpu(&x) {
        return burn::tensor::activation::relu(linear(x, weight, Some(bias)));
    }
    let [b, _] = x.dims();
    let [_, j] = weight.dims();
    let z = x.matmul(weight).reshape([1, b, j]);
    bias_relu(z, bias.reshape([1, j])).reshape([b, j])
}

/// (stride, padding) of a convolution without dilation whose stride and
/// padding are the same on both axes and on both sides.
fn square_geometry(options: &ConvOptions<2>) -> Option<(usize, usize)> {
    let [s, s2] = options.stride;
    let p = options.padding[0].0;
    (options.dilation == [1, 1] && s == s2 && options.padding == [(p, p); 2]).then_some((s, p))
}

/// burn's `max_pool2d`, through [`pool`] where it applies: the CPU
/// backend, `f32`, square windows, equal stride and padding on both axes,
/// no dilation, floor mode.
pub(crate) fn max_pool2d(x: Tensor<4>, options: MaxPoolOptions<2>) -> Tensor<4> {
    match pool_window(&x, &options) {
        Some(window) => pool_square(x, window, false),
        None => burn::tensor::module::max_pool2d(x, options),
    }
}

/// `max_pool2d(relu(x))` as ReLU after the pooling, in its kernel where
/// [`max_pool2d`]'s applies. Max commutes with ReLU, and ReLU's gradient
/// mask taken on the pooled value routes the same gradients (a window
/// whose maximum is not positive sends nothing, as ReLU then zeroed
/// whatever it sent), so the values and gradients are those of the
/// composition, bit for bit.
pub(crate) fn relu_max_pool2d(x: Tensor<4>, options: MaxPoolOptions<2>) -> Tensor<4> {
    if let Some(window) = pool_window(&x, &options) {
        return pool_square(x, window, true);
    }
    let [k, k2] = options.kernel_size;
    let tiles = options.stride == [k, k]
        && k == k2
        && options.padding == [(0, 0); 2]
        && options.dilation == [1, 1]
        && !options.ceil_mode;
    if tiles && !on_cpu(&x) {
        // Off the CPU: one kernel each way (`relu_pool`).
        return relu_pool::relu_max_pool(x, k);
    }
    burn::tensor::module::max_pool2d(burn::tensor::activation::relu(x), options)
}

/// (window, stride, padding) when [`pool`] covers `x` under `options`.
fn pool_window(x: &Tensor<4>, options: &MaxPoolOptions<2>) -> Option<(usize, usize, usize)> {
    let [b, c, h, w] = x.dims();
    let ([k, k2], [s, s2]) = (options.kernel_size, options.stride);
    let p = options.padding[0].0;
    let covered = on_cpu_f32(x)
        && k == k2
        && s == s2
        && options.padding == [(p, p); 2]
        && options.dilation == [1, 1]
        && !options.ceil_mode
        && PoolGeom::new(b * c, h, w, k, s, p).is_some();
    covered.then_some((k, s, p))
}

/// Max pooling (then ReLU when `relu`) through [`pool`].
fn pool_square(x: Tensor<4>, (k, s, p): (usize, usize, usize), relu: bool) -> Tensor<4> {
    Tensor::from_dispatch(<Dispatch as CpuKernels>::max_pool2d_square(
        x.into_dispatch(),
        k,
        s,
        p,
        relu,
    ))
}

/// Runs `f` on `t`'s `f32` values in row-major order: borrowed from the CPU
/// backend's storage where they lie there contiguous, else read through
/// `to_data`. burn's `to_data` of a tensor that something else still holds
/// copies the buffer twice (a copy, then another into a 16-byte-aligned
/// allocation), and the trainer reads every parameter and gradient.
///
/// # Panics
///
/// If `t` does not hold `f32` values.
pub(crate) fn with_values<const D: usize, R>(t: &Tensor<D>, f: impl FnOnce(&[f32]) -> R) -> R {
    if let Ok(flex) = t.clone().try_into_primitive::<Flex>()
        && let Some(v) = flex.as_slice::<f32>()
    {
        return f(v);
    }
    f(t.to_data().as_slice::<f32>().expect("f32 tensor"))
}

/// `f` on the values of `read` and, in their own buffers, of `write`, when
/// all are contiguous `f32` tensors of the CPU backend: `write` comes back
/// with `f`'s changes, without copies into and out of flat vectors (a
/// buffer something else holds is copied first). `Err(write)`, untouched,
/// for any other tensors.
pub(crate) fn with_parts(
    read: &[Tensor<1>],
    write: Vec<Tensor<1>>,
    f: impl FnOnce(&[&[f32]], &mut [&mut [f32]]),
) -> Result<Vec<Tensor<1>>, Vec<Tensor<1>>> {
    let flex_f32 = |t: &Tensor<1>| {
        on_cpu(t)
            && t.dtype() == DType::F32
            && t.clone()
                .try_into_primitive::<Flex>()
                .is_ok_and(|p| sgd::flat_f32_len(&p) == Some(t.dims()[0]))
    };
    if !read.iter().chain(&write).all(flex_f32) {
        return Err(write);
    }
    let primitive = |t: Tensor<1>| t.try_into_primitive::<Flex>().expect("checked: on the CPU");
    let read: Vec<FlexTensor> = read.iter().cloned().map(primitive).collect();
    let mut write: Vec<FlexTensor> = write
        .into_iter()
        .map(|t| sgd::writable(primitive(t)))
        .collect();
    let values: Vec<&[f32]> = read
        .iter()
        .map(|t| t.as_slice::<f32>().expect("checked: contiguous f32"))
        .collect();
    let mut buffers: Vec<&mut [f32]> = write
        .iter_mut()
        .map(|t| {
            let n = t.layout().shape().num_elements();
            &mut t.try_storage_mut::<f32>().expect("writable")[..n]
        })
        .collect();
    f(&values, &mut buffers);
    Ok(write
        .into_iter()
        .map(Tensor::from_primitive::<Flex>)
        .collect())
}

/// Whether the kernels can take `x`: an `f32` tensor on the CPU backend
/// (with or without autodiff).
pub(crate) fn on_cpu_f32(x: &Tensor<4>) -> bool {
    on_cpu(x) && x.dtype() == DType::F32
}

/// `t` zeroed where `x ≤ 0`: burn's ReLU (`t` = `x`) and its gradient (`x`
/// the output), as burn's operations, for the composed forms of the fused
/// ReLU operations.
pub(super) fn relu_masked<B: Backend>(t: FloatTensor<B>, x: FloatTensor<B>) -> FloatTensor<B> {
    use burn::backend::{TensorMetadata, get_or_init_device_settings};
    let bool_dtype = get_or_init_device_settings::<B>(&x.device()).bool_dtype;
    let off = B::float_lower_equal_elem(x, 0f32.into(), bool_dtype);
    B::float_mask_fill(t, off, 0f32.into())
}

/// Whether `x` lives on the CPU backend (with or without autodiff).
pub(crate) fn on_cpu<const D: usize>(x: &Tensor<D>) -> bool {
    x.device().inner() == Device::flex()
}

pub(crate) use add_relu::add_relu;
pub(crate) use bias_relu::bias_relu;
pub(crate) use in_place::{
    REPLAYABLE, add_assign, assign_rows, fold_running_rows, sgd_momentum_rows,
};
pub(crate) use masked_batch_norm::{
    Around, batch_norm_one_model, masked_batch_norm, masked_batch_norm_folding,
};
pub(crate) use plan_row::{plan_inputs, plan_row};
pub(crate) use sgd::{Sgd, sgd_momentum};
pub(crate) use swap_leading::swap_leading;
pub(crate) use weighted_cross_entropy::weighted_cross_entropy;

/// The option named by environment variable `name` among `options` (a
/// lowering set for a comparison run), or `None` when it is unset or names
/// none of them. Callers read it once.
pub(crate) fn env_choice<T: Copy>(name: &str, options: &[(&str, T)]) -> Option<T> {
    let value = std::env::var(name).ok()?;
    options
        .iter()
        .find(|(option, _)| *option == value)
        .map(|&(_, choice)| choice)
}

/// A training-mode batch norm of the dispatching backend: `(y, gamma,
/// beta, eps)` to the output and the batch's mean and variance (`[c]`,
/// detached).
pub(crate) type BatchNormOp = fn(
    FloatTensor<Dispatch>,
    FloatTensor<Dispatch>,
    FloatTensor<Dispatch>,
    f32,
) -> (
    FloatTensor<Dispatch>,
    FloatTensor<Dispatch>,
    FloatTensor<Dispatch>,
);

/// The training-mode batch norm for `y`'s backend when it is the CPU in
/// `f32`: [`batch_norm`]'s fused kernel. `None` elsewhere: off the CPU
/// `Norm::apply` takes [`batch_norm_one_model`], on the CPU in `f64`
/// burn's composition.
pub(crate) fn batch_norm_for(y: &Tensor<4>) -> Option<BatchNormOp> {
    on_cpu_f32(y).then_some(<Dispatch as CpuKernels>::batch_norm_train as BatchNormOp)
}

/// Training-mode batch norm then ReLU of `y` (`[b, c, h, w]`, on the CPU in
/// `f32`) in one kernel each way ([`CpuKernels::batch_norm_relu_train`]):
/// the output and the batch's mean and variance; the same bits as ReLU
/// after [`batch_norm_train`].
pub(crate) fn batch_norm_relu_train(
    y: Tensor<4>,
    gamma: Tensor<1>,
    beta: Tensor<1>,
    eps: f32,
) -> (Tensor<4>, Tensor<1>, Tensor<1>) {
    batch_norm_train(
        <Dispatch as CpuKernels>::batch_norm_relu_train,
        y,
        gamma,
        beta,
        eps,
    )
}

/// Runs the batch norm `op` on `y` (`[b, c, h, w]`) with scale `gamma` and
/// shift `beta`: the output and the batch's mean and variance.
pub(crate) fn batch_norm_train(
    op: BatchNormOp,
    y: Tensor<4>,
    gamma: Tensor<1>,
    beta: Tensor<1>,
    eps: f32,
) -> (Tensor<4>, Tensor<1>, Tensor<1>) {
    let (out, mean, var) = op(
        y.into_dispatch(),
        gamma.into_dispatch(),
        beta.into_dispatch(),
        eps,
    );
    (
        Tensor::from_dispatch(out),
        Tensor::from_dispatch(mean),
        Tensor::from_dispatch(var),
    )
}

/// Σ f(v) in `f64` over 8 independent lanes (a single running sum is one
/// long chain of dependent adds, several times slower).
#[inline(always)]
pub(crate) fn sum_f64(v: &[f32], f: impl Fn(f32) -> f32) -> f64 {
    let mut lanes = [0.0f64; 8];
    let chunks = v.chunks_exact(8);
    let tail: f64 = chunks.remainder().iter().map(|&x| f(x) as f64).sum();
    for chunk in chunks {
        let chunk: &[f32; 8] = chunk.try_into().expect("a chunk of 8");
        for (l, &x) in lanes.iter_mut().zip(chunk) {
            *l += f(x) as f64;
        }
    }
    lanes.iter().sum::<f64>() + tail
}

/// Whether burn-flex's ReLU passes `z` through (positive or NaN; it maps
/// the rest, −0 included, to +0) and so lets its gradient through: the one
/// test behind every fused ReLU here, which must keep burn's bits.
#[inline(always)]
pub(crate) fn relu_keeps(z: f32) -> bool {
    z.is_nan() || z > 0.0
}

/// Appends `f(a[i], b[i])` for every `i` to `dst`, in a loop compiled into
/// the caller. `extend` over a mapped iterator goes through `fold`, which
/// the compiler may keep out of line, and out of a `wide!` body it runs
/// 4 lanes wide (batch norm's backward with ReLU's mask did, 3.5 % of a
/// `resnet8` step).
#[inline(always)]
pub(crate) fn extend_zip(dst: &mut Vec<f32>, a: &[f32], b: &[f32], f: impl Fn(f32, f32) -> f32) {
    assert_eq!(a.len(), b.len(), "extend_zip over slices of one length");
    dst.reserve(a.len());
    let start = dst.len();
    for ((o, &x), &y) in dst.spare_capacity_mut()[..a.len()].iter_mut().zip(a).zip(b) {
        o.write(f(x, y));
    }
    // SAFETY: the loop initialised the `a.len()` entries after `start`,
    // within the capacity reserved above.
    unsafe { dst.set_len(start + a.len()) };
}

/// A Flex tensor's `f32` values in row-major order (borrowed when it is
/// already contiguous).
fn values(t: &FlexTensor) -> Cow<'_, [f32]> {
    match t.as_slice::<f32>() {
        Some(v) => Cow::Borrowed(v),
        None => Cow::Owned(
            t.to_contiguous()
                .as_slice::<f32>()
                .expect("a contiguous f32 tensor")
                .to_vec(),
        ),
    }
}

fn dims<const D: usize>(t: &FlexTensor) -> [usize; D] {
    t.layout().shape().dims::<D>()
}

fn flex<const D: usize>(v: Vec<f32>, shape: [usize; D]) -> FlexTensor {
    FlexTensor::from_data(TensorData::new(v, shape))
}

fn geometry(x: &FlexTensor, weight: &FlexTensor, stride: usize, padding: usize) -> ConvGeom {
    ConvGeom::new(dims(x), dims(weight), stride, padding)
        .expect("conv2d() admits only shapes with a geometry")
}

impl CpuKernels for Flex {
    fn conv2d_im2col(
        x: FlexTensor,
        weight: FlexTensor,
        bias: FlexTensor,
        stride: usize,
        padding: usize,
    ) -> FlexTensor {
        let g = geometry(&x, &weight, stride, padding);
        let out = conv::forward(&g, &values(&x), &values(&weight), &values(&bias));
        flex(out, [g.batch, g.c_out, g.oh, g.ow])
    }

    fn max_pool2d_square(
        x: FlexTensor,
        k: usize,
        stride: usize,
        padding: usize,
        relu: bool,
    ) -> FlexTensor {
        let g = pool_geometry(&x, k, stride, padding);
        let (out, _) = pool::forward(&g, &values(&x), relu);
        pooled(&x, &g, out)
    }

    fn linear_bias(x: FlexTensor, weight: FlexTensor, bias: FlexTensor) -> FlexTensor {
        let ([m, k], [_, n]) = (dims::<2>(&x), dims::<2>(&weight));
        let out = dense::forward(m, k, n, &values(&x), &values(&weight), &values(&bias));
        flex(out, [m, n])
    }

    fn batch_norm_train(
        y: FlexTensor,
        gamma: FlexTensor,
        beta: FlexTensor,
        eps: f32,
    ) -> (FlexTensor, FlexTensor, FlexTensor) {
        bn_untracked(&y, &gamma, &beta, eps, false)
    }

    fn batch_norm_relu_train(
        y: FlexTensor,
        gamma: FlexTensor,
        beta: FlexTensor,
        eps: f32,
    ) -> (FlexTensor, FlexTensor, FlexTensor) {
        bn_untracked(&y, &gamma, &beta, eps, true)
    }
}

/// Batch norm (then ReLU when `relu`) without autodiff: the output, the
/// batch's mean and variance.
fn bn_untracked(
    y: &FlexTensor,
    gamma: &FlexTensor,
    beta: &FlexTensor,
    eps: f32,
    relu: bool,
) -> (FlexTensor, FlexTensor, FlexTensor) {
    let (f, _) = bn_forward(y, gamma, beta, eps, relu);
    let c = f.mean.len();
    (
        flex(f.out, dims::<4>(y)),
        flex(f.mean, [c]),
        flex(f.var, [c]),
    )
}

fn bn_geometry(y: &FlexTensor) -> BnGeom {
    let [batch, channels, h, w] = dims(y);
    BnGeom {
        batch,
        channels,
        hw: h * w,
    }
}

fn bn_forward(
    y: &FlexTensor,
    gamma: &FlexTensor,
    beta: &FlexTensor,
    eps: f32,
    relu: bool,
) -> (batch_norm::BnForward, BnGeom) {
    let g = bn_geometry(y);
    let forward = if relu {
        batch_norm::forward_relu
    } else {
        batch_norm::forward
    };
    let f = forward(&g, &values(y), &values(gamma), &values(beta), eps);
    (f, g)
}

fn pool_geometry(x: &FlexTensor, k: usize, stride: usize, padding: usize) -> PoolGeom {
    let [b, c, h, w] = dims(x);
    PoolGeom::new(b * c, h, w, k, stride, padding)
        .expect("max_pool2d() admits only shapes with a geometry")
}

/// The pooled output of `x` as a tensor.
fn pooled(x: &FlexTensor, g: &PoolGeom, out: Vec<f32>) -> FlexTensor {
    let [b, c, _, _] = dims(x);
    flex(out, [b, c, g.oh, g.ow])
}

/// The backward step of [`CpuKernels::conv2d_im2col`]; its state is the
/// forward's input and weight (shared buffers, not copies).
#[derive(Debug)]
struct ConvBackward;

impl Backward<Flex, 3> for ConvBackward {
    type State = (FlexTensor, FlexTensor, usize, usize);

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_x, node_w, node_b] = ops.parents;
        let dout = grads.consume::<Flex>(&ops.node);
        let (x, weight, stride, padding) = ops.state;
        let g = geometry(&x, &weight, stride, padding);
        let d = conv::backward(
            &g,
            &values(&x),
            &values(&weight),
            &values(&dout),
            node_x.is_some(),
        );
        if let (Some(node), Some(dx)) = (node_x, d.x) {
            grads.register::<Flex>(node.id, flex(dx, [g.batch, g.c_in, g.h, g.w]));
        }
        if let Some(node) = node_w {
            grads.register::<Flex>(node.id, flex(d.weight, [g.c_out, g.c_in, g.kh, g.kw]));
        }
        if let Some(node) = node_b {
            grads.register::<Flex>(node.id, flex(d.bias, [g.c_out]));
        }
    }
}

/// The backward step of [`CpuKernels::linear_bias`]; its state is the
/// forward's input and weight (shared buffers, not copies).
#[derive(Debug)]
struct LinearBackward;

impl Backward<Flex, 3> for LinearBackward {
    type State = (FlexTensor, FlexTensor);

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_x, node_w, node_b] = ops.parents;
        let dout = grads.consume::<Flex>(&ops.node);
        let (x, weight) = ops.state;
        let ([m, k], [_, n]) = (dims::<2>(&x), dims::<2>(&weight));
        let d = values(&dout);
        if let Some(node) = node_x {
            let dx = dense::input_grad(m, k, n, &d, &values(&weight));
            grads.register::<Flex>(node.id, flex(dx, [m, k]));
        }
        if let Some(node) = node_w {
            let dw = dense::weight_grad(m, k, n, &values(&x), &d);
            grads.register::<Flex>(node.id, flex(dw, [k, n]));
        }
        if let Some(node) = node_b {
            // burn's own sum over the rows, for its bits.
            let db = Flex::float_sum_dim(dout.clone(), 0);
            grads.register::<Flex>(node.id, Flex::float_reshape(db, Shape::new([n])));
        }
    }
}

/// The backward step of [`CpuKernels::max_pool2d_square`]: each window's
/// winner, the geometry, and with ReLU its output (ReLU's mask).
#[derive(Debug)]
struct PoolBackward;

impl Backward<Flex, 1> for PoolBackward {
    type State = (Arc<[u32]>, PoolGeom, Option<FlexTensor>);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_x] = ops.parents;
        let dout = grads.consume::<Flex>(&ops.node);
        let (arg, g, relu_out) = ops.state;
        if let Some(node) = node_x {
            let mask = relu_out.as_ref().map(values);
            let dx = pool::backward(&g, &values(&dout), &arg, mask.as_deref());
            let planes = dims::<4>(&dout);
            grads.register::<Flex>(node.id, flex(dx, [planes[0], planes[1], g.h, g.w]));
        }
    }
}

/// The backward step of [`CpuKernels::batch_norm_train`] (and of
/// [`CpuKernels::batch_norm_relu_train`] when `relu`); its state is the
/// input, the batch statistics, the scale and the shift.
#[derive(Debug)]
struct BnBackward {
    relu: bool,
}

impl Backward<Flex, 3> for BnBackward {
    type State = (FlexTensor, Arc<[f32]>, Arc<[f32]>, FlexTensor, FlexTensor);

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_y, node_gamma, node_beta] = ops.parents;
        let dout = grads.consume::<Flex>(&ops.node);
        let (y, mean, inv_std, gamma, beta) = ops.state;
        let g = bn_geometry(&y);
        let backward = if self.relu {
            batch_norm::backward_relu
        } else {
            batch_norm::backward
        };
        let d = backward(
            &g,
            &values(&y),
            &mean,
            &inv_std,
            &values(&gamma),
            &values(&beta),
            &values(&dout),
        );
        if let Some(node) = node_y {
            grads.register::<Flex>(node.id, flex(d.y, dims::<4>(&y)));
        }
        if let Some(node) = node_gamma {
            grads.register::<Flex>(node.id, flex(d.gamma, [g.channels]));
        }
        if let Some(node) = node_beta {
            grads.register::<Flex>(node.id, flex(d.beta, [g.channels]));
        }
    }
}

/// Registers the operation `op` over `inputs` with the autodiff graph
/// (tracked when any input needs a gradient) and hands back their
/// primitives.
#[allow(clippy::type_complexity)]
fn track<O: Backward<Flex, N>, C: CheckpointStrategy, const N: usize>(
    op: O,
    inputs: [FloatTensor<Autodiff<Flex, C>>; N],
) -> (OpsKind<O, Flex, O::State, C, N>, [FlexTensor; N]) {
    let prep = op
        .prepare::<C>(inputs.each_ref().map(|t| t.node()))
        .compute_bound()
        .stateful();
    (prep, inputs.map(|t| t.into_primitive()))
}

impl<C: CheckpointStrategy> CpuKernels for Autodiff<Flex, C> {
    fn conv2d_im2col(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        stride: usize,
        padding: usize,
    ) -> FloatTensor<Self> {
        let (prep, [x, weight, bias]) = track::<_, C, 3>(ConvBackward, [x, weight, bias]);
        match prep {
            OpsKind::Tracked(prep) => {
                let out = Flex::conv2d_im2col(x.clone(), weight.clone(), bias, stride, padding);
                prep.finish((x, weight, stride, padding), out)
            }
            OpsKind::UnTracked(prep) => {
                prep.finish(Flex::conv2d_im2col(x, weight, bias, stride, padding))
            }
        }
    }

    fn linear_bias(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let (prep, [x, weight, bias]) = track::<_, C, 3>(LinearBackward, [x, weight, bias]);
        match prep {
            OpsKind::Tracked(prep) => {
                let out = Flex::linear_bias(x.clone(), weight.clone(), bias);
                prep.finish((x, weight), out)
            }
            OpsKind::UnTracked(prep) => prep.finish(Flex::linear_bias(x, weight, bias)),
        }
    }

    fn max_pool2d_square(
        x: FloatTensor<Self>,
        k: usize,
        stride: usize,
        padding: usize,
        relu: bool,
    ) -> FloatTensor<Self> {
        let (prep, [x]) = track::<_, C, 1>(PoolBackward, [x]);
        match prep {
            OpsKind::Tracked(prep) => {
                let g = pool_geometry(&x, k, stride, padding);
                let (out, arg) = pool::forward(&g, &values(&x), relu);
                let out = pooled(&x, &g, out);
                prep.finish((arg.into(), g, relu.then(|| out.clone())), out)
            }
            OpsKind::UnTracked(prep) => {
                prep.finish(Flex::max_pool2d_square(x, k, stride, padding, relu))
            }
        }
    }

    fn batch_norm_train(
        y: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        eps: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        bn_tracked::<C>(y, gamma, beta, eps, false)
    }

    fn batch_norm_relu_train(
        y: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        eps: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        bn_tracked::<C>(y, gamma, beta, eps, true)
    }
}

/// Batch norm (then ReLU when `relu`) under autodiff: the output, the
/// batch's mean and variance.
#[allow(clippy::type_complexity)]
fn bn_tracked<C: CheckpointStrategy>(
    y: FloatTensor<Autodiff<Flex, C>>,
    gamma: FloatTensor<Autodiff<Flex, C>>,
    beta: FloatTensor<Autodiff<Flex, C>>,
    eps: f32,
    relu: bool,
) -> (
    FloatTensor<Autodiff<Flex, C>>,
    FloatTensor<Autodiff<Flex, C>>,
    FloatTensor<Autodiff<Flex, C>>,
) {
    let (prep, [y, gamma, beta]) = track::<_, C, 3>(BnBackward { relu }, [y, gamma, beta]);
    let (f, g) = bn_forward(&y, &gamma, &beta, eps, relu);
    let stats = |v: Vec<f32>| Autodiff::<Flex, C>::from_inner(flex(v, [g.channels]));
    let out = flex(f.out, dims::<4>(&y));
    let out = match prep {
        OpsKind::Tracked(prep) => prep.finish(
            (y, f.mean.as_slice().into(), f.inv_std.into(), gamma, beta),
            out,
        ),
        OpsKind::UnTracked(prep) => prep.finish(out),
    };
    (out, stats(f.mean), stats(f.var))
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Distribution;
    use burn::tensor::activation::relu;

    pub(super) fn values_of<const D: usize>(t: Tensor<D>) -> Vec<f32> {
        t.into_data().try_to_vec::<f32>().expect("f32")
    }

    /// Fixed values spread like N(0.5, 2) (a hash, not a random draw: with
    /// fresh random values the check failed about once in ten runs, where a
    /// draw made a channel's variance small against its mean).
    pub(super) fn seeded<const D: usize>(
        shape: [usize; D],
        seed: u64,
        device: &Device,
    ) -> Tensor<D> {
        let len = shape.iter().product::<usize>() as u64;
        let v: Vec<f32> = (0..len)
            .map(|i| {
                let h = (i + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
                    ^ seed.wrapping_mul(0xD6E8_FEB8_6659_FD93);
                let u = (h >> 40) as f32 / (1u64 << 24) as f32;
                0.5 + 2.0 * (u * 2.0 - 1.0) * 1.7
            })
            .collect();
        Tensor::from_data(TensorData::new(v, shape), device)
    }

    /// `t`'s values as bit patterns, for comparisons that must be exact.
    fn bits_of<const D: usize>(t: Tensor<D>) -> Vec<u32> {
        values_of(t).iter().map(|v| v.to_bits()).collect()
    }

    /// `a` and `b` of one shape, equal within `tol` relative (plus `tol`
    /// absolute); `what` names them in a failure.
    pub(super) fn close<const D: usize>(a: Tensor<D>, b: Tensor<D>, tol: f32, what: &str) {
        assert_eq!(a.dims(), b.dims(), "{what}: shapes");
        let (a, b) = (values_of(a), values_of(b));
        for (x, y) in a.iter().zip(&b) {
            assert!((x - y).abs() <= tol * (1.0 + y.abs()), "{what}: {x} vs {y}");
        }
    }

    /// The same loss, Σ pool(relu(conv(x)))², through fedweave's kernels and
    /// burn's: equal outputs and gradients for the input, weight and bias.
    /// Odd sizes; conv stride 1 and 2, padding 0 and 1; 2×2 pooling and
    /// FedDWA's 3×3 of stride 2 with padding 1.
    #[test]
    fn conv_and_pool_agree_with_burn_forward_and_backward() {
        let device = Device::flex().autodiff();
        let normal = Distribution::Normal(0.0, 1.0);
        let x = Tensor::<4>::random([3, 2, 11, 9], normal, &device).require_grad();
        let w = Tensor::<4>::random([4, 2, 3, 3], normal, &device).require_grad();
        let b = Tensor::<1>::random([4], normal, &device).require_grad();
        for (stride, pad, pool_options) in [
            (2, 1, MaxPoolOptions::new([2, 2])),
            (1, 0, MaxPoolOptions::new([2, 2])),
            (
                1,
                1,
                MaxPoolOptions::new([3, 3])
                    .with_stride([2, 2])
                    .with_padding([1, 1]),
            ),
        ] {
            let options = ConvOptions::new([stride, stride], [pad, pad], [1, 1], 1);
            let run = |ours: bool| {
                let (x, w, b) = (x.clone(), w.clone(), b.clone());
                let y = if ours {
                    let z = conv2d(x.clone(), w.clone(), Some(b.clone()), options.clone());
                    max_pool2d(relu(z), pool_options.clone())
                } else {
                    use burn::tensor::module::{conv2d, max_pool2d};
                    let z = conv2d(x.clone(), w.clone(), Some(b.clone()), options.clone());
                    max_pool2d(relu(z), pool_options.clone())
                };
                let grads = (y.clone() * y.clone()).sum().backward();
                let grad = |t: &Tensor<4>| t.grad(&grads).expect("a gradient");
                (
                    y.inner(),
                    grad(&x),
                    grad(&w),
                    b.grad(&grads).expect("a gradient"),
                )
            };
            let (y1, dx1, dw1, db1) = run(true);
            let (y2, dx2, dw2, db2) = run(false);
            close(y1, y2, 1e-5, "y");
            close(dx1, dx2, 1e-4, "dx");
            close(dw1, dw2, 1e-4, "dw");
            close(db1, db2, 1e-4, "db");
        }
    }

    /// The dense layer through [`dense`] and through burn's `linear`: the
    /// same bits in the output and all three gradients, with and without
    /// autodiff, on shapes around `gemm`'s microkernel and depth blocks
    /// (one row, one column, a depth over 512) and a row-offset input (a
    /// narrowed tensor, as the conditional layer passes).
    #[test]
    fn dense_layer_has_burns_bits() {
        let device = Device::flex().autodiff();
        let normal = Distribution::Normal(0.0, 1.0);
        for (m, k, n) in [
            (16, 784, 200),
            (1, 7, 3),
            (5, 1, 1),
            (64, 2304, 33),
            (3, 600, 1),
        ] {
            let all = Tensor::<2>::random([m + 2, k], normal, &device);
            let x = all.narrow(0, 2, m).require_grad();
            let w = Tensor::<2>::random([k, n], normal, &device).require_grad();
            let b = Tensor::<1>::random([n], normal, &device).require_grad();
            let probe = Tensor::<2>::random([m, n], normal, &device);
            let run = |ours: bool| {
                let (x, w, b) = (x.clone(), w.clone(), b.clone());
                let y = if ours {
                    linear(x.clone(), w.clone(), Some(b.clone()))
                } else {
                    burn::tensor::module::linear(x.clone(), w.clone(), Some(b.clone()))
                };
                let grads = (y.clone() * probe.clone()).sum().backward();
                (
                    bits_of(y.inner()),
                    bits_of(x.grad(&grads).expect("a gradient")),
                    bits_of(w.grad(&grads).expect("a gradient")),
                    bits_of(b.grad(&grads).expect("a gradient")),
                )
            };
            assert!(run(true) == run(false), "{m}×{k}·{k}×{n}");
            let (xi, wi, bi) = (x.clone().inner(), w.clone().inner(), b.clone().inner());
            let plain = bits_of(linear(xi.clone(), wi.clone(), Some(bi.clone())));
            assert!(plain == bits_of(burn::tensor::module::linear(xi, wi, Some(bi))));
        }
    }

    /// Batch norm through the fused kernel and through burn's composition
    /// (the one other backends run): equal outputs, statistics and
    /// gradients.
    #[test]
    fn fused_batch_norm_agrees_with_burns_composition() {
        let device = Device::flex().autodiff();
        let normal = Distribution::Normal(0.5, 2.0);
        let y = Tensor::<4>::random([4, 3, 5, 6], normal, &device).require_grad();
        let gamma = Tensor::<1>::random([3], normal, &device).require_grad();
        let beta = Tensor::<1>::random([3], normal, &device).require_grad();
        let w = Tensor::<4>::random([4, 3, 5, 6], normal, &device);
        assert!(on_cpu_f32(&y));
        let op = batch_norm_for(&y).expect("the CPU in f32 has the fused kernel");
        let (out, mean, var) = batch_norm_train(op, y.clone(), gamma.clone(), beta.clone(), 1e-5);
        let g1 = (out.clone() * w.clone()).sum().backward();
        let m = y.clone().mean_dims(&[0, 2, 3]);
        let v = (y.clone() - m.clone()).square().mean_dims(&[0, 2, 3]);
        let scale = gamma.clone().reshape([1, 3, 1, 1]);
        let shift = beta.clone().reshape([1, 3, 1, 1]);
        let reference = (y.clone() - m.clone()) / (v.clone() + 1e-5).sqrt() * scale + shift;
        let g2 = (reference.clone() * w).sum().backward();
        close(out.inner(), reference.inner(), 1e-5, "out");
        close(mean, m.inner().reshape([3]), 1e-5, "mean");
        close(var, v.inner().reshape([3]), 1e-5, "var");
        close(
            y.grad(&g1).expect("dy"),
            y.grad(&g2).expect("dy"),
            1e-4,
            "dy",
        );
        close(
            gamma.grad(&g1).expect("dγ"),
            gamma.grad(&g2).expect("dγ"),
            1e-4,
            "dγ",
        );
        close(
            beta.grad(&g1).expect("dβ"),
            beta.grad(&g2).expect("dβ"),
            1e-4,
            "dβ",
        );
    }

    /// The f32 bit patterns of a tensor.
    fn bits<const D: usize>(t: Tensor<D>) -> Vec<u32> {
        values_of(t).iter().map(|v| v.to_bits()).collect()
    }

    /// The fused ReLUs have the bits of ReLU as its own operation, forward
    /// and backward: batch norm then ReLU, and ReLU then max pooling as
    /// pooling then ReLU (2×2 windows, and 3×3 of stride 2 with padding 1
    /// whose windows overlap), on values with whole windows ≤ 0, ties, −0
    /// and a NaN.
    #[test]
    fn fused_relus_have_the_bits_of_relu_apart() {
        let device = Device::flex().autodiff();
        let normal = Distribution::Normal(0.0, 1.0);
        let raw = values_of(Tensor::<4>::random([3, 4, 9, 10], normal, &device));
        let v: Vec<f32> = raw
            .iter()
            .enumerate()
            .map(|(i, &x)| match i % 23 {
                0 => -0.0,
                1 => 0.0,
                2 => -x.abs(),
                _ if i == 200 => f32::NAN,
                // Quantised: ties inside windows.
                _ => (x * 4.0).round() / 4.0,
            })
            .collect();
        let x = Tensor::<4>::from_data(TensorData::new(v, [3, 4, 9, 10]), &device).require_grad();
        let gamma = Tensor::<1>::from_data([1.5f32, 0.0, -0.5, 1.0], &device).require_grad();
        let beta = Tensor::<1>::from_data([0.1f32, -0.0, 0.2, -0.3], &device).require_grad();
        let w = Tensor::<4>::random([3, 4, 9, 10], normal, &device);
        // Batch norm, then ReLU.
        let run_bn = |fused: bool| {
            let (x, gamma, beta) = (x.clone(), gamma.clone(), beta.clone());
            let out = if fused {
                batch_norm_relu_train(x.clone(), gamma.clone(), beta.clone(), 1e-5).0
            } else {
                let op = batch_norm_for(&x).expect("the CPU kernel");
                relu(batch_norm_train(op, x.clone(), gamma.clone(), beta.clone(), 1e-5).0)
            };
            let grads = (out.clone() * w.clone()).sum().backward();
            let x_grad = x.grad(&grads).expect("dx");
            (
                bits(out.inner()),
                bits(x_grad),
                bits(gamma.grad(&grads).expect("dγ")),
            )
        };
        assert_eq!(run_bn(true), run_bn(false), "batch norm then ReLU");
        // ReLU, then max pooling.
        for options in [
            MaxPoolOptions::new([2, 2]),
            MaxPoolOptions::new([3, 3])
                .with_stride([2, 2])
                .with_padding([1, 1]),
        ] {
            let run_pool = |fused: bool| {
                let y = if fused {
                    relu_max_pool2d(x.clone(), options.clone())
                } else {
                    max_pool2d(relu(x.clone()), options.clone())
                };
                // Output gradients that are not zero where the output is.
                let dims = y.dims();
                let r: Vec<f32> = (0..dims.iter().product::<usize>())
                    .map(|i| (i % 7) as f32 - 2.5)
                    .collect();
                let r = Tensor::<4>::from_data(TensorData::new(r, dims), &device);
                let grads = (y.clone() * r).sum().backward();
                (bits(y.inner()), bits(x.grad(&grads).expect("dx")))
            };
            let (fused, apart) = (run_pool(true), run_pool(false));
            assert!(fused.0.iter().any(|&b| f32::from_bits(b).is_nan()));
            assert_eq!(fused, apart, "ReLU then {options:?}");
        }
    }

    /// Shapes the kernels do not cover fall back to burn's operations (a
    /// grouped convolution's forward is burn's too).
    #[test]
    fn uncovered_shapes_take_burns_operations() {
        let device = Device::flex();
        let x = Tensor::<4>::random([2, 4, 7, 7], Distribution::Default, &device);
        let w = Tensor::<4>::random([4, 2, 3, 3], Distribution::Default, &device);
        let grouped = ConvOptions::new([1, 1], [1, 1], [1, 1], 2);
        close(
            conv2d(x.clone(), w.clone(), None, grouped.clone()),
            burn::tensor::module::conv2d(x.clone(), w, None, grouped),
            0.0,
            "grouped conv",
        );
        let ceil = MaxPoolOptions::new([2, 2]).with_ceil_mode(true);
        close(
            max_pool2d(x.clone(), ceil.clone()),
            burn::tensor::module::max_pool2d(x, ceil),
            0.0,
            "ceil-mode pooling",
        );
    }
}
