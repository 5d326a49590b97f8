//! Writing a training step's new state into the buffers of the old one.
//!
//! burn's operations are functional: every update returns a tensor in a
//! buffer of its own. A CUDA graph replays its launches against the buffers
//! it recorded (docs/results.md, "GPU, session 24"), so a step that is to be
//! replayed must leave its state (parameters, momentum, batch-norm running
//! statistics, loss sums, the step counter) where it found it. On the cube
//! backends [`InPlace::assign_rows`] is one kernel writing `src` into
//! `dst`'s own buffer; on the CPU, which has no graphs, it is the same
//! selection as a new tensor (so the CPU's results are those of
//! `mask_where`, bit for bit).

use super::sgd::{Sgd, SgdStep};
use burn::backend::tensor::{BoolTensor, FloatTensor};
use burn::backend::{Backend, Dispatch, Flex, backend_extension, get_or_init_device_settings};
use burn::tensor::{Shape, Tensor};

/// Row-wise assignment into an existing tensor.
#[backend_extension(
    Flex,
    Cube: cfg(any(feature = "cuda", feature = "wgpu"))
)]
pub trait InPlace: Backend {
    /// `dst` (`[rows, len]`) with row `r` replaced by `src`'s row `r`
    /// wherever `active[r]` (`[rows]`) is not 0. On the cube backends the
    /// result is `dst` itself, written in place.
    fn assign_rows(
        dst: FloatTensor<Self>,
        src: FloatTensor<Self>,
        active: FloatTensor<Self>,
    ) -> FloatTensor<Self>;

    /// `dst + src` (the same shape); on the cube backends `dst` itself,
    /// written in place by one kernel.
    fn add_assign(dst: FloatTensor<Self>, src: FloatTensor<Self>) -> FloatTensor<Self>;

    /// One momentum-SGD step ([`SgdStep::sgd_momentum`]) of the stacked
    /// `theta` and `buf` (`[rows, len]`) along `grad`, kept only in the rows
    /// where `active` is not 0: the update followed by
    /// [`assign_rows`](Self::assign_rows) of both. On the cube backends one
    /// kernel writing θ and the buffer where they are (three launches
    /// before; [`sgd_momentum_rows`] updates a few tensors a launch).
    fn sgd_momentum_rows(
        theta: FloatTensor<Self>,
        buf: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        active: FloatTensor<Self>,
        hyper: Sgd,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);

    /// Batch-norm running statistics `mean` and `var` (`[rows, C]`) folded
    /// with one step's batch statistics (`batch_mean`, `batch_var`, `[rows
    /// · C]`) as PyTorch does, in their buffers, for the rows whose client
    /// took the step (`sizes[r]` valid samples of `per_sample` values per
    /// channel; 0: resting): `mean ← (1 − m)·mean + m·batch_mean`, `var ←
    /// (1 − m)·var + m·batch_var·n/(n − 1)` with n = `sizes[r]·per_sample`
    /// (factor 1 when n ≤ 1). `None` where the backend has no such kernel:
    /// the caller composes it (`RunningStats::fold_rows`, the CPU's bits).
    /// On the cube backends one kernel instead of fourteen launches.
    #[allow(clippy::too_many_arguments)]
    fn fold_running_rows(
        _mean: FloatTensor<Self>,
        _var: FloatTensor<Self>,
        _batch_mean: FloatTensor<Self>,
        _batch_var: FloatTensor<Self>,
        _sizes: FloatTensor<Self>,
        _per_sample: usize,
        _momentum: f32,
    ) -> Option<(FloatTensor<Self>, FloatTensor<Self>)> {
        None
    }
}

/// Whether a step built from these assignments can be replayed from a
/// recording: false with burn's `fusion` (`cuda-tuned`), whose lazy tensors
/// have no fixed buffer to write into. (On the CPU the backend refuses to
/// record, and the step runs as written.)
pub(crate) const REPLAYABLE: bool = !cfg!(feature = "cuda-tuned");

