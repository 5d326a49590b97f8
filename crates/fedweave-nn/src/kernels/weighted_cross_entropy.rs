//! The batched trainer's loss: each client's cross-entropy against weighted
//! targets, as one operation with a hand-written backward step.
//!
//! With logits `x` and targets `t` (`[K, B, N]`: one-hot rows weighted
//! `1/b_k`, zero rows for padding) client k's loss is
//! `L_k = −Σ_b Σ_n t·(x − lse)` with `lse = log Σ_n exp(x)` per row, and
//! `∂L_k/∂x = (softmax(x)·Σ_n t − t)`. As burn's operations (log-softmax,
//! product, two sums, negation) and their autodiff steps that was about 25
//! launches a step; on the cube backends it is one kernel each way (one
//! cube per client forward, one thread per client and class backward,
//! down the client's rows). The output layer's bias can be part of it
//! (`x` = product + bias; its gradient the sum of the logits' over the
//! rows): one launch each way fewer. The CPU keeps burn's composition (its
//! batched results are pinned against one client at a time); the `Flex`
//! form here is the same formula as burn's operations, the reference for
//! the kernels.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::tensor::FloatTensor;
use burn::backend::{
    Autodiff, AutodiffBackend, Backend, Dispatch, Flex, TensorMetadata, backend_extension,
};
use burn::tensor::{Shape, Tensor};

/// Weighted cross-entropy per client.
#[backend_extension(Flex, Cube: cfg(any(feature = "cuda", feature = "wgpu")), Autodiff)]
pub trait WeightedCrossEntropy: Backend {
    /// Each client's `−Σ_b Σ_n t·log softmax(x)` (`[K]`) for logits `x` =
    /// `logits` plus `bias` (`[K, N]`, client k's added to each of its rows,
    /// when `has_bias`; any tensor otherwise, never read) and targets `t`
    /// (`[K, B, N]`), with each row's log-sum-exp and target mass `Σ_n t`
    /// (`[K, B, 1]`) for the backward step.
    fn weighted_cross_entropy(
        logits: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        has_bias: bool,
        target: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);

    /// The gradients with respect to the logits and the bias at `dloss`
    /// (`[K]`): `d = (exp(x − lse)·mass − t)·dloss_k` and `Σ_b d` (`[K, N]`,
    /// whether or not there is a bias).
    #[allow(clippy::too_many_arguments)]
    fn weighted_cross_entropy_backward(
        dloss: FloatTensor<Self>,
        logits: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        has_bias: bool,
        target: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        mass: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);
}

/// [`WeightedCrossEntropy::weighted_cross_entropy`] of the dispatching
/// backend's `logits` plus `bias` (`[K, N]`; both under autodiff) against
/// `target`: each client's loss, `[K]`.
pub(crate) fn weighted_cross_entropy(
    logits: Tensor<3>,
    bias: Option<Tensor<2>>,
    target: Tensor<3>,
) -> Tensor<1> {
    let has_bias = bias.is_some();
    // Without a bias the targets stand in for it (never read).
    let bias = bias.map_or_else(|| target.clone().into_dispatch(), Tensor::into_dispatch);
    let (loss, _, _) = <Dispatch as WeightedCrossEntropy>::weighted_cross_entropy(
        logits.into_dispatch(),
        bias,
        has_bias,
        target.into_dispatch(),
    );
    Tensor::from_dispatch(loss)
}

/// `logits` plus the bias, if any.
fn biased<B: Backend>(logits: FloatTensor<B>, bias: Option<FloatTensor<B>>) -> FloatTensor<B> {
    match bias {
        Some(bias) => {
            let [k, n] = bias.shape().dims::<2>();
            B::float_add(logits, B::float_reshape(bias, Shape::new([k, 1, n])))
        }
        None => logits,
    }
}

/// The forward formula as burn's operations: `(loss, lse, mass)`.
fn forward_composed<B: Backend>(
    logits: FloatTensor<B>,
    bias: Option<FloatTensor<B>>,
    target: FloatTensor<B>,
) -> (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) {
    let logits = biased::<B>(logits, bias);
    let [k, b, _] = logits.shape().dims::<3>();
    let top = B::float_max_dim(logits.clone(), 2);
    let shifted = B::float_sub(logits, top.clone());
    let log_sum = B::float_log(B::float_sum_dim(B::float_exp(shifted.clone()), 2));
    let log_p = B::float_sub(shifted, log_sum.clone());
    let mass = B::float_sum_dim(target.clone(), 2);
    let rows = B::float_sum_dim(B::float_mul(log_p, target), 2);
    let loss = B::float_neg(B::float_sum_dim(
        B::float_reshape(rows, Shape::new([k, b])),
        1,
    ));
    let lse = B::float_add(top, log_sum);
    (B::float_reshape(loss, Shape::new([k])), lse, mass)
}

