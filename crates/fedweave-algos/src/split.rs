//! Split-model federation: "average one part of the model, keep the rest".
//!
//! FedRep, FedPer, FedBABU (the body shared, the head kept), LG-FedAvg (the
//! head shared, the body kept) and FedBN (everything shared but the
//! batch-norm layers) differ only in which [`Part`] of the flat parameter
//! vector travels and in how clients train; the wire message ([`Shared`]),
//! its check, the server's average and the client's merge live here once.
//!
//! Graph: the shared part's graph has every row equal to the data-size
//! weights p over the round's participants (its average is broadcast to
//! every client, absent ones included, as FedAvg's global model is); the
//! kept part's graph is the identity. Both go to [`RoundOutcome::layers`],
//! and [`RoundOutcome::graph`] is their mean (as for every per-layer
//! method). When the kept part is empty (FedBN on a model without batch
//! norm) there is one group, the whole model: no per-group graphs, and the
//! graph is FedAvg's.

use crate::{ClientCx, Env, Message, Model, RoundOutcome, ids_of};
use fedweave_core::CollaborationGraph;
use fedweave_core::vecmath::{all_finite, weighted_sum};
use fedweave_nn::ModelSpec;
use serde::{Deserialize, Serialize};
use std::ops::Range;

/// A set of elements of the flat parameter vector: sorted, disjoint,
/// non-empty ranges.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Part {
    ranges: Vec<Range<usize>>,
}

impl Part {
    /// The union of `ranges` (in any order, possibly overlapping or empty).
    pub fn new(ranges: impl IntoIterator<Item = Range<usize>>) -> Self {
        let mut ranges: Vec<Range<usize>> = ranges.into_iter().filter(|r| !r.is_empty()).collect();
        ranges.sort_by_key(|r| r.start);
        let mut merged: Vec<Range<usize>> = Vec::with_capacity(ranges.len());
        for r in ranges {
            match merged.last_mut() {
                Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
                _ => merged.push(r),
            }
        }
        Self { ranges: merged }
    }

    /// One range.
    pub fn range(range: Range<usize>) -> Self {
        Self::new(std::iter::once(range))
    }

    /// The body: every layer before the head.
    pub fn base(spec: &ModelSpec) -> Self {
        Self::range(spec.split().base)
    }

    /// The head: the last linear layer.
    pub fn head(spec: &ModelSpec) -> Self {
        Self::range(spec.split().head)
    }

    /// The batch-norm layers' scales and shifts (empty without BN).
    pub fn batch_norm(spec: &ModelSpec) -> Self {
        Self::new(spec.split().batch_norm)
    }

    /// Every element of a `len`-element vector outside this part.
    pub fn complement(&self, len: usize) -> Self {
        let mut out = Vec::with_capacity(self.ranges.len() + 1);
        let mut at = 0;
        for r in &self.ranges {
            out.push(at..r.start.min(len));
            at = r.end;
        }
        out.push(at.min(len)..len);
        Self::new(out)
    }

    /// The ranges, ascending.
    pub fn ranges(&self) -> &[Range<usize>] {
        &self.ranges
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.ranges.iter().map(|r| r.len()).sum()
    }

    /// True when the part has no element.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// The part's elements of `params`, in order.
    pub fn gather(&self, params: &[f32]) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.len());
        for r in &self.ranges {
            out.extend_from_slice(&params[r.clone()]);
        }
        out
    }

    /// Writes `values` (as [`Part::gather`] lays them out) into the part's
    /// elements of `params`; the rest of `params` is untouched.
    ///
    /// # Panics
    ///
    /// If `values` is not [`Part::len`] long (uploads are checked before).
    pub fn scatter(&self, values: &[f32], params: &mut [f32]) {
        assert_eq!(values.len(), self.len(), "a part of the wrong length");
        let mut at = 0;
        for r in &self.ranges {
            params[r.clone()].copy_from_slice(&values[at..at + r.len()]);
            at += r.len();
        }
    }
}

/// The shared part of a model on the wire (an upload or a download): only
/// its elements, so the byte count is exactly the part's.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Shared {
    /// The part's elements, as [`Part::gather`] lays them out.
    #[serde(with = "fedweave_core::stash::vector")]
    pub values: Vec<f32>,
}

impl Message for Shared {
    fn vectors(&self) -> Vec<&[f32]> {
        vec![&self.values]
    }
    fn vectors_mut(&mut self) -> Vec<&mut [f32]> {
        vec![&mut self.values]
    }
}

/// How a split method federates: which part is shared, and the names of
/// the shared and the kept group in the logged per-group graphs.
#[derive(Clone, Debug)]
pub struct Federation {
    shared: Part,
    kept: Part,
    shared_name: &'static str,
    kept_name: &'static str,
    /// The kept group is logged first (FedBN's "bn" before "rest").
    kept_first: bool,
}

