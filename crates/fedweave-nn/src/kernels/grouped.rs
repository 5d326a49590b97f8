//! Grouped convolution, and dense convolution (off the CPU) whose weight
//! gradient is one batched matmul over gathered columns. Off the CPU every
//! convolution's forward pass and weight gradient take the columns and
//! batched matmuls: 2.1× the client-steps/s of burn-cubecl's direct
//! kernels for `cnn-bn` (K = 10, batch 10) and 1.5–1.6× for `cnn` (K = 100,
//! batch 16) on an H200 (docs/results.md, "GPU, session 44"); one model's
//! since session 46 (unmeasured on a device: two launches a layer against
//! the direct kernels' five with their channels-last copies). On the CPU
//! they keep one grouped convolution for the weight gradient (the columns
//! are 0.6–0.9× burn-flex's there). `FEDWEAVE_GROUPED_CONV=direct|columns`
//! overrides the choice ([`Lowering`]). On the cube backends one kernel
//! writes the columns; burn's operations (the CPU, `cuda-tuned`) gather
//! them through an index per window, uploaded once per thread and kept.
//!
//! burn differentiates a grouped convolution's weight group by group: per
//! group a slice of the input, a slice of the output gradient, one
//! convolution and a slice-assign (burn-backend's default, and burn-cubecl's
//! fallback on CUDA). The batched trainer runs K clients' convolutions as
//! one convolution of K groups, so at K = 100 a step of a two-conv model
//! launched about 600 kernels for the weight gradients alone, most of its
//! time on a GPU (Nsight Compute on an H100, docs/results.md).
//!
//! The weight gradient of every group is one convolution: with the batch
//! and channel axes exchanged, dW[o, c, i, j] = Σ_n Σ_{p,q} x[n, c, i + s·p,
//! j + s·q] · dy[n, o, p, q] is a convolution of the input (its channels
//! the samples) by the output gradient (its window the output positions),
//! with the forward's stride as dilation; grouping the samples by group
//! keeps each group's products apart. [`GroupedConv`] is that operation
//! with its backward step, for every backend (a backend extension over
//! burn's own operations, so a GPU runs it as burn's kernels).

#[cfg(any(feature = "cuda", feature = "wgpu"))]
use burn::backend::Cube;
use burn::backend::autodiff::NodeId;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::tensor::{FloatTensor, IntTensor};
use burn::backend::{
    Autodiff, AutodiffBackend, Backend, Dispatch, Flex, TensorMetadata, backend_extension,
};
use burn::tensor::ops::ConvOptions;
use burn::tensor::{Shape, Slice, Tensor, TensorData};

/// A 2-d convolution of `groups` groups, differentiated in one
/// convolution per gradient.
#[backend_extension(Flex, Cube: cfg(any(feature = "cuda", feature = "wgpu")), Autodiff)]
pub trait GroupedConv: Backend {
    /// Convolution of `x` (`[n, g·c, h, w]`) by `weight` (`[g·o, c, kh,
    /// kw]`) in `groups` groups, plus `bias` (`[g·o]`), with `stride` and
    /// zero `padding` on both axes.
    fn conv2d_grouped(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        stride: usize,
        padding: usize,
        groups: usize,
    ) -> FloatTensor<Self>;

    /// [`GroupedConv::conv2d_grouped`] without a bias.
    fn conv2d_grouped_no_bias(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        stride: usize,
        padding: usize,
        groups: usize,
    ) -> FloatTensor<Self>;

    /// The bias gradient at output gradient `dy` (`[n, c, h, w]`): each
    /// channel's sum over the samples and the plane, `[c]`.
    fn conv_bias_grad(dy: FloatTensor<Self>) -> FloatTensor<Self>;

    /// The column matrices of `x` (`[n, g·c, h, w]`) under a `kh`×`kw`
    /// window of `stride` and zero `padding`, group by group: `[n, g,
    /// c·kh·kw, oh·ow]`, row (c, i, j) holding the input value under tap
    /// (i, j) of channel c at each output position (zero in the padding).
    fn conv_columns(
        x: FloatTensor<Self>,
        groups: usize,
        kh: usize,
        kw: usize,
        stride: usize,
        padding: usize,
    ) -> FloatTensor<Self>;
}

fn options(stride: usize, padding: usize, groups: usize) -> ConvOptions<2> {
    ConvOptions::new([stride, stride], [padding, padding], [1, 1], groups)
}

/// burn's `conv2d` through [`GroupedConv`] (any number of groups, no
/// dilation, the same stride and padding on both axes); anything else
/// through burn's `conv2d`.
pub(crate) fn conv2d(
    x: Tensor<4>,
    weight: Tensor<4>,
    bias: Option<Tensor<1>>,
    options: ConvOptions<2>,
) -> Tensor<4> {
    let Some((s, p)) = super::square_geometry(&options) else {
        return burn::tensor::module::conv2d(x, weight, bias, options);
    };
    let (x, weight, g) = (x.into_dispatch(), weight.into_dispatch(), options.groups);
    Tensor::from_dispatch(match bias {
        Some(b) => <Dispatch as GroupedConv>::conv2d_grouped(x, weight, b.into_dispatch(), s, p, g),
        None => <Dispatch as GroupedConv>::conv2d_grouped_no_bias(x, weight, s, p, g),
    })
}

/// The forward pass on any backend: burn's convolution, or for more than
/// one group the backend's [`Lowering`].
fn forward<B: GroupedConv>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    bias: Option<FloatTensor<B>>,
    stride: usize,
    padding: usize,
    groups: usize,
) -> FloatTensor<B> {
    forward_keeping::<B>(x, weight, bias, (stride, padding, groups)).0
}