/// The backward formula as burn's operations: `(dlogits, dbias)`.
fn backward_composed<B: Backend>(
    dloss: FloatTensor<B>,
    logits: FloatTensor<B>,
    bias: Option<FloatTensor<B>>,
    target: FloatTensor<B>,
    lse: FloatTensor<B>,
    mass: FloatTensor<B>,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let logits = biased::<B>(logits, bias);
    let [k, _, n] = logits.shape().dims::<3>();
    let soft = B::float_exp(B::float_sub(logits, lse));
    let d = B::float_sub(B::float_mul(soft, mass), target);
    let d = B::float_mul(d, B::float_reshape(dloss, Shape::new([k, 1, 1])));
    let dbias = B::float_reshape(B::float_sum_dim(d.clone(), 1), Shape::new([k, n]));
    (d, dbias)
}

/// [`WeightedCrossEntropy`] as burn's operations: the CPU's form (the kernels' reference)
/// and, with burn's fusion (`cuda-tuned`), the cube backend's, whose fusion
/// joins the element-wise operations itself.
macro_rules! composed {
    ($backend:ty) => {
        impl WeightedCrossEntropy for $backend {
            fn weighted_cross_entropy(
                logits: FloatTensor<Self>,
                bias: FloatTensor<Self>,
                has_bias: bool,
                target: FloatTensor<Self>,
            ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
                forward_composed::<Self>(logits, has_bias.then_some(bias), target)
            }

            fn weighted_cross_entropy_backward(
                dloss: FloatTensor<Self>,
                logits: FloatTensor<Self>,
                bias: FloatTensor<Self>,
                has_bias: bool,
                target: FloatTensor<Self>,
                lse: FloatTensor<Self>,
                mass: FloatTensor<Self>,
            ) -> (FloatTensor<Self>, FloatTensor<Self>) {
                let bias = has_bias.then_some(bias);
                backward_composed::<Self>(dloss, logits, bias, target, lse, mass)
            }
        }
    };
}

composed!(Flex);

/// The backward step, with (`N` = 2) or without (`N` = 1) a bias.
#[derive(Debug)]
struct CrossEntropyBackward<const N: usize>;

/// The logits, the bias, the targets, log-sum-exps and target masses.
#[derive(Clone, Debug)]
struct State<B: Backend> {
    logits: FloatTensor<B>,
    bias: Option<FloatTensor<B>>,
    target: FloatTensor<B>,
    lse: FloatTensor<B>,
    mass: FloatTensor<B>,
}

impl<const N: usize> CrossEntropyBackward<N> {
    /// Registers the gradients of the parents that need one: the logits
    /// and the bias (`parents`, in that order).
    fn register<B: WeightedCrossEntropy>(self, ops: Ops<State<B>, N>, grads: &mut Gradients) {
        let dloss = grads.consume::<B>(&ops.node);
        let State {
            logits,
            bias,
            target,
            lse,
            mass,
        } = ops.state;
        let has_bias = bias.is_some();
        let bias = bias.unwrap_or_else(|| target.clone());
        let (dlogits, dbias) =
            B::weighted_cross_entropy_backward(dloss, logits, bias, has_bias, target, lse, mass);
        for (node, grad) in ops.parents.into_iter().zip([dlogits, dbias]) {
            if let Some(node) = node {
                grads.register::<B>(node.id, grad);
            }
        }
    }
}

impl<B: WeightedCrossEntropy> Backward<B, 1> for CrossEntropyBackward<1> {
    type State = State<B>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        self.register::<B>(ops, grads);
    }
}

impl<B: WeightedCrossEntropy> Backward<B, 2> for CrossEntropyBackward<2> {
    type State = State<B>;

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        self.register::<B>(ops, grads);
    }
}