/// `*dst`'s rows replaced by `src`'s where `active` is not 0 (see
/// [`InPlace::assign_rows`]); on the cube backends `*dst` keeps its
/// buffer.
pub(crate) fn assign_rows(dst: &mut Tensor<2>, src: Tensor<2>, active: &Tensor<1>) {
    debug_assert_eq!(dst.dims(), src.dims(), "assignment of another shape");
    debug_assert_eq!(dst.dims()[0], active.dims()[0], "one flag per row");
    let out = <Dispatch as InPlace>::assign_rows(
        dst.clone().into_dispatch(),
        src.into_dispatch(),
        active.clone().into_dispatch(),
    );
    *dst = Tensor::from_dispatch(out);
}

/// `*dst ← *dst + src` (the same shape), in `dst`'s buffer on the cube
/// backends: a step's running sums and its counter.
pub(crate) fn add_assign<const D: usize>(dst: &mut Tensor<D>, src: Tensor<D>) {
    debug_assert_eq!(dst.dims(), src.dims(), "addition of another shape");
    let sum = <Dispatch as InPlace>::add_assign(dst.clone().into_dispatch(), src.into_dispatch());
    *dst = Tensor::from_dispatch(sum);
}

/// `thetas` and `bufs` after [`InPlace::sgd_momentum_rows`] along
/// `grads`, tensor by tensor; on the cube backends in their buffers, a few
/// tensors a launch.
pub(crate) fn sgd_momentum_rows(
    thetas: &mut [Tensor<2>],
    bufs: &mut [Tensor<2>],
    grads: Vec<Tensor<2>>,
    active: &Tensor<1>,
    hyper: Sgd,
) {
    #[cfg(all(any(feature = "cuda", feature = "wgpu"), not(feature = "cuda-tuned")))]
    if cube::update_in_groups(thetas, bufs, &grads, active, hyper) {
        return;
    }
    for ((theta, buf), grad) in thetas.iter_mut().zip(bufs.iter_mut()).zip(grads) {
        debug_assert_eq!(theta.dims(), grad.dims(), "gradient of another shape");
        let (t, b) = <Dispatch as InPlace>::sgd_momentum_rows(
            theta.clone().into_dispatch(),
            buf.clone().into_dispatch(),
            grad.into_dispatch(),
            active.clone().into_dispatch(),
            hyper,
        );
        *theta = Tensor::from_dispatch(t);
        *buf = Tensor::from_dispatch(b);
    }
}

/// [`InPlace::fold_running_rows`] on the dispatching backend: `None` when
/// it has no kernel for it.
pub(crate) fn fold_running_rows(
    mean: &mut Tensor<2>,
    var: &mut Tensor<2>,
    batch: (Tensor<1>, Tensor<1>),
    sizes: &Tensor<1>,
    per_sample: usize,
    momentum: f32,
) -> Option<()> {
    let (m, v) = <Dispatch as InPlace>::fold_running_rows(
        mean.clone().into_dispatch(),
        var.clone().into_dispatch(),
        batch.0.into_dispatch(),
        batch.1.into_dispatch(),
        sizes.clone().into_dispatch(),
        per_sample,
        momentum,
    )?;
    *mean = Tensor::from_dispatch(m);
    *var = Tensor::from_dispatch(v);
    Some(())
}

/// [`InPlace::sgd_momentum_rows`] as the update, then the selection of both.
fn sgd_then_selected<B: InPlace + SgdStep>(
    theta: FloatTensor<B>,
    buf: FloatTensor<B>,
    grad: FloatTensor<B>,
    active: FloatTensor<B>,
    hyper: Sgd,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let (new_theta, new_buf) = B::sgd_momentum(theta.clone(), buf.clone(), grad, hyper);
    (
        B::assign_rows(theta, new_theta, active.clone()),
        B::assign_rows(buf, new_buf, active),
    )
}