/// [`forward`], with the column matrices when it gathered them and they
/// hold at most [`KEPT_COLUMNS`] values: the weight gradient reads them
/// instead of gathering them again (a launch per layer saved on a GPU step
/// that is bound by its launches).
fn forward_keeping<B: GroupedConv>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    bias: Option<FloatTensor<B>>,
    (stride, padding, groups): (usize, usize, usize),
) -> (FloatTensor<B>, Option<FloatTensor<B>>) {
    let columns = column_len(x.shape().dims(), weight.shape().dims(), stride, padding);
    match lowering::<B>(columns) {
        Lowering::Direct => (
            B::conv2d(x, weight, bias, options(stride, padding, groups)),
            None,
        ),
        Lowering::Columns => {
            let (out, cols) = forward_by_columns::<B>(x, weight, bias, stride, padding, groups);
            (out, (columns <= KEPT_COLUMNS).then_some(cols))
        }
    }
}

/// The largest column matrix (values) the forward pass keeps for the
/// weight gradient: 2²⁴ `f32`, 64 MiB a layer. Small models, whose GPU
/// steps are bound by their launches, keep theirs; larger ones gather them
/// again rather than hold every layer's at once between the passes.
const KEPT_COLUMNS: usize = 1 << 24;

/// The lowering of a convolution on backend `B` whose column matrix would
/// hold `columns` values: the columns off the CPU when
/// the matrix fits [`MAX_COLUMNS`], unless the environment says otherwise
/// ([`lowering_override`]). One model's (a single group) too: burn-cubecl's
/// direct kernels work channels-last, with layout copies around them (a
/// `resnet8` step of one model had 49 of them), and the weight gradient
/// takes the columns anyway.
fn lowering<B: Backend>(columns: usize) -> Lowering {
    use std::any::TypeId;
    if let Some(chosen) = lowering_override() {
        chosen
    } else if TypeId::of::<B>() == TypeId::of::<Flex>() || columns > MAX_COLUMNS {
        Lowering::Direct
    } else {
        Lowering::Columns
    }
}

/// The largest column matrix (values) a grouped convolution is lowered to
/// by default: 2²⁸ `f32`, 1 GiB. The direct kernels need no such buffer,
/// so a GPU that batched, say, ten ResNet-18s at batch 64 (a first layer's
/// columns: 1.5 GB) keeps them rather than running out of memory.
const MAX_COLUMNS: usize = 1 << 28;

/// Values in the column matrix of a convolution of `x` (`[n, g·c, h, w]`)
/// by `weight` (`[g·o, c, kh, kw]`): `n · g·c·kh·kw · oh·ow`.
fn column_len(x: [usize; 4], weight: [usize; 4], stride: usize, padding: usize) -> usize {
    let [n, gc, ..] = x;
    let [_, _, kh, kw] = weight;
    let (oh, ow) = Window::over(x, [kh, kw], stride, padding).out();
    n * gc * kh * kw * oh * ow
}

/// The bias gradient as burn's operations: per channel, over each sample's
/// plane and then the batch (the same two contiguous sums as
/// `model::channel_sums`, no transpose).
fn bias_grad_composed<B: Backend>(dy: FloatTensor<B>) -> FloatTensor<B> {
    let [n, c, h, w] = dy.shape().dims::<4>();
    let t = B::float_reshape(dy, Shape::new([n, c, h * w]));
    let t = B::float_sum_dim(B::float_sum_dim(t, 2), 0);
    B::float_reshape(t, Shape::new([c]))
}

/// [`GroupedConv`] for a backend without autodiff: burn's own forward, the
/// bias gradient by `$bias_grad` and the columns by `$columns`.
macro_rules! forward_only {
    ($backend:ty, $bias_grad:path, $columns:path) => {
        impl GroupedConv for $backend {
            fn conv2d_grouped(
                x: FloatTensor<Self>,
                weight: FloatTensor<Self>,
                bias: FloatTensor<Self>,
                stride: usize,
                padding: usize,
                groups: usize,
            ) -> FloatTensor<Self> {
                forward::<Self>(x, weight, Some(bias), stride, padding, groups)
            }

            fn conv2d_grouped_no_bias(
                x: FloatTensor<Self>,
                weight: FloatTensor<Self>,
                stride: usize,
                padding: usize,
                groups: usize,
            ) -> FloatTensor<Self> {
                forward::<Self>(x, weight, None, stride, padding, groups)
            }

            fn conv_bias_grad(dy: FloatTensor<Self>) -> FloatTensor<Self> {
                $bias_grad(dy)
            }

            fn conv_columns(
                x: FloatTensor<Self>,
                groups: usize,
                kh: usize,
                kw: usize,
                stride: usize,
                padding: usize,
            ) -> FloatTensor<Self> {
                $columns(x, groups, [kh, kw], stride, padding)
            }
        }
    };
}

forward_only!(Flex, bias_grad_composed::<Flex>, gathered_columns::<Flex>);
#[cfg(all(any(feature = "cuda", feature = "wgpu"), not(feature = "cuda-tuned")))]
forward_only!(Cube, cube::bias_grad, cube::columns);
// With burn's `fusion` (`cuda-tuned`) the sums and the gather are burn's.
#[cfg(feature = "cuda-tuned")]
forward_only!(Cube, bias_grad_composed::<Cube>, gathered_columns::<Cube>);

#[cfg(all(any(feature = "cuda", feature = "wgpu"), not(feature = "cuda-tuned")))]
mod cube {
    //! The bias gradient in one kernel: one cube per channel, its units
    //! striding over the channel's n·h·w values and meeting for the sum
    //! (burn's two reductions were two launches per layer). The columns in
    //! one kernel: the gather was a select after a zero fill and two slice
    //! assignments for padded planes, and its index an upload kept per
    //! thread (docs/results.md, "GPU, session 44").