/// The loss under autodiff of `inputs` (the logits and, with `N` = 2, the
/// bias) against `target`, which is data (no gradient flows to it).
fn tracked<B: WeightedCrossEntropy, C: CheckpointStrategy, const N: usize>(
    op: CrossEntropyBackward<N>,
    inputs: [FloatTensor<Autodiff<B, C>>; N],
    target: FloatTensor<Autodiff<B, C>>,
) -> [FloatTensor<Autodiff<B, C>>; 3]
where
    CrossEntropyBackward<N>: Backward<B, N, State = State<B>>,
{
    let prep = op
        .prepare::<C>(inputs.each_ref().map(|t| t.node()))
        .compute_bound()
        .stateful();
    let mut prims = inputs.into_iter().map(|t| t.into_primitive());
    let logits = prims.next().expect("the logits");
    let bias = prims.next();
    let target = target.into_primitive();
    let (loss, lse, mass) = B::weighted_cross_entropy(
        logits.clone(),
        bias.clone().unwrap_or_else(|| target.clone()),
        bias.is_some(),
        target.clone(),
    );
    let loss = match prep {
        OpsKind::Tracked(prep) => {
            let state = State {
                logits,
                bias,
                target,
                lse: lse.clone(),
                mass: mass.clone(),
            };
            prep.finish(state, loss)
        }
        OpsKind::UnTracked(prep) => prep.finish(loss),
    };
    [
        loss,
        Autodiff::<B, C>::from_inner(lse),
        Autodiff::<B, C>::from_inner(mass),
    ]
}

impl<B: WeightedCrossEntropy, C: CheckpointStrategy> WeightedCrossEntropy for Autodiff<B, C> {
    fn weighted_cross_entropy(
        logits: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        has_bias: bool,
        target: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let [loss, lse, mass] = if has_bias {
            tracked::<B, C, 2>(CrossEntropyBackward, [logits, bias], target)
        } else {
            tracked::<B, C, 1>(CrossEntropyBackward, [logits], target)
        };
        (loss, lse, mass)
    }

    fn weighted_cross_entropy_backward(
        dloss: FloatTensor<Self>,
        logits: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        has_bias: bool,
        target: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        mass: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        // Not differentiated again: the inner backend's step, detached.
        let (dlogits, dbias) = B::weighted_cross_entropy_backward(
            dloss.into_primitive(),
            logits.into_primitive(),
            bias.into_primitive(),
            has_bias,
            target.into_primitive(),
            lse.into_primitive(),
            mass.into_primitive(),
        );
        (Self::from_inner(dlogits), Self::from_inner(dbias))
    }
}

#[cfg(feature = "cuda-tuned")]
composed!(burn::backend::Cube);

#[cfg(all(any(feature = "cuda", feature = "wgpu"), not(feature = "cuda-tuned")))]
mod cube {
    //! Forward: one cube per client, its units striding over the client's
    //! rows (N logits each, read serially) and meeting for the sum.
    //! Backward: one unit per client and class, down the client's rows.

    use super::super::cube::{F32, THREADS, address, cube_sum, empty_f32, units};
    use super::{WeightedCrossEntropy, backward_composed, forward_composed};
    use burn::backend::tensor::FloatTensor;
    use burn::tensor::{DType, Shape};
    use burn_cubecl::CubeBackend;
    use burn_cubecl::kernel::into_contiguous;
    use burn_cubecl::tensor::CubeTensor;
    use cubecl::prelude::*;

    /// Logit `n` of the row starting at `row` (of client `k`) plus its bias
    /// when `has_bias` is 1.
    #[cube]
    fn logit<F: Float>(
        logits: &Tensor<F>,
        bias: &Tensor<F>,
        row: usize,
        k: usize,
        n: usize,
        classes: usize,
        has_bias: u32,
    ) -> F {
        let mut x = logits[row + n];
        if has_bias == 1 {
            x += bias[k * classes + n];
        }
        x
    }

    #[cube(launch_unchecked, address_type = "dynamic")]
    #[allow(clippy::too_many_arguments)]
    fn cross_entropy_forward_kernel<F: Float>(
        logits: &Tensor<F>,
        bias: &Tensor<F>,
        target: &Tensor<F>,
        loss: &mut Tensor<F>,
        lse: &mut Tensor<F>,
        mass: &mut Tensor<F>,
        rows: usize,
        classes: usize,
        has_bias: u32,
        #[define(F)] _dtype: ElemType,
    ) {
        let k = CUBE_POS;
        let mut sums = Shared::new_slice(comptime!(THREADS as usize));
        let mut acc = F::new(0.0);
        let mut b = UNIT_POS as usize;
        while b < rows {
            let row = (k * rows + b) * classes;
            let mut top = logit::<F>(logits, bias, row, k, 0, classes, has_bias);
            for n in 1..classes {
                top = F::max(top, logit::<F>(logits, bias, row, k, n, classes, has_bias));
            }
            let mut total = F::new(0.0);
            for n in 0..classes {
                total += F::exp(logit::<F>(logits, bias, row, k, n, classes, has_bias) - top);
            }
            let log_sum = F::ln(total);
            let (mut weighted, mut weight) = (F::new(0.0), F::new(0.0));
            for n in 0..classes {
                let t = target[row + n];
                let x = logit::<F>(logits, bias, row, k, n, classes, has_bias);
                weighted += (x - top - log_sum) * t;
                weight += t;
            }
            acc -= weighted;
            lse[k * rows + b] = top + log_sum;
            mass[k * rows + b] = weight;
            b += CUBE_DIM as usize;
        }
        let total = cube_sum::<F>(acc, &mut sums);
        if UNIT_POS == 0 {
            loss[k] = total;
        }
    }