/// The selection as burn's operations.
fn selected<B: Backend>(
    dst: FloatTensor<B>,
    src: FloatTensor<B>,
    active: FloatTensor<B>,
) -> FloatTensor<B> {
    use burn::backend::TensorMetadata;
    let shape = dst.shape();
    let rows = shape.dims::<2>()[0];
    let bool_dtype = get_or_init_device_settings::<B>(&dst.device()).bool_dtype;
    let resting: BoolTensor<B> = B::float_equal_elem(active, 0.0f32.into(), bool_dtype);
    let resting = B::bool_expand(B::bool_reshape(resting, Shape::new([rows, 1])), shape);
    B::float_mask_where(src, resting, dst)
}

/// [`InPlace`] as the selection, for backends without fixed buffers.
macro_rules! selected_assign {
    ($backend:ty) => {
        impl InPlace for $backend {
            fn assign_rows(
                dst: FloatTensor<Self>,
                src: FloatTensor<Self>,
                active: FloatTensor<Self>,
            ) -> FloatTensor<Self> {
                selected::<Self>(dst, src, active)
            }

            fn add_assign(dst: FloatTensor<Self>, src: FloatTensor<Self>) -> FloatTensor<Self> {
                <Self as burn::backend::ops::FloatTensorOps<Self>>::float_add(dst, src)
            }

            fn sgd_momentum_rows(
                theta: FloatTensor<Self>,
                buf: FloatTensor<Self>,
                grad: FloatTensor<Self>,
                active: FloatTensor<Self>,
                hyper: Sgd,
            ) -> (FloatTensor<Self>, FloatTensor<Self>) {
                sgd_then_selected::<Self>(theta, buf, grad, active, hyper)
            }
        }
    };
}

selected_assign!(Flex);
// With burn's `fusion` (`cuda-tuned`) tensors are lazy and have no buffer
// to write into: the selection, and no graph capture.
#[cfg(feature = "cuda-tuned")]
selected_assign!(burn::backend::Cube);

#[cfg(all(any(feature = "cuda", feature = "wgpu"), not(feature = "cuda-tuned")))]
mod cube {
    use super::super::cube::{F32, address, folded, units};
    use super::{InPlace, Sgd, selected, sgd_then_selected};
    use burn::backend::tensor::FloatTensor;
    use burn::backend::{BackendTensor, DispatchTensorKind};
    use burn::tensor::DType;
    use burn::tensor::Tensor as BurnTensor;
    use burn_cubecl::CubeBackend;
    use burn_cubecl::kernel::into_contiguous;
    use burn_cubecl::tensor::CubeTensor;
    use cubecl::prelude::*;
    use cubecl::std::tensor::layout::linear::{LinearView, LinearViewMut};

    /// One thread per element of `dst`: copies `src`'s element when its
    /// row is active.
    #[cube(launch_unchecked, address_type = "dynamic")]
    fn assign_rows_kernel<F: Float>(
        src: LinearView<'_, F>,
        active: LinearView<'_, F>,
        mut dst: LinearViewMut<'_, F>,
        row_len: usize,
        #[define(F)] _dtype: ElemType,
    ) {
        if !dst.is_in_bounds(ABSOLUTE_POS) {
            terminate!();
        }
        if active.read(ABSOLUTE_POS / row_len) != F::new(0.0) {
            dst.write(ABSOLUTE_POS, src.read(ABSOLUTE_POS));
        }
    }

    /// One thread per element: `dst += src`.
    #[cube(launch_unchecked, address_type = "dynamic")]
    fn add_assign_kernel<F: Float>(
        src: &Tensor<F>,
        dst: &mut Tensor<F>,
        #[define(F)] _dtype: ElemType,
    ) {
        if ABSOLUTE_POS >= dst.len() {
            terminate!();
        }
        dst[ABSOLUTE_POS] += src[ABSOLUTE_POS];
    }