    use super::super::cube::{F32, THREADS, address, channel_value, cube_sum, empty_f32, units};
    use super::{Window, bias_grad_composed, gathered_columns};
    use burn::tensor::{DType, Shape};
    use burn_cubecl::CubeBackend;
    use burn_cubecl::kernel::into_contiguous;
    use burn_cubecl::tensor::CubeTensor;
    use cubecl::prelude::*;

    #[cube(launch_unchecked, address_type = "dynamic")]
    fn bias_grad_kernel<F: Float>(
        dy: &Tensor<F>,
        out: &mut Tensor<F>,
        channels: usize,
        plane: usize,
        len: usize,
        #[define(F)] _dtype: ElemType,
    ) {
        let ch = CUBE_POS;
        let mut sums = Shared::new_slice(THREADS as usize);
        let mut acc = F::new(0.0);
        let mut i = UNIT_POS as usize;
        while i < len {
            acc += dy[channel_value(i, ch, channels, plane)];
            i += CUBE_DIM as usize;
        }
        let total = cube_sum::<F>(acc, &mut sums);
        if UNIT_POS == 0 {
            out[ch] = total;
        }
    }

    /// One unit per column value (`[n, g·c·kh·kw, oh·ow]` in order): the
    /// input value under its tap, or zero in the padding.
    #[cube(launch_unchecked, address_type = "dynamic")]
    #[allow(clippy::too_many_arguments)]
    fn columns_kernel<F: Float>(
        x: &Tensor<F>,
        cols: &mut Tensor<F>,
        channels: usize,
        h: usize,
        w: usize,
        kh: usize,
        kw: usize,
        ow: usize,
        positions: usize,
        stride: usize,
        padding: usize,
        #[define(F)] _dtype: ElemType,
    ) {
        if ABSOLUTE_POS >= cols.len() {
            terminate!();
        }
        let taps = kh * kw;
        let l = ABSOLUTE_POS % positions;
        let row = (ABSOLUTE_POS / positions) % (channels * taps);
        let sample = ABSOLUTE_POS / (positions * channels * taps);
        let (ch, tap) = (row / taps, row % taps);
        // Padded coordinates (no negative values): y + padding, x + padding.
        let y = (l / ow) * stride + tap / kw;
        let xx = (l % ow) * stride + tap % kw;
        let mut v = F::new(0.0);
        if y >= padding && xx >= padding && y - padding < h && xx - padding < w {
            v = x[((sample * channels + ch) * h + y - padding) * w + xx - padding];
        }
        cols[ABSOLUTE_POS] = v;
    }

    /// [`super::GroupedConv::conv_columns`] in one launch (no gather index,
    /// no zero-padded copy of the planes).
    pub(super) fn columns(
        x: CubeTensor,
        groups: usize,
        [kh, kw]: [usize; 2],
        stride: usize,
        padding: usize,
    ) -> CubeTensor {
        let [n, gc, h, w] = x.meta.shape().dims::<4>();
        let (oh, ow) = Window::over([n, gc, h, w], [kh, kw], stride, padding).out();
        let len = n * gc * kh * kw * oh * ow;
        if x.dtype != DType::F32 || len == 0 {
            return gathered_columns::<CubeBackend>(x, groups, [kh, kw], stride, padding);
        }
        let x = into_contiguous(x);
        let cols = empty_f32(&x, Shape::new([n, groups, gc / groups * kh * kw, oh * ow]));
        let (count, dim) = units(&cols, len);
        let address = address(&[&x, &cols]);
        // SAFETY: one unit per column value (checked); a tap inside the
        // plane reads (sample, channel, y, x) of the contiguous input.
        unsafe {
            columns_kernel::launch_unchecked(
                &x.client.clone(),
                count,
                dim,
                address,
                x.into_tensor_arg(),
                cols.clone().into_tensor_arg(),
                gc,
                h,
                w,
                kh,
                kw,
                ow,
                oh * ow,
                stride,
                padding,
                F32,
            );
        }
        cols
    }

    /// [`super::GroupedConv::conv_bias_grad`] in one launch.
    pub(super) fn bias_grad(dy: CubeTensor) -> CubeTensor {
        let [n, c, h, w] = dy.meta.shape().dims::<4>();
        let threads_fit = dy.client.properties().hardware.max_cube_dim.0 >= THREADS;
        if dy.dtype != DType::F32 || !threads_fit || c == 0 {
            return bias_grad_composed::<CubeBackend>(dy);
        }
        let dy = into_contiguous(dy);
        let out = empty_f32(&dy, Shape::new([c]));
        let address = address(&[&dy]);
        // SAFETY: one cube per channel (c of them); unit reads stay below
        // n·c·h·w of the contiguous `dy`, and unit 0 writes out[ch < c].
        unsafe {
            bias_grad_kernel::launch_unchecked(
                &dy.client.clone(),
                CubeCount::Static(c as u32, 1, 1),
                CubeDim::new_1d(THREADS),
                address,
                dy.into_tensor_arg(),
                out.clone().into_tensor_arg(),
                c,
                h * w,
                n * h * w,
                F32,
            );
        }
        out
    }
}

