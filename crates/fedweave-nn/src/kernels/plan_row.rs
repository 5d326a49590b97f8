//! A batched step's inputs and supervision read from its round's plan, one
//! kernel each off the CPU.
//!
//! The batched trainer uploads a round's sample rows, labels and sample
//! weights once (`BatchedTrainer::plan`: per step a row of integers, rows
//! then labels, and a row of floats, weights then validity then batch
//! sizes) and each step reads its row at a counter kept on the device. As
//! burn's operations the supervision was a selection of the float row,
//! three slices, a zero fill and a scatter of the weights at the labels (six
//! launches a step), and the inputs a cast of the counter, a selection of
//! the integer row, a slice and a selection of the samples (four). Here they
//! are one each; the CPU keeps the operations (its batched results are
//! pinned).

use burn::backend::tensor::{FloatTensor, IntTensor};
use burn::backend::{Backend, Dispatch, Flex, backend_extension};
use burn::tensor::{Int, Tensor};

/// The step's supervision from the plan.
#[backend_extension(Flex, Cube: cfg(any(feature = "cuda", feature = "wgpu")))]
pub trait PlanRow: Backend {
    /// Step `counter[0]`'s targets (`[K·B, classes]`: row k·B + b is the
    /// one-hot row of client k's sample b weighted by its weight, zero for
    /// padding), validity (`[B, K]`) and batch sizes (`[K]`), from the plan's
    /// `ints` (`[steps, 2·K·B]`) and `floats` (`[steps, 2·K·B + K]`).
    /// `None` where the backend has no kernel for it: the caller composes
    /// it.
    fn plan_row(
        _counter: FloatTensor<Self>,
        _ints: IntTensor<Self>,
        _floats: FloatTensor<Self>,
        _clients: usize,
        _batch: usize,
        _classes: usize,
    ) -> Option<(FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>)> {
        None
    }

    /// Step `counter[0]`'s inputs (`[K·B, width]`): row r is row
    /// `ints[step, r]` of the resident samples' `table` (`[rows, width]`).
    /// `None` where the backend has no kernel for it.
    fn plan_inputs(
        _counter: FloatTensor<Self>,
        _ints: IntTensor<Self>,
        _table: FloatTensor<Self>,
        _rows: usize,
    ) -> Option<FloatTensor<Self>> {
        None
    }
}

impl PlanRow for Flex {}

/// [`PlanRow::plan_row`] on the dispatching backend's tensors.
pub(crate) fn plan_row(
    counter: &Tensor<1>,
    ints: &Tensor<2, Int>,
    floats: &Tensor<2>,
    [clients, batch, classes]: [usize; 3],
) -> Option<(Tensor<2>, Tensor<2>, Tensor<1>)> {
    let (target, valid, sizes) = <Dispatch as PlanRow>::plan_row(
        counter.clone().into_dispatch(),
        ints.clone().into_dispatch(),
        floats.clone().into_dispatch(),
        clients,
        batch,
        classes,
    )?;
    Some((
        Tensor::from_dispatch(target),
        Tensor::from_dispatch(valid),
        Tensor::from_dispatch(sizes),
    ))
}

/// [`PlanRow::plan_inputs`] on the dispatching backend's tensors: the
/// step's `rows` inputs.
pub(crate) fn plan_inputs(
    counter: &Tensor<1>,
    ints: &Tensor<2, Int>,
    table: &Tensor<2>,
    rows: usize,
) -> Option<Tensor<2>> {
    <Dispatch as PlanRow>::plan_inputs(
        counter.clone().into_dispatch(),
        ints.clone().into_dispatch(),
        table.clone().into_dispatch(),
        rows,
    )
    .map(Tensor::from_dispatch)
}

// With burn's `fusion` (`cuda-tuned`) the plan's row is composed.
#[cfg(feature = "cuda-tuned")]
impl PlanRow for burn::backend::Cube {}

#[cfg(all(any(feature = "cuda", feature = "wgpu"), not(feature = "cuda-tuned")))]
mod cube {
    use super::super::cube::{F32, address, empty_f32, units};
    use super::PlanRow;
    use burn::backend::tensor::FloatTensor;
    use burn::tensor::{DType, Shape};
    use burn_cubecl::CubeBackend;
    use burn_cubecl::kernel::into_contiguous;
    use burn_cubecl::tensor::CubeTensor;
    use cubecl::ir::IntKind;
    use cubecl::prelude::*;