    /// Tensors one launch of [`sgd_momentum_rows_kernel`] updates.
    const SLOTS: usize = 4;

    /// Element `pos − start` of one stacked tensor (`[rows, len]`), when
    /// `pos` falls in its range: the update of `sgd::sgd_momentum_kernel`
    /// (the same roundings in the same order), written over θ and the
    /// buffer when the element's row is active.
    #[cube]
    #[allow(clippy::too_many_arguments)]
    fn update_slot<F: Float>(
        pos: usize,
        start: usize,
        grad: &Tensor<F>,
        active: &Tensor<F>,
        theta: &mut Tensor<F>,
        buf: &mut Tensor<F>,
        rows: usize,
        hyper: (F, F, F),
    ) {
        let len = theta.len();
        if pos >= start && pos < start + len {
            let j = pos - start;
            if active[j / (len / rows)] != F::new(0.0) {
                let (lr, momentum, weight_decay) = hyper;
                let t = theta[j];
                let g = grad[j] + t * weight_decay;
                let b = buf[j] * momentum + g;
                buf[j] = b;
                theta[j] = t - b * lr;
            }
        }
    }

    /// One thread per element of up to [`SLOTS`] tensors (`slots` of
    /// them, their elements in order; the other slots are bound to the
    /// first tensor's buffers and never read).
    #[cube(launch_unchecked, address_type = "dynamic")]
    #[allow(clippy::too_many_arguments)]
    fn sgd_momentum_rows_kernel<F: Float>(
        g0: &Tensor<F>,
        g1: &Tensor<F>,
        g2: &Tensor<F>,
        g3: &Tensor<F>,
        active: &Tensor<F>,
        t0: &mut Tensor<F>,
        t1: &mut Tensor<F>,
        t2: &mut Tensor<F>,
        t3: &mut Tensor<F>,
        b0: &mut Tensor<F>,
        b1: &mut Tensor<F>,
        b2: &mut Tensor<F>,
        b3: &mut Tensor<F>,
        rows: usize,
        lr: InputScalar,
        momentum: InputScalar,
        weight_decay: InputScalar,
        #[comptime] slots: usize,
        #[define(F)] _dtype: ElemType,
    ) {
        let hyper = (lr.get::<F>(), momentum.get::<F>(), weight_decay.get::<F>());
        let pos = ABSOLUTE_POS;
        update_slot::<F>(pos, 0, g0, active, t0, b0, rows, hyper);
        let mut start = t0.len();
        if slots > 1 {
            update_slot::<F>(pos, start, g1, active, t1, b1, rows, hyper);
            start += t1.len();
        }
        if slots > 2 {
            update_slot::<F>(pos, start, g2, active, t2, b2, rows, hyper);
            start += t2.len();
        }
        if slots > 3 {
            update_slot::<F>(pos, start, g3, active, t3, b3, rows, hyper);
        }
    }

    /// One thread per running statistic: `RunningStats::fold_rows`'s
    /// arithmetic (the same roundings in the same order) written in place
    /// where the row's client took the step.
    #[cube(launch_unchecked, address_type = "dynamic")]
    #[allow(clippy::too_many_arguments)]
    fn fold_running_rows_kernel<F: Float>(
        batch_mean: &Tensor<F>,
        batch_var: &Tensor<F>,
        sizes: &Tensor<F>,
        mean: &mut Tensor<F>,
        var: &mut Tensor<F>,
        row_len: usize,
        per_sample: InputScalar,
        momentum: InputScalar,
        keep: InputScalar,
        #[define(F)] _dtype: ElemType,
    ) {
        if ABSOLUTE_POS >= mean.len() {
            terminate!();
        }
        let size = sizes[ABSOLUTE_POS / row_len];
        if size != F::new(0.0) {
            let i = ABSOLUTE_POS;
            let (m, v) = folded::<F>(
                mean[i],
                var[i],
                batch_mean[i],
                batch_var[i],
                size * per_sample.get::<F>(),
                momentum.get::<F>(),
                keep.get::<F>(),
            );
            mean[i] = m;
            var[i] = v;
        }
    }