/// dW of a grouped convolution of `x` (`[n, g·c, h, w]`) with output
/// gradient `dy` (`[n, g·o, oh, ow]`), for a weight of `[g·o, c, kh, kw]`:
/// one convolution of x′ = `[c, g·n, h, w]` (x′[c, g·n + m] = x[m, g·c + c])
/// by dy′ = `[g·o, n, oh, ow]` (dy′[g·o + o, m] = dy[m, g·o + o]) in `g`
/// groups, dilated by the stride, then `[c, g·o, …]` turned to
/// `[g·o, c, …]` and cut to the kernel's size (the window can exceed it
/// when the stride does not divide the padded input).
fn weight_grad<B: Backend>(
    x: FloatTensor<B>,
    dy: FloatTensor<B>,
    weight: [usize; 4],
    stride: usize,
    padding: usize,
    groups: usize,
) -> FloatTensor<B> {
    let [n, gc, h, w] = x.shape().dims::<4>();
    let [_, go, oh, ow] = dy.shape().dims::<4>();
    let (c, o) = (gc / groups, go / groups);
    let x = B::float_reshape(x, Shape::new([n, groups, c, h, w]));
    let x = B::float_permute(x, &[2, 1, 0, 3, 4]);
    let x = B::float_reshape(x, Shape::new([c, groups * n, h, w]));
    let dy = B::float_reshape(dy, Shape::new([n, groups, o, oh, ow]));
    let dy = B::float_permute(dy, &[1, 2, 0, 3, 4]);
    let dy = B::float_reshape(dy, Shape::new([go, n, oh, ow]));
    let g = B::conv2d(
        x,
        dy,
        None,
        ConvOptions::new([1, 1], [padding, padding], [stride, stride], groups),
    );
    let g = B::float_swap_dims(g, 0, 1);
    let [_, _, gh, gw] = g.shape().dims::<4>();
    let [_, _, kh, kw] = weight;
    if (gh, gw) == (kh, kw) {
        g
    } else {
        B::float_slice(
            g,
            &[
                Slice::from(0..go),
                Slice::from(0..c),
                Slice::from(0..kh),
                Slice::from(0..kw),
            ],
        )
    }
}

/// How a convolution's forward pass and weight gradient run when they do
/// not take fedweave's CPU kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lowering {
    /// burn's convolution (forward), and for more than one group one
    /// grouped convolution for the weight gradient ([`weight_grad`]).
    Direct,
    /// Gathered columns and batched matmuls ([`columns`]): forward and
    /// weight gradient.
    Columns,
}

/// The lowering `FEDWEAVE_GROUPED_CONV` asks for grouped convolutions
/// (`direct` or `columns`, to compare), read once; `None` when unset or
/// anything else. A dense convolution's weight gradient always takes the
/// columns (a direct kernel whose window is the whole output plane runs on
/// a grid of 2 blocks on a GPU; docs/results.md, session 22).
fn lowering_override() -> Option<Lowering> {
    static CHOICE: std::sync::OnceLock<Option<Lowering>> = std::sync::OnceLock::new();
    *CHOICE.get_or_init(|| {
        super::env_choice(
            "FEDWEAVE_GROUPED_CONV",
            &[("columns", Lowering::Columns), ("direct", Lowering::Direct)],
        )
    })
}

/// The window of a convolution over one input plane: what the gather index
/// of [`columns`] depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Window {
    h: usize,
    w: usize,
    kh: usize,
    kw: usize,
    stride: usize,
    padding: usize,
}

impl Window {
    /// The window of a `kh`×`kw` kernel over the planes of `x` (`[n, c, h, w]`).
    fn over(x: [usize; 4], [kh, kw]: [usize; 2], stride: usize, padding: usize) -> Self {
        let [_, _, h, w] = x;
        Self {
            h,
            w,
            kh,
            kw,
            stride,
            padding,
        }
    }

    /// Output rows and columns.
    fn out(&self) -> (usize, usize) {
        let out = |n: usize, k: usize| (n + 2 * self.padding - k) / self.stride + 1;
        (out(self.h, self.kh), out(self.w, self.kw))
    }

    /// For each tap (i, j) and output position (p, q), in that order, the
    /// index in the plane of the input value under the tap, `h·w` (a zero
    /// appended to the plane) for taps in the padding; and whether any is.
    fn index(&self) -> (Vec<i32>, bool) {
        let (oh, ow) = self.out();
        let (taps, zero) = (self.kh * self.kw, (self.h * self.w) as i32);
        let (mut index, mut padded) = (Vec::with_capacity(taps * oh * ow), false);
        for (i, j) in (0..self.kh).flat_map(|i| (0..self.kw).map(move |j| (i, j))) {
            for (p, q) in (0..oh).flat_map(|p| (0..ow).map(move |q| (p, q))) {
                let r = (p * self.stride + i).checked_sub(self.padding);
                let s = (q * self.stride + j).checked_sub(self.padding);
                index.push(match (r, s) {
                    (Some(r), Some(s)) if r < self.h && s < self.w => (r * self.w + s) as i32,
                    _ => {
                        padded = true;
                        zero
                    }
                });
            }
        }
        (index, padded)
    }
}

/// A window's gather index on one backend, device and thread, uploaded
/// once and kept: a step recorded into a CUDA graph may not upload, and the
/// index depends on the window only (not on the batch or the channels).
///
/// Kept per thread (a thread-local, freed with its thread) because cubecl
/// gives each thread its own stream, and a launch that reads a buffer of
/// another stream pins it and may wait on that stream (cubecl-server's
/// `align_streams`), which a recording cannot hold. Shared across threads,
/// the columns' indices made in round 1 were followed by every later
/// round's recording failing on an H200 (`CUDA_ERROR_STREAM_CAPTURE_
/// INVALIDATED`; those rounds were retrained step by step), as a round's
/// batched group runs on whichever worker is free; the direct kernels,
/// which use no kept index, recorded every round.
fn gather_index<B: Backend>(window: Window, device: &B::Device) -> (IntTensor<B>, bool) {
    use std::any::{Any, TypeId};
    use std::cell::RefCell;
    use std::collections::HashMap;
    type Key = (TypeId, String, Window);
    thread_local! {
        static KEPT: RefCell<HashMap<Key, Box<dyn Any>>> = RefCell::new(HashMap::new());
    }
    let key = (TypeId::of::<B>(), format!("{device:?}"), window);
    KEPT.with_borrow_mut(|kept| {
        if let Some(index) = kept
            .get(&key)
            .and_then(|k| k.downcast_ref::<(IntTensor<B>, bool)>())
        {
            return index.clone();
        }
        let (index, padded) = window.index();
        let len = index.len();
        let made = (
            B::int_from_data(TensorData::new(index, [len]), device),
            padded,
        );
        kept.insert(key, Box::new(made.clone()));
        made
    })
}