impl Federation {
    /// `shared` travels and is averaged; every other element of a
    /// `len`-element model stays with its client.
    pub fn new(
        shared: Part,
        len: usize,
        shared_name: &'static str,
        kept_name: &'static str,
    ) -> Self {
        Self {
            kept: shared.complement(len),
            shared,
            shared_name,
            kept_name,
            kept_first: false,
        }
    }

    /// Logs the kept group's graph before the shared one's.
    pub fn kept_first(mut self) -> Self {
        self.kept_first = true;
        self
    }

    /// The shared part.
    pub fn shared(&self) -> &Part {
        &self.shared
    }

    /// The part each client keeps.
    pub fn kept(&self) -> &Part {
        &self.kept
    }

    /// The message carrying `params`' shared part.
    pub fn upload(&self, params: &[f32]) -> Shared {
        Shared {
            values: self.shared.gather(params),
        }
    }

    /// A participant's upload at the end of its local round: the shared
    /// part of `params`. When the runtime recorded the model the round's
    /// training started from (`cx.origin`, for the `inv_grad` attack, which
    /// reflects the upload about it element by element), that record is cut
    /// to the same part, so each uploaded element meets its own start.
    pub fn send(&self, cx: &mut ClientCx, params: &[f32]) -> Shared {
        if let Some(Some(origin)) = &mut cx.origin {
            *origin = self.shared.gather(origin);
        }
        self.upload(params)
    }

    /// Exactly the shared part's length, every value finite.
    pub fn check(&self, up: &Shared) -> Result<(), String> {
        if up.values.len() != self.shared.len() {
            return Err(format!(
                "a shared part of {} values where it has {}",
                up.values.len(),
                self.shared.len()
            ));
        }
        if !all_finite(&up.values) {
            return Err("non-finite values".into());
        }
        Ok(())
    }

    /// FedAvg of the participants' shared parts (weights p = data sizes over
    /// the participants), sent to every client; the graphs as in the
    /// module doc.
    pub fn average(&self, env: &Env, uploads: &[(usize, Shared)]) -> RoundOutcome<Shared> {
        let participants = ids_of(uploads);
        let parts: Vec<&[f32]> = uploads.iter().map(|(_, u)| u.values.as_slice()).collect();
        let p = env.size_weights(&participants);
        let mut mean = vec![0.0f32; self.shared.len()];
        weighted_sum(&p, &parts, &mut mean);
        let mut row = vec![0.0; env.clients()];
        for (w, &j) in p.iter().zip(&participants) {
            row[j] = *w;
        }
        let averaged = CollaborationGraph::broadcast_row(&row);
        let downloads = (0..env.clients())
            .map(|i| {
                (
                    i,
                    Shared {
                        values: mean.clone(),
                    },
                )
            })
            .collect();
        if self.kept.is_empty() {
            return RoundOutcome::new(averaged, downloads);
        }
        let kept = CollaborationGraph::identity(env.clients());
        let shared = (self.shared_name.to_string(), averaged);
        let kept = (self.kept_name.to_string(), kept);
        let layers = if self.kept_first {
            vec![kept, shared]
        } else {
            vec![shared, kept]
        };
        let graphs: Vec<CollaborationGraph> = layers.iter().map(|(_, g)| g.clone()).collect();
        RoundOutcome {
            graph: CollaborationGraph::mean(&graphs),
            layers,
            downloads,
        }
    }