    /// The cube tensor under a plain `f32` tensor of the dispatching
    /// backend; `None` for any other.
    fn cube_float<const D: usize>(t: &BurnTensor<D>) -> Option<CubeTensor> {
        match t.clone().into_dispatch().kind {
            DispatchTensorKind::Cube(BackendTensor::Float(c)) => Some(c),
            _ => None,
        }
    }

    /// [`super::sgd_momentum_rows`] on the cube backends, when every tensor
    /// is one of theirs and fits the kernel: written in place, and `true`.
    pub(super) fn update_in_groups(
        thetas: &[BurnTensor<2>],
        bufs: &[BurnTensor<2>],
        grads: &[BurnTensor<2>],
        active: &BurnTensor<1>,
        hyper: Sgd,
    ) -> bool {
        let all = |ts: &[BurnTensor<2>]| ts.iter().map(cube_float).collect::<Option<Vec<_>>>();
        match (all(thetas), all(bufs), all(grads), cube_float(active)) {
            (Some(t), Some(b), Some(g), Some(a)) => launch_in_groups(&t, &b, g, a, hyper),
            _ => false,
        }
    }

    /// Launches [`sgd_momentum_rows_kernel`] over `thetas`, `bufs` and
    /// `grads` (`[rows, len_i]` each, `rows` the length of `active`),
    /// [`SLOTS`] tensors a launch. `false`, launching nothing, when any
    /// tensor does not fit (not `f32`, θ or the buffer not contiguous,
    /// shapes that differ).
    fn launch_in_groups(
        thetas: &[CubeTensor],
        bufs: &[CubeTensor],
        grads: Vec<CubeTensor>,
        active: CubeTensor,
        hyper: Sgd,
    ) -> bool {
        let rows = active.meta.shape().num_elements();
        let fits = |t: &CubeTensor, b: &CubeTensor, g: &CubeTensor| {
            let shape = t.meta.shape();
            [t, b, g, &active].iter().all(|x| x.dtype == DType::F32)
                && shape.num_dims() == 2
                && shape.dims::<2>()[0] == rows
                && shape.num_elements() > 0
                && b.meta.shape() == shape
                && g.meta.shape() == shape
                && t.is_contiguous()
                && b.is_contiguous()
        };
        let same_count = thetas.len() == bufs.len() && bufs.len() == grads.len();
        if !same_count
            || thetas.is_empty()
            || rows == 0
            || !thetas
                .iter()
                .zip(bufs)
                .zip(&grads)
                .all(|((t, b), g)| fits(t, b, g))
        {
            return false;
        }
        let active = into_contiguous(active);
        let grads: Vec<CubeTensor> = grads.into_iter().map(into_contiguous).collect();
        let scalar = |v: f32| InputScalar::new(v, F32);
        for ((ts, bs), gs) in thetas
            .chunks(SLOTS)
            .zip(bufs.chunks(SLOTS))
            .zip(grads.chunks(SLOTS))
        {
            let n: usize = ts.iter().map(|t| t.meta.shape().num_elements()).sum();
            let tensors: Vec<&CubeTensor> = ts.iter().chain(bs).chain(gs).collect();
            let address = address(&tensors);
            let (cube_count, cube_dim) = units(&ts[0], n);
            // Slot i's argument: the group's i-th tensor, else its first.
            let arg = |group: &[CubeTensor], i: usize| {
                group.get(i).unwrap_or(&group[0]).clone().into_tensor_arg()
            };
            // SAFETY: every tensor is contiguous and `[rows, len_i]`; unit p
            // updates element p − start_i of the one tensor among the first
            // `ts.len()` slots whose range holds it (units past the group's
            // total match none; the other slots are never read), reading
            // `active` at its row (< rows). Each unit reads and writes only
            // its own element.
            unsafe {
                sgd_momentum_rows_kernel::launch_unchecked(
                    &ts[0].client,
                    cube_count,
                    cube_dim,
                    address,
                    arg(gs, 0),
                    arg(gs, 1),
                    arg(gs, 2),
                    arg(gs, 3),
                    active.clone().into_tensor_arg(),
                    arg(ts, 0),
                    arg(ts, 1),
                    arg(ts, 2),
                    arg(ts, 3),
                    arg(bs, 0),
                    arg(bs, 1),
                    arg(bs, 2),
                    arg(bs, 3),
                    rows,
                    scalar(hyper.lr),
                    scalar(hyper.momentum),
                    scalar(hyper.weight_decay),
                    ts.len(),
                    F32,
                );
            }
        }
        true
    }