/// The column matrices of `x` ([`GroupedConv::conv_columns`]) and the
/// output's rows and columns.
fn columns<B: GroupedConv>(
    x: FloatTensor<B>,
    groups: usize,
    [kh, kw]: [usize; 2],
    stride: usize,
    padding: usize,
) -> (FloatTensor<B>, (usize, usize)) {
    let out = Window::over(x.shape().dims(), [kh, kw], stride, padding).out();
    (B::conv_columns(x, groups, kh, kw, stride, padding), out)
}

/// [`GroupedConv::conv_columns`] as burn's operations: one `select` along
/// each sample's plane, with a zero appended to the plane when a tap
/// reaches the padding.
fn gathered_columns<B: Backend>(
    x: FloatTensor<B>,
    groups: usize,
    [kh, kw]: [usize; 2],
    stride: usize,
    padding: usize,
) -> FloatTensor<B> {
    let [n, gc, h, w] = x.shape().dims::<4>();
    let window = Window::over([n, gc, h, w], [kh, kw], stride, padding);
    let (oh, ow) = window.out();
    let device = x.device();
    let (index, padded) = gather_index::<B>(window, &device);
    let plane = B::float_reshape(x, Shape::new([n, gc, h * w]));
    let plane = if padded {
        let dtype = plane.dtype().into();
        let zeros = B::float_zeros(Shape::new([n, gc, 1]), &device, dtype);
        B::float_cat(vec![plane, zeros], 2)
    } else {
        plane
    };
    let cols = B::float_select(plane, 2, index);
    B::float_reshape(
        cols,
        Shape::new([n, groups, gc / groups * kh * kw, oh * ow]),
    )
}

/// The forward pass through [`columns`]: out[n, g, o, l] = Σ_k W[g, o, k] ·
/// cols[n, g, k, l], one matmul batched over samples and groups (the
/// weight broadcast over the samples), plus the bias. Also the columns.
fn forward_by_columns<B: GroupedConv>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    bias: Option<FloatTensor<B>>,
    stride: usize,
    padding: usize,
    groups: usize,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let n = x.shape().dims::<4>()[0];
    let [go, c, kh, kw] = weight.shape().dims::<4>();
    let (cols, (oh, ow)) = columns::<B>(x, groups, [kh, kw], stride, padding);
    let weight = B::float_reshape(weight, Shape::new([1, groups, go / groups, c * kh * kw]));
    let out = B::float_matmul(weight, cols.clone());
    let out = B::float_reshape(out, Shape::new([n, go, oh, ow]));
    let out = match bias {
        Some(b) => B::float_add(out, B::float_reshape(b, Shape::new([1, go, 1, 1]))),
        None => out,
    };
    (out, cols)
}

/// dW through [`columns`]: dW[g, o, k] = Σ_n Σ_l dy[n, g, o, l] · cols[n,
/// g, k, l], one matmul batched over samples and groups, summed over the
/// samples at the end (the samples are the batch of the matmul so that a
/// GPU spreads the long sum over many blocks).
fn weight_grad_by_columns<B: GroupedConv>(
    x: FloatTensor<B>,
    dy: FloatTensor<B>,
    [go, c, kh, kw]: [usize; 4],
    stride: usize,
    padding: usize,
    groups: usize,
) -> FloatTensor<B> {
    let (cols, _) = columns::<B>(x, groups, [kh, kw], stride, padding);
    weight_grad_from_columns::<B>(cols, dy, [go, c, kh, kw], groups)
}

/// [`weight_grad_by_columns`] from the input's column matrices `cols`
/// (`[n, g, c·kh·kw, oh·ow]`).
fn weight_grad_from_columns<B: Backend>(
    cols: FloatTensor<B>,
    dy: FloatTensor<B>,
    [go, c, kh, kw]: [usize; 4],
    groups: usize,
) -> FloatTensor<B> {
    let [n, _, oh, ow] = dy.shape().dims::<4>();
    let cols = B::float_swap_dims(cols, 2, 3);
    let dy = B::float_reshape(dy, Shape::new([n, groups, go / groups, oh * ow]));
    let per_sample = B::float_matmul(dy, cols);
    let dw = B::float_sum_dim(per_sample, 0);
    B::float_reshape(dw, Shape::new([go, c, kh, kw]))
}

/// dx of a stride-1 convolution with a square `k`×`k` window and padding
/// `p < k` as a convolution through [`columns`]: dy padded by `k − 1 − p`,
/// convolved group by group with the weight turned to `[g·c, o, k, k]` and
/// flipped on both axes (dx[n, g, c, y, x] = Σ_o Σ_{i,j} dy[n, g, o, y + i −
/// (k − 1 − p), x + j − (k − 1 − p)] · W[g, o, c, k − 1 − i, k − 1 − j]),
/// which gives back the input's `h`×`w`. Where `p < k − 1` it multiplies
/// zeros in the padding (2.25× the products for `cnn-bn`'s 5×5 from 8×8
/// back to 12×12), traded on a GPU for one batched matmul instead of
/// burn-cubecl's direct transposed convolution (session 24: 244 µs a step
/// for `cnn-bn`'s second layer at K = 10, batch 10, on an H100).
fn input_grad_by_columns<B: GroupedConv>(
    dy: FloatTensor<B>,
    weight: FloatTensor<B>,
    [h, w]: [usize; 2],
    padding: usize,
    groups: usize,
) -> FloatTensor<B> {
    let [go, c, k, _] = weight.shape().dims::<4>();
    let o = go / groups;
    let turned = B::float_reshape(weight, Shape::new([groups, o, c, k, k]));
    let turned = B::float_permute(turned, &[0, 2, 1, 3, 4]);
    let turned = B::float_flip(turned, &[3, 4]);
    let turned = B::float_reshape(turned, Shape::new([groups * c, o, k, k]));
    let (dx, _) = forward_by_columns::<B>(dy, turned, None, 1, k - 1 - padding, groups);
    debug_assert_eq!(dx.shape().dims::<4>()[2..], [h, w]);
    dx
}