    /// One unit per target element; the first K·B units also write the
    /// validity, the first K the batch sizes.
    #[cube(launch_unchecked, address_type = "dynamic")]
    #[allow(clippy::too_many_arguments)]
    fn plan_row_kernel<F: Float, I: Int>(
        counter: &Tensor<F>,
        ints: &Tensor<I>,
        floats: &Tensor<F>,
        target: &mut Tensor<F>,
        valid: &mut Tensor<F>,
        sizes: &mut Tensor<F>,
        rows: usize,
        clients: usize,
        classes: usize,
        #[define(F, I)] _dtypes: [ElemType; 2],
    ) {
        if ABSOLUTE_POS >= target.len() {
            terminate!();
        }
        let step = u32::cast_from(counter[0]) as usize;
        let ints_at = step * 2 * rows;
        let floats_at = step * (2 * rows + clients);
        let (row, class) = (ABSOLUTE_POS / classes, ABSOLUTE_POS % classes);
        let label = u32::cast_from(ints[ints_at + rows + row]) as usize;
        let mut t = F::new(0.0);
        if label == class {
            t = floats[floats_at + row];
        }
        target[ABSOLUTE_POS] = t;
        if ABSOLUTE_POS < rows {
            valid[ABSOLUTE_POS] = floats[floats_at + rows + ABSOLUTE_POS];
        }
        if ABSOLUTE_POS < clients {
            sizes[ABSOLUTE_POS] = floats[floats_at + 2 * rows + ABSOLUTE_POS];
        }
    }

    /// One unit per input value.
    #[cube(launch_unchecked, address_type = "dynamic")]
    fn plan_inputs_kernel<F: Float, I: Int>(
        counter: &Tensor<F>,
        ints: &Tensor<I>,
        table: &Tensor<F>,
        x: &mut Tensor<F>,
        rows: usize,
        width: usize,
        #[define(F, I)] _dtypes: [ElemType; 2],
    ) {
        if ABSOLUTE_POS >= x.len() {
            terminate!();
        }
        let step = u32::cast_from(counter[0]) as usize;
        let (r, e) = (ABSOLUTE_POS / width, ABSOLUTE_POS % width);
        let sample = u32::cast_from(ints[step * 2 * rows + r]) as usize;
        x[ABSOLUTE_POS] = table[sample * width + e];
    }

    /// The plan's integer type, when the kernels take it.
    fn int_type(ints: &CubeTensor) -> Option<ElemType> {
        match ints.dtype {
            DType::I64 => Some(ElemType::Int(IntKind::I64)),
            DType::I32 => Some(ElemType::Int(IntKind::I32)),
            _ => None,
        }
    }

    impl PlanRow for CubeBackend {
        fn plan_row(
            counter: CubeTensor,
            ints: CubeTensor,
            floats: CubeTensor,
            clients: usize,
            batch: usize,
            classes: usize,
        ) -> Option<(FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>)> {
            let rows = clients * batch;
            let int = int_type(&ints)?;
            let fits = counter.dtype == DType::F32
                && floats.dtype == DType::F32
                && ints.meta.shape().dims::<2>()[1] == 2 * rows
                && floats.meta.shape().dims::<2>()[1] == 2 * rows + clients
                && classes > 0
                && rows > 0;
            if !fits {
                return None;
            }
            let [counter, ints, floats] = [counter, ints, floats].map(into_contiguous);
            let target = empty_f32(&floats, Shape::new([rows, classes]));
            let valid = empty_f32(&floats, Shape::new([batch, clients]));
            let sizes = empty_f32(&floats, Shape::new([clients]));
            let (count, dim) = units(&target, rows * classes);
            let address = address(&[&ints, &floats, &target]);
            // SAFETY: one unit per target element (checked); the counter
            // names a step of the plan (the trainer takes no more steps
            // than it has rows), so every read lies in that step's rows of
            // the contiguous tables; K ≤ K·B ≤ K·B·classes units write
            // `sizes` and `valid`.
            unsafe {
                plan_row_kernel::launch_unchecked(
                    &floats.client.clone(),
                    count,
                    dim,
                    address,
                    counter.into_tensor_arg(),
                    ints.into_tensor_arg(),
                    floats.into_tensor_arg(),
                    target.clone().into_tensor_arg(),
                    valid.clone().into_tensor_arg(),
                    sizes.clone().into_tensor_arg(),
                    rows,
                    clients,
                    classes,
                    [F32, int],
                );
            }
            Some((target, valid, sizes))
        }

        fn plan_inputs(
            counter: CubeTensor,
            ints: CubeTensor,
            table: CubeTensor,
            rows: usize,
        ) -> Option<FloatTensor<Self>> {
            let int = int_type(&ints)?;
            let width = table.meta.shape().dims::<2>()[1];
            let fits = counter.dtype == DType::F32
                && table.dtype == DType::F32
                && ints.meta.shape().dims::<2>()[1] == 2 * rows
                && rows * width > 0;
            if !fits {
                return None;
            }
            let [counter, ints, table] = [counter, ints, table].map(into_contiguous);
            let x = empty_f32(&table, Shape::new([rows, width]));
            let (count, dim) = units(&x, rows * width);
            let address = address(&[&ints, &table, &x]);
            // SAFETY: one unit per input value (checked); the counter names
            // a step of the plan, whose first `rows` integers are rows of
            // the resident table (`BatchedTrainer::arrays`, the zero row
            // for padding), all contiguous.
            unsafe {
                plan_inputs_kernel::launch_unchecked(
                    &table.client.clone(),
                    count,
                    dim,
                    address,
                    counter.into_tensor_arg(),
                    ints.into_tensor_arg(),
                    table.into_tensor_arg(),
                    x.clone().into_tensor_arg(),
                    rows,
                    width,
                    [F32, int],
                );
            }
            Some(x)
        }
    }
}