    impl InPlace for CubeBackend {
        fn add_assign(dst: CubeTensor, src: CubeTensor) -> FloatTensor<Self> {
            let n = dst.meta.shape().num_elements();
            let fits = dst.dtype == DType::F32
                && src.dtype == DType::F32
                && src.meta.shape().num_elements() == n
                && dst.is_contiguous()
                && n > 0;
            if !fits {
                tracing::warn!(
                    "add_assign adds into a new tensor instead of in place (dst {:?} {:?}, \
                     src {:?} {:?})",
                    dst.dtype,
                    dst.meta.shape(),
                    src.dtype,
                    src.meta.shape()
                );
                return <Self as burn::backend::ops::FloatTensorOps<Self>>::float_add(dst, src);
            }
            let src = into_contiguous(src);
            let (cube_count, cube_dim) = units(&dst, n);
            let address = address(&[&dst, &src]);
            // SAFETY: both contiguous with `n` elements; each thread reads
            // and writes its own element.
            unsafe {
                add_assign_kernel::launch_unchecked(
                    &dst.client.clone(),
                    cube_count,
                    cube_dim,
                    address,
                    src.into_tensor_arg(),
                    dst.clone().into_tensor_arg(),
                    F32,
                );
            }
            dst
        }

        fn fold_running_rows(
            mean: CubeTensor,
            var: CubeTensor,
            batch_mean: CubeTensor,
            batch_var: CubeTensor,
            sizes: CubeTensor,
            per_sample: usize,
            momentum: f32,
        ) -> Option<(FloatTensor<Self>, FloatTensor<Self>)> {
            let shape = mean.meta.shape().clone();
            let [rows, len] = shape.dims::<2>();
            let n = rows * len;
            let fits = [&mean, &var, &batch_mean, &batch_var, &sizes]
                .iter()
                .all(|t| t.dtype == DType::F32)
                && *var.meta.shape() == shape
                && batch_mean.meta.shape().num_elements() == n
                && batch_var.meta.shape().num_elements() == n
                && sizes.meta.shape().num_elements() == rows
                && mean.is_contiguous()
                && var.is_contiguous();
            if !fits || n == 0 {
                return None;
            }
            let [batch_mean, batch_var, sizes] =
                [batch_mean, batch_var, sizes].map(into_contiguous);
            let client = mean.client.clone();
            let address = address(&[&mean, &var]);
            let (cube_count, cube_dim) = units(&mean, n);
            let scalar = |v: f32| InputScalar::new(v, F32);
            // SAFETY: all five are contiguous; the statistics hold `n`
            // elements and `sizes` `rows`, read at `pos / len`. Each thread
            // reads and writes only its own element of `mean` and `var`.
            unsafe {
                fold_running_rows_kernel::launch_unchecked(
                    &client,
                    cube_count,
                    cube_dim,
                    address,
                    batch_mean.into_tensor_arg(),
                    batch_var.into_tensor_arg(),
                    sizes.into_tensor_arg(),
                    mean.clone().into_tensor_arg(),
                    var.clone().into_tensor_arg(),
                    len,
                    scalar(per_sample as f32),
                    scalar(momentum),
                    scalar(1.0 - momentum),
                    F32,
                );
            }
            Some((mean, var))
        }