    /// The client's side: the received shared part replaces its own; the
    /// kept part and the batch-norm statistics stay.
    pub fn receive(&self, model: &mut Model, down: &Shared) {
        self.shared.scatter(&down.values, &mut model.params);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fedweave_core::{Purpose, rng_stream};
    use fedweave_nn::{ModelKind, TrainConfig};

    #[test]
    fn parts_merge_complement_gather_and_scatter() {
        let p = Part::new([5..7, 0..2, 1..3, 9..9]);
        assert_eq!(p.ranges(), &[0..3, 5..7]);
        assert_eq!(p.len(), 5);
        let c = p.complement(10);
        assert_eq!(c.ranges(), &[3..5, 7..10]);
        assert_eq!(Part::range(0..10).complement(10), Part::new([]));
        assert!(Part::range(0..10).complement(10).is_empty());
        let v: Vec<f32> = (0..10).map(|x| x as f32).collect();
        assert_eq!(p.gather(&v), vec![0.0, 1.0, 2.0, 5.0, 6.0]);
        let mut w = vec![-1.0f32; 10];
        p.scatter(&[10.0, 11.0, 12.0, 15.0, 16.0], &mut w);
        assert_eq!(
            w,
            vec![10.0, 11.0, 12.0, -1.0, -1.0, 15.0, 16.0, -1.0, -1.0, -1.0]
        );
    }

    fn env_parts() -> (ModelSpec, Vec<f32>, TrainConfig) {
        let spec = ModelSpec::new(ModelKind::MLP, &[4], 3).unwrap();
        let init = spec.init(&mut rng_stream(1, 0, 0, Purpose::ModelInit));
        let train = TrainConfig {
            lr: 0.1,
            momentum: 0.0,
            weight_decay: 0.0,
            batch_size: 4,
            iterations: 1,
            epochs: 1,
        };
        (spec, init, train)
    }

    /// The averaged part is Σ p_j x_j with p ∝ data sizes, it reaches every
    /// client, the kept part of a receiving model is untouched, and the
    /// graphs are p rows (shared) and I (kept), the summary their mean.
    #[test]
    fn average_is_size_weighted_and_keeps_the_rest() {
        let (spec, init, train) = env_parts();
        let sizes = [10usize, 30, 60];
        let env = Env {
            spec: &spec,
            train: &train,
            sizes: &sizes,
            init: &init,
            relation: None,
            label_counts: &[],
            kernels: fedweave_core::pairwise::Kernels::cpu(),
        };
        let fed = Federation::new(Part::range(1..3), 5, "base", "head");
        assert_eq!(fed.kept().ranges(), &[0..1, 3..5]);
        let ups = vec![
            (
                0,
                fed.upload(&[9.0, 1.0, 2.0, 9.0, 9.0]), // part = [1, 2]
            ),
            (2, fed.upload(&[9.0, 3.0, 6.0, 9.0, 9.0])), // part = [3, 6]
        ];
        assert_eq!(ups[0].1.bytes(), 8);
        let out = fed.average(&env, &ups);
        // p = (10, 60)/70.
        let want = [
            (10.0 * 1.0 + 60.0 * 3.0) / 70.0,
            (10.0 * 2.0 + 60.0 * 6.0) / 70.0,
        ];
        assert_eq!(out.downloads.len(), 3);
        for (i, d) in &out.downloads {
            assert!((d.values[0] - want[0] as f32).abs() < 1e-6, "{i}");
            assert!((d.values[1] - want[1] as f32).abs() < 1e-6, "{i}");
        }
        let mut model = Model {
            params: vec![-1.0, -2.0, -3.0, -4.0, -5.0],
            buffers: vec![7.0],
        };
        fed.receive(&mut model, &out.downloads[1].1);
        assert_eq!(model.params[0], -1.0);
        assert_eq!(&model.params[3..], &[-4.0, -5.0]);
        assert!((model.params[1] - want[0] as f32).abs() < 1e-6);
        assert_eq!(model.buffers, vec![7.0]);
        assert_eq!(out.layers.len(), 2);
        assert_eq!(out.layers[0].0, "base");
        assert_eq!(out.layers[1].0, "head");
        let (p0, p2) = (10.0 / 70.0, 60.0 / 70.0);
        for i in 0..3 {
            assert_eq!(out.layers[0].1.row(i), &[p0, 0.0, p2]);
            let mut id = [0.0; 3];
            id[i] = 1.0;
            assert_eq!(out.layers[1].1.row(i), &id);
            for (j, id) in id.iter().enumerate() {
                let mean = (out.layers[0].1.get(i, j) + id) / 2.0;
                assert!((out.graph.get(i, j) - mean).abs() < 1e-15);
            }
        }
        let first = Federation::new(Part::range(1..3), 5, "rest", "bn").kept_first();
        let out = first.average(&env, &ups);
        assert_eq!(out.layers[0].0, "bn");
        assert_eq!(out.layers[1].0, "rest");
        // With nothing kept, one group: FedAvg's graph and no layers.
        let all = Federation::new(Part::range(0..5), 5, "rest", "bn");
        let out = all.average(
            &env,
            &[(
                1,
                Shared {
                    values: vec![1.0; 5],
                },
            )],
        );
        assert!(out.layers.is_empty());
        assert_eq!(out.graph.row(2), &[0.0, 1.0, 0.0]);
    }

    #[test]
    fn check_wants_exact_length_and_finite_values() {
        let fed = Federation::new(Part::range(1..3), 5, "base", "head");
        let ok = Shared {
            values: vec![0.5, -0.5],
        };
        assert_eq!(fed.check(&ok), Ok(()));
        for bad in [vec![0.5], vec![0.5, 0.5, 0.5], vec![0.5; 5]] {
            assert!(fed.check(&Shared { values: bad }).is_err());
        }
        for bad in [f32::NAN, f32::INFINITY] {
            let up = Shared {
                values: vec![0.5, bad],
            };
            assert_eq!(fed.check(&up), Err("non-finite values".into()));
        }
    }
}