/// Whether dx of a convolution with output gradient `dy` (`[n, g·o, oh,
/// ow]`) and `weight` (`[g·o, c, k, k]`) takes [`input_grad_by_columns`]:
/// when the environment sets `FEDWEAVE_GROUPED_DX=columns` (read once; a
/// GPU experiment, unmeasured), for a stride-1 square window with `p < k`
/// whose lowering, judged on the output gradient's own columns, is
/// [`Lowering::Columns`].
fn input_grad_takes_columns<B: Backend>(
    dy: [usize; 4],
    weight: [usize; 4],
    stride: usize,
    padding: usize,
    groups: usize,
) -> bool {
    static ASKED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let asked =
        *ASKED.get_or_init(|| std::env::var("FEDWEAVE_GROUPED_DX").as_deref() == Ok("columns"));
    let [go, c, k, kw] = weight;
    if !asked || stride != 1 || k != kw || padding >= k {
        return false;
    }
    let turned = [groups * c, go / groups, k, k];
    let columns = column_len(dy, turned, 1, k - 1 - padding);
    lowering::<B>(columns) == Lowering::Columns
}

/// The backward step of [`GroupedConv::conv2d_grouped`] with (`N` = 3)
/// or without (`N` = 2) a bias: dx through burn's data gradient (one
/// transposed convolution) or, when asked, [`input_grad_by_columns`]; dW by
/// the columns or [`weight_grad`] (the backend's [`Lowering`]); the bias
/// gradient a sum.
#[derive(Debug)]
struct GroupedBackward<const N: usize>;

/// What the backward step reads: the forward's input and weight, its
/// geometry, and the column matrices it kept ([`forward_keeping`]).
#[derive(Clone, Debug)]
struct GroupedState<B: Backend> {
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    /// Stride, padding, groups.
    geometry: (usize, usize, usize),
    columns: Option<FloatTensor<B>>,
}

impl<B: GroupedConv> Backward<B, 3> for GroupedBackward<3> {
    type State = GroupedState<B>;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dy = grads.consume::<B>(&ops.node);
        let ids = ops.parents.map(|p| p.map(|n| n.id));
        register::<B>(grads, dy, ops.state, ids);
    }
}

impl<B: GroupedConv> Backward<B, 2> for GroupedBackward<2> {
    type State = GroupedState<B>;

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dy = grads.consume::<B>(&ops.node);
        let [x, w] = ops.parents.map(|p| p.map(|n| n.id));
        register::<B>(grads, dy, ops.state, [x, w, None]);
    }
}

/// Registers the gradients of the parents that need one (`ids`: input,
/// weight, bias).
fn register<B: GroupedConv>(
    grads: &mut Gradients,
    dy: FloatTensor<B>,
    state: GroupedState<B>,
    [id_x, id_w, id_b]: [Option<NodeId>; 3],
) {
    let GroupedState {
        x,
        weight,
        geometry: (stride, padding, groups),
        columns: kept,
    } = state;
    let shape = weight.shape().dims::<4>();
    if let Some(id) = id_b {
        grads.register::<B>(id, B::conv_bias_grad(dy.clone()));
    }
    if let Some(id) = id_x {
        let [_, _, h, w] = x.shape().dims::<4>();
        let dx = if input_grad_takes_columns::<B>(dy.shape().dims(), shape, stride, padding, groups)
        {
            input_grad_by_columns::<B>(dy.clone(), weight, [h, w], padding, groups)
        } else {
            B::conv2d_x_backward(
                x.clone(),
                weight,
                dy.clone(),
                options(stride, padding, groups),
            )
        };
        grads.register::<B>(id, dx);
    }
    if let Some(id) = id_w {
        let columns = column_len(x.shape().dims(), shape, stride, padding);
        let dw = if let Some(cols) = kept {
            weight_grad_from_columns::<B>(cols, dy, shape, groups)
        } else if groups == 1 || lowering::<B>(columns) == Lowering::Columns {
            weight_grad_by_columns::<B>(x, dy, shape, stride, padding, groups)
        } else {
            weight_grad::<B>(x, dy, shape, stride, padding, groups)
        };
        grads.register::<B>(id, dw);
    }
}

/// Runs the convolution of `inputs` (input, weight and, with `N` = 3, bias)
/// under autodiff.
fn tracked<B: GroupedConv, C: CheckpointStrategy, const N: usize>(
    op: GroupedBackward<N>,
    inputs: [FloatTensor<Autodiff<B, C>>; N],
    (stride, padding, groups): (usize, usize, usize),
) -> FloatTensor<Autodiff<B, C>>
where
    GroupedBackward<N>: Backward<B, N, State = GroupedState<B>>,
{
    let prep = op
        .prepare::<C>(inputs.each_ref().map(|t| t.node()))
        .compute_bound()
        .stateful();
    let mut prims = inputs.into_iter().map(|t| t.into_primitive());
    let (x, weight) = (
        prims.next().expect("an input"),
        prims.next().expect("a weight"),
    );
    let bias = prims.next();
    match prep {
        OpsKind::Tracked(prep) => {
            let geometry = (stride, padding, groups);
            let (out, columns) = forward_keeping::<B>(x.clone(), weight.clone(), bias, geometry);
            let state = GroupedState {
                x,
                weight,
                geometry,
                columns,
            };
            prep.finish(state, out)
        }
        OpsKind::UnTracked(prep) => {
            prep.finish(forward::<B>(x, weight, bias, stride, padding, groups))
        }
    }
}