        fn sgd_momentum_rows(
            theta: CubeTensor,
            buf: CubeTensor,
            grad: CubeTensor,
            active: CubeTensor,
            hyper: Sgd,
        ) -> (FloatTensor<Self>, FloatTensor<Self>) {
            let one = |t: &CubeTensor| vec![t.clone()];
            if launch_in_groups(&one(&theta), &one(&buf), one(&grad), active.clone(), hyper) {
                (theta, buf)
            } else {
                sgd_then_selected::<Self>(theta, buf, grad, active, hyper)
            }
        }

        fn assign_rows(dst: CubeTensor, src: CubeTensor, active: CubeTensor) -> FloatTensor<Self> {
            let shape = dst.meta.shape().clone();
            let [rows, len] = shape.dims::<2>();
            let fits = [&dst, &src, &active].iter().all(|t| t.dtype == DType::F32)
                && *src.meta.shape() == shape
                && active.meta.shape().num_elements() == rows
                && dst.is_nonoverlapping();
            if !fits || rows * len == 0 {
                tracing::warn!(
                    "assign_rows copies instead of writing in place (dst {:?} {:?} strides {:?}, \
                     src {:?} {:?}, active {:?} {:?})",
                    dst.dtype,
                    dst.meta.shape(),
                    dst.meta.strides(),
                    src.dtype,
                    src.meta.shape(),
                    active.dtype,
                    active.meta.shape()
                );
                return selected::<Self>(dst, src, active);
            }
            let n = rows * len;
            let client = dst.client.clone();
            let address = address(&[&dst, &src, &active]);
            let (cube_count, cube_dim) = units(&dst, n);
            // SAFETY: the views cover `n` elements of live buffers (`active`
            // `rows`, read at `pos / len < rows`) and the kernel returns for
            // positions past `n`. `dst` is written where it lies: each
            // thread reads `src` and writes one element of `dst` it alone
            // touches.
            unsafe {
                assign_rows_kernel::launch_unchecked(
                    &client,
                    cube_count,
                    cube_dim,
                    address,
                    src.into_linear_view(),
                    active.into_linear_view(),
                    dst.clone().into_linear_view(),
                    len,
                    F32,
                );
            }
            dst
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{Device, TensorData};

    /// On the CPU the assignment is `mask_where` on the resting rows, bit
    /// for bit, and leaves active rows equal to `src`; `add_assign` adds.
    #[test]
    fn rows_of_active_flags_take_the_new_values() {
        let device = Device::flex();
        let make = |seed: f32| {
            let v: Vec<f32> = (0..12).map(|i| (i as f32 * seed).sin()).collect();
            Tensor::<2>::from_data(TensorData::new(v, [3, 4]), &device)
        };
        let (old, new) = (make(1.1), make(2.3));
        let active = Tensor::<1>::from_data(TensorData::new(vec![1.0f32, 0.0, 1.0], [3]), &device);
        let mut dst = old.clone();
        assign_rows(&mut dst, new.clone(), &active);
        let (got, old, new) = (
            dst.into_data().try_to_vec::<f32>().unwrap(),
            old.into_data().try_to_vec::<f32>().unwrap(),
            new.into_data().try_to_vec::<f32>().unwrap(),
        );
        for (i, g) in got.iter().enumerate() {
            let want = if i / 4 == 1 { old[i] } else { new[i] };
            assert_eq!(g.to_bits(), want.to_bits(), "element {i}");
        }
        let mut t = Tensor::<3>::ones([2, 2, 2], &device).mul_scalar(0.5);
        add_assign(&mut t, Tensor::<3>::ones([2, 2, 2], &device));
        assert_eq!(t.into_data().try_to_vec::<f32>().unwrap(), vec![1.5; 8]);
    }
}