    #[cube(launch_unchecked, address_type = "dynamic")]
    #[allow(clippy::too_many_arguments)]
    fn cross_entropy_backward_kernel<F: Float>(
        dloss: &Tensor<F>,
        logits: &Tensor<F>,
        bias: &Tensor<F>,
        target: &Tensor<F>,
        lse: &Tensor<F>,
        mass: &Tensor<F>,
        out: &mut Tensor<F>,
        dbias: &mut Tensor<F>,
        rows: usize,
        classes: usize,
        has_bias: u32,
        #[define(F)] _dtype: ElemType,
    ) {
        if ABSOLUTE_POS >= dbias.len() {
            terminate!();
        }
        let (k, n) = (ABSOLUTE_POS / classes, ABSOLUTE_POS % classes);
        let scale = dloss[k];
        let mut sum = F::new(0.0);
        for b in 0..rows {
            let row = k * rows + b;
            let x = logit::<F>(logits, bias, row * classes, k, n, classes, has_bias);
            let soft = F::exp(x - lse[row]);
            let at = row * classes + n;
            let d = (soft * mass[row] - target[at]) * scale;
            out[at] = d;
            sum += d;
        }
        dbias[ABSOLUTE_POS] = sum;
    }

    fn f32s(tensors: &[&CubeTensor]) -> bool {
        tensors.iter().all(|t| t.dtype == DType::F32)
    }

    impl WeightedCrossEntropy for CubeBackend {
        fn weighted_cross_entropy(
            logits: CubeTensor,
            bias: CubeTensor,
            has_bias: bool,
            target: CubeTensor,
        ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
            let [k, b, n] = logits.meta.shape().dims::<3>();
            if !f32s(&[&logits, &bias, &target]) || k * b * n == 0 {
                return forward_composed::<Self>(logits, has_bias.then_some(bias), target);
            }
            let [logits, bias, target] = [logits, bias, target].map(into_contiguous);
            let loss = empty_f32(&logits, Shape::new([k]));
            let (lse, mass) = (
                empty_f32(&logits, Shape::new([k, b, 1])),
                empty_f32(&logits, Shape::new([k, b, 1])),
            );
            let client = logits.client.clone();
            let address = address(&[&logits]);
            // SAFETY: one cube per client; unit b reads row (k, b)'s N
            // logits and targets (b < B) and client k's N biases (when
            // there is a bias), and writes its log-sum-exp and mass; unit 0
            // writes loss[k]. All contiguous.
            unsafe {
                cross_entropy_forward_kernel::launch_unchecked(
                    &client,
                    CubeCount::Static(k as u32, 1, 1),
                    CubeDim::new_1d(THREADS),
                    address,
                    logits.into_tensor_arg(),
                    bias.into_tensor_arg(),
                    target.into_tensor_arg(),
                    loss.clone().into_tensor_arg(),
                    lse.clone().into_tensor_arg(),
                    mass.clone().into_tensor_arg(),
                    b,
                    n,
                    u32::from(has_bias),
                    F32,
                );
            }
            (loss, lse, mass)
        }