impl<B: GroupedConv, C: CheckpointStrategy> GroupedConv for Autodiff<B, C> {
    fn conv2d_grouped(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        stride: usize,
        padding: usize,
        groups: usize,
    ) -> FloatTensor<Self> {
        let geometry = (stride, padding, groups);
        tracked::<B, C, 3>(GroupedBackward, [x, weight, bias], geometry)
    }

    fn conv2d_grouped_no_bias(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        stride: usize,
        padding: usize,
        groups: usize,
    ) -> FloatTensor<Self> {
        tracked::<B, C, 2>(GroupedBackward, [x, weight], (stride, padding, groups))
    }

    fn conv_bias_grad(dy: FloatTensor<Self>) -> FloatTensor<Self> {
        // Not differentiated: the inner backend's sums, detached.
        Self::from_inner(B::conv_bias_grad(dy.into_primitive()))
    }

    fn conv_columns(
        x: FloatTensor<Self>,
        groups: usize,
        kh: usize,
        kw: usize,
        stride: usize,
        padding: usize,
    ) -> FloatTensor<Self> {
        // Not differentiated: the inner backend's columns, detached.
        let x = x.into_primitive();
        Self::from_inner(B::conv_columns(x, groups, kh, kw, stride, padding))
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{close, values_of};
    use super::*;
    use burn::backend::ops::ModuleOps;
    use burn::tensor::{Device, Distribution};

    /// The grouped convolution and burn's (which differentiates the weight
    /// group by group) give the same output and the same gradients of the
    /// input, weight and bias: groups of several channels and depthwise
    /// ones, strides 1–3 (3 on an input it does not divide, so the
    /// gradient's window is cut to the kernel), paddings 0–2, with and
    /// without a bias; and one group (the GPU backends' dense convolution,
    /// whose weight gradient is a matmul over gathered columns).
    #[test]
    fn grouped_conv_agrees_with_burns_forward_and_backward() {
        let device = Device::flex().autodiff();
        let normal = Distribution::Normal(0.0, 1.0);
        // (batch, groups, c per group, o per group, h, w, k, stride, padding, bias)
        for (n, g, c, o, h, w, k, stride, pad, bias) in [
            (3, 4, 2, 3, 9, 8, 3, 1, 1, true),
            (2, 3, 1, 2, 11, 10, 5, 1, 0, true),
            (2, 5, 3, 2, 10, 9, 3, 2, 1, false),
            (4, 2, 2, 2, 12, 12, 3, 3, 0, true),
            (1, 6, 1, 1, 7, 7, 3, 1, 2, false),
            // One group: the weight gradient as a batched matmul of columns.
            (3, 1, 3, 4, 9, 8, 3, 1, 1, true),
            (2, 1, 2, 3, 11, 10, 5, 2, 2, false),
            (2, 1, 1, 2, 7, 9, 3, 3, 0, true),
            (4, 1, 2, 5, 12, 12, 5, 1, 0, true),
        ] {
            let x = Tensor::<4>::random([n, g * c, h, w], normal, &device).require_grad();
            let wt = Tensor::<4>::random([g * o, c, k, k], normal, &device).require_grad();
            let b = Tensor::<1>::random([g * o], normal, &device).require_grad();
            let target = {
                let out = burn::tensor::module::conv2d(
                    x.clone(),
                    wt.clone(),
                    None,
                    options(stride, pad, g),
                );
                Tensor::<4>::random(out.dims(), normal, &device)
            };
            let run = |ours: bool| {
                let bias = bias.then(|| b.clone());
                let y = if ours {
                    conv2d(x.clone(), wt.clone(), bias, options(stride, pad, g))
                } else {
                    burn::tensor::module::conv2d(
                        x.clone(),
                        wt.clone(),
                        bias,
                        options(stride, pad, g),
                    )
                };
                let grads = (y.clone() * target.clone()).sum().backward();
                (
                    y.inner(),
                    x.grad(&grads).expect("dx"),
                    wt.grad(&grads).expect("dw"),
                    b.grad(&grads),
                )
            };
            let (y1, dx1, dw1, db1) = run(true);
            let (y2, dx2, dw2, db2) = run(false);
            let case = format!("n {n} g {g} c {c} o {o} {h}×{w} k {k} s {stride} p {pad}");
            close(y1, y2, 1e-5, &format!("{case}: y"));
            close(dx1, dx2, 1e-4, &format!("{case}: dx"));
            close(dw1, dw2, 1e-4, &format!("{case}: dw"));
            assert_eq!(db1.is_some(), bias, "{case}: a bias gradient iff a bias");
            if let (Some(a), Some(b)) = (db1, db2) {
                close(a, b, 1e-4, &format!("{case}: db"));
            }
        }
    }

    /// The column lowering against burn: the forward against burn's
    /// convolution, the weight gradient against [`weight_grad`] (checked
    /// against burn's above), and at stride 1 the input gradient against
    /// burn's transposed convolution (paddings 0 to k − 1). Taps in the
    /// padding, strides that do not divide the input, one and several
    /// groups; the forward runs twice, the second time with the kept index.
    #[test]
    fn columns_give_burns_forward_and_gradients() {
        let device = Device::flex();
        let normal = Distribution::Normal(0.0, 1.0);
        // (batch, groups, c per group, o per group, h, w, k, stride, padding)
        for (n, g, c, o, h, w, k, stride, pad) in [
            (3, 4, 2, 3, 9, 8, 3, 1, 1),
            (2, 3, 1, 2, 11, 10, 5, 1, 0),
            (2, 5, 3, 2, 10, 9, 3, 2, 1),
            (4, 2, 2, 2, 12, 12, 3, 3, 0),
            (1, 6, 1, 1, 7, 7, 3, 1, 2),
            (3, 1, 3, 4, 9, 8, 3, 1, 1),
            (2, 1, 2, 3, 11, 10, 5, 2, 2),
        ] {
            let case = format!("n {n} g {g} c {c} o {o} {h}×{w} k {k} s {stride} p {pad}");
            let x = Tensor::<4>::random([n, g * c, h, w], normal, &device);
            let wt = Tensor::<4>::random([g * o, c, k, k], normal, &device);
            let b = Tensor::<1>::random([g * o], normal, &device);
            let burns = burn::tensor::module::conv2d(
                x.clone(),
                wt.clone(),
                Some(b.clone()),
                options(stride, pad, g),
            );
            let dy = Tensor::<4>::random(burns.dims(), normal, &device);
            let mut kept = None;
            for _ in 0..2 {
                let (ours, cols) = forward_by_columns::<Dispatch>(
                    x.clone().into_dispatch(),
                    wt.clone().into_dispatch(),
                    Some(b.clone().into_dispatch()),
                    stride,
                    pad,
                    g,
                );
                close(
                    Tensor::<4>::from_dispatch(ours),
                    burns.clone(),
                    1e-5,
                    &format!("{case}: y"),
                );
                kept = Some(cols);
            }
            let direct = Tensor::<4>::from_dispatch(weight_grad::<Dispatch>(
                x.clone().into_dispatch(),
                dy.clone().into_dispatch(),
                wt.dims(),
                stride,
                pad,
                g,
            ));
            let by_columns = weight_grad_by_columns::<Dispatch>(
                x.clone().into_dispatch(),
                dy.clone().into_dispatch(),
                wt.dims(),
                stride,
                pad,
                g,
            );
            let dw = format!("{case}: dw");
            close(Tensor::from_dispatch(by_columns), direct.clone(), 1e-4, &dw);
            // From the columns the forward pass kept.
            let from_kept = weight_grad_from_columns::<Dispatch>(
                kept.expect("two forward passes"),
                dy.clone().into_dispatch(),
                wt.dims(),
                g,
            );
            close(Tensor::from_dispatch(from_kept), direct, 1e-4, &dw);
            if stride == 1 {
                let burns = Tensor::<4>::from_dispatch(Dispatch::conv2d_x_backward(
                    x.clone().into_dispatch(),
                    wt.clone().into_dispatch(),
                    dy.clone().into_dispatch(),
                    options(stride, pad, g),
                ));
                let ours = Tensor::<4>::from_dispatch(input_grad_by_columns::<Dispatch>(
                    dy.clone().into_dispatch(),
                    wt.clone().into_dispatch(),
                    [h, w],
                    pad,
                    g,
                ));
                close(ours, burns, 1e-4, &format!("{case}: dx"));
            }
        }
    }

    /// The CPU backend keeps burn-flex's convolutions (the columns are
    /// 0.6–0.9× as fast there); any other backend takes the columns, for one
    /// group or many, while they fit 1 GiB.
    #[test]
    fn the_columns_are_for_convolutions_off_the_cpu() {
        if lowering_override().is_some() {
            return; // FEDWEAVE_GROUPED_CONV set for a comparison run
        }
        assert_eq!(lowering::<Flex>(1000), Lowering::Direct);
        assert_eq!(lowering::<Dispatch>(1000), Lowering::Columns);
        // Over 1 GiB of columns the direct kernels stay.
        assert_eq!(lowering::<Dispatch>(MAX_COLUMNS), Lowering::Columns);
        assert_eq!(lowering::<Dispatch>(MAX_COLUMNS + 1), Lowering::Direct);
        // Ten ResNet-18s at batch 64 on 32×32 inputs, a 64-channel 3×3 layer: 1.5 GB.
        let resnet = column_len([64, 640, 32, 32], [640, 64, 3, 3], 1, 1);
        assert_eq!(resnet, 64 * 640 * 9 * 1024);
        assert_eq!(lowering::<Dispatch>(resnet), Lowering::Direct);
        // PFLlib's step, cnn-bn's second layer at K = 10, batch 10: 10·320·25·64.
        let cnn_bn = column_len([10, 320, 12, 12], [640, 32, 5, 5], 1, 0);
        assert_eq!(cnn_bn, 10 * 320 * 25 * 64);
        assert_eq!(lowering::<Dispatch>(cnn_bn), Lowering::Columns);
        // The input gradient by columns only when asked for.
        if std::env::var_os("FEDWEAVE_GROUPED_DX").is_none() {
            let dy = [10, 640, 8, 8];
            assert!(!input_grad_takes_columns::<Dispatch>(
                dy,
                [640, 32, 5, 5],
                1,
                0,
                10
            ));
        }
    }

    /// Without a bias the operation's third parent is absent, so the
    /// weight's gradient is not counted twice; on a plain (non-autodiff)
    /// device the forward is burn's.
    #[test]
    fn grouped_conv_without_autodiff_is_burns_forward() {
        let device = Device::flex();
        let normal = Distribution::Normal(0.0, 1.0);
        let x = Tensor::<4>::random([2, 6, 8, 8], normal, &device);
        let w = Tensor::<4>::random([9, 2, 3, 3], normal, &device);
        let ours = conv2d(x.clone(), w.clone(), None, options(1, 1, 3));
        let burns = burn::tensor::module::conv2d(x, w, None, options(1, 1, 3));
        assert_eq!(values_of(ours), values_of(burns));
    }
}