        fn weighted_cross_entropy_backward(
            dloss: CubeTensor,
            logits: CubeTensor,
            bias: CubeTensor,
            has_bias: bool,
            target: CubeTensor,
            lse: CubeTensor,
            mass: CubeTensor,
        ) -> (FloatTensor<Self>, FloatTensor<Self>) {
            let shape = logits.meta.shape().clone();
            let [k, b, n] = shape.dims::<3>();
            if !f32s(&[&dloss, &logits, &bias, &target, &lse, &mass]) || k * n == 0 {
                let bias = has_bias.then_some(bias);
                return backward_composed::<Self>(dloss, logits, bias, target, lse, mass);
            }
            let [dloss, logits, bias, target, lse, mass] =
                [dloss, logits, bias, target, lse, mass].map(into_contiguous);
            let out = empty_f32(&logits, shape);
            let dbias = empty_f32(&logits, Shape::new([k, n]));
            let client = logits.client.clone();
            let address = address(&[&logits, &out]);
            let (cube_count, cube_dim) = units(&dbias, k * n);
            // SAFETY: one unit per client and class (< K·N, checked); it
            // reads and writes (k, b, n) for b < B of the contiguous
            // `[K, B, N]` tensors, row (k, b) of the row tensors and client
            // k of `dloss`.
            unsafe {
                cross_entropy_backward_kernel::launch_unchecked(
                    &client,
                    cube_count,
                    cube_dim,
                    address,
                    dloss.into_tensor_arg(),
                    logits.into_tensor_arg(),
                    bias.into_tensor_arg(),
                    target.into_tensor_arg(),
                    lse.into_tensor_arg(),
                    mass.into_tensor_arg(),
                    out.clone().into_tensor_arg(),
                    dbias.clone().into_tensor_arg(),
                    b,
                    n,
                    u32::from(has_bias),
                    F32,
                );
            }
            (out, dbias)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::close;
    use super::weighted_cross_entropy;
    use burn::tensor::activation::log_softmax;
    use burn::tensor::{Device, Distribution, Tensor, TensorData};

    /// Each client's loss and the gradients of the logits and of the output
    /// layer's bias equal burn's addition and log-softmax composition
    /// through autodiff (the batched trainer's loss until now), with and
    /// without the bias, with weighted one-hot rows, padding rows of zeros
    /// and a client with no row at all; logits up to ±40 so the shift by
    /// the row's maximum matters.
    #[test]
    fn the_operation_is_burns_log_softmax_loss() {
        let device = Device::flex().autodiff();
        let (k, b, n) = (3, 4, 7);
        let logits = Tensor::<3>::random([k, b, n], Distribution::Uniform(-40.0, 40.0), &device)
            .require_grad();
        // Client 0: four rows weighted 1/4; client 1: two rows of 1/2 and
        // two padding rows; client 2 rests.
        let mut t = vec![0.0f32; k * b * n];
        for (row, weight) in [
            (0, 0.25),
            (1, 0.25),
            (2, 0.25),
            (3, 0.25),
            (4, 0.5),
            (5, 0.5),
        ] {
            t[row * n + (row * 3) % n] = weight;
        }
        let target = Tensor::<3>::from_data(TensorData::new(t, [k, b, n]), &device);
        let dloss = Tensor::<1>::from_data(TensorData::new(vec![1.0f32, -2.0, 0.5], [k]), &device);
        let bias =
            Tensor::<2>::random([k, n], Distribution::Uniform(-5.0, 5.0), &device).require_grad();
        for with_bias in [false, true] {
            let run = |ours: bool| {
                let loss = if ours {
                    let bias = with_bias.then(|| bias.clone());
                    weighted_cross_entropy(logits.clone(), bias, target.clone())
                } else {
                    let x = if with_bias {
                        logits.clone() + bias.clone().reshape([k, 1, n])
                    } else {
                        logits.clone()
                    };
                    log_softmax(x, 2)
                        .mul(target.clone())
                        .sum_dim(2)
                        .sum_dim(1)
                        .neg()
                        .reshape([k])
                };
                let grads = (loss.clone() * dloss.clone()).sum().backward();
                (
                    loss.inner(),
                    logits.grad(&grads).expect("d logits"),
                    bias.grad(&grads),
                )
            };
            let (l1, g1, b1) = run(true);
            let (l2, g2, b2) = run(false);
            let case = format!("bias {with_bias}");
            close(l1.clone(), l2, 1e-5, &format!("{case}: losses"));
            close(g1, g2, 1e-5, &format!("{case}: gradients"));
            match (b1, b2) {
                (Some(a), Some(b)) => close(a, b, 1e-5, &format!("{case}: bias gradients")),
                (None, None) => assert!(!with_bias, "{case}: no bias gradient"),
                _ => panic!("{case}: a bias gradient on one side only"),
            }
            assert_eq!(
                l1.into_data().try_to_vec::<f32>().unwrap()[2],
                0.0,
                "{case}: a resting client's loss"
            );
        }
    }
}
