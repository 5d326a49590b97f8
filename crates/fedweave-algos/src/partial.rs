//! Partial-model averaging: the whole model trains locally and one part of
//! it is federated, the rest stays with its client. Three baselines are
//! this one rule with a different shared part:
//!
//! - `fedper` (Arivazhagan et al., 2019): the body ("base", every layer
//!   before the last linear layer) is shared, the head personal. PFLlib
//!   splits at the same place (`model.fc` becomes the head).
//! - `lg-fedavg` (Liang et al., 2020), as PFLlib runs it: the opposite, a
//!   shared head and a personal body. The paper's "local representations"
//!   are the lower layers and the global part the top layers; PFLlib shares
//!   exactly the last linear layer (`model.head`), as fedweave does.
//! - `fedbn` (Li et al., ICLR 2021): everything but the batch-norm scales
//!   and shifts ("rest") is shared; the BN layers ("bn") stay local. BN
//!   running statistics are never shared by any fedweave method (they are
//!   client buffers), so on a model without batch norm (`mlp`, `cnn`)
//!   nothing is kept and FedBN *is* FedAvg, bit for bit: same uploads, same
//!   graph, no per-group graphs. Use it with `cnn-bn` or `cnn-dwa`.
//!
//! Graph rule: the shared part is averaged with the data-size weights p over
//! the round's participants and sent to every client; the kept part has the
//! identity graph. Both are logged per group ([`crate::split`]). Only the
//! shared part travels, both ways. Local objective: cross-entropy on the
//! whole model. Evaluation: FedPer and LG-FedAvg score the model after
//! local training, as the other personalised methods; FedBN scores the
//! model after receiving (the averaged parameters with the client's own BN
//! layers), as FedAvg evaluates the global model and PFLlib evaluates FedBN.
//! None has parameters.

use crate::Checked;
use crate::params::Validate;
use crate::split::{Federation, Part, Shared};
use crate::{AlgoError, Algorithm, ClientCx, Env, EvalPoint, Info, Model, RoundOutcome, Trained};
use serde::{Deserialize, Serialize};

/// FedPer, LG-FedAvg and FedBN have no parameters.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PartialAvgParams {}

impl Validate for PartialAvgParams {}

/// FedPer, LG-FedAvg or FedBN: which part is shared.
pub struct PartialAvg {
    name: &'static str,
    fed: Federation,
    eval_point: EvalPoint,
}

impl Algorithm for PartialAvg {
    const NAMES: &'static [Info] = &[
        Info {
            name: "fedper",
            summary: "body (all but the last layer) averaged with p and broadcast, head personal; whole model trained",
            reference: "Arivazhagan et al., arXiv 2019",
        },
        Info {
            name: "lg-fedavg",
            summary: "head (last layer) averaged with p and broadcast, body personal; whole model trained",
            reference: "Liang et al., arXiv 2020 (PFLlib version)",
        },
        Info {
            name: "fedbn",
            summary: "FedAvg of every parameter but the batch-norm layers, which stay local (= FedAvg without BN); evaluates the received model",
            reference: "Li et al., ICLR 2021",
        },
    ];
    type Params = PartialAvgParams;
    type Client = Model;
    type Server = ();
    /// The averaged shared part.
    type Down = Shared;
    /// The trained shared part.
    type Up = Shared;

    fn new(name: &'static str, _: Checked<PartialAvgParams>, env: &Env) -> Result<Self, AlgoError> {
        let d = env.init.len();
        let (fed, eval_point) = match name {
            "lg-fedavg" => (
                Federation::new(Part::head(env.spec), d, "head", "base").kept_first(),
                EvalPoint::AfterTraining,
            ),
            "fedbn" => (
                Federation::new(Part::batch_norm(env.spec).complement(d), d, "rest", "bn")
                    .kept_first(),
                EvalPoint::AfterReceive,
            ),
            "fedper" => (
                Federation::new(Part::base(env.spec), d, "base", "head"),
                EvalPoint::AfterTraining,
            ),
            other => {
                return Err(AlgoError::Unsupported {
                    algorithm: other.to_string(),
                    message: "not a partial-averaging method".into(),
                });
            }
        };
        Ok(Self {
            name,
            fed,
            eval_point,
        })
    }

    fn name(&self) -> &'static str {
        self.name
    }

    fn init_client(&self, env: &Env, _: usize) -> Model {
        env.initial_model()
    }

    fn local_round(&self, env: &Env, cx: &mut ClientCx, model: &mut Model) -> Trained<Shared> {
        let train_loss = cx.train_plain(env, model, &[]);
        Trained {
            up: self.fed.send(cx, &model.params),
            train_loss,
        }
    }

    fn aggregate(
        &self,
        env: &Env,
        _: &mut (),
        _: usize,
        uploads: &[(usize, Shared)],
    ) -> RoundOutcome<Shared> {
        self.fed.average(env, uploads)
    }

    fn receive(&self, _: &Env, model: &mut Model, shared: Shared) {
        self.fed.receive(model, &shared);
    }

    fn eval_point(&self) -> EvalPoint {
        self.eval_point
    }

    fn check_upload(&self, _: &Env, up: &Shared) -> Result<(), String> {
        self.fed.check(up)
    }

    fn check_download(&self, _: &Env, down: &Shared) -> Result<(), String> {
        self.fed.check(down)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Message;
    use crate::testkit::{Tiny, changed};
    use fedweave_core::{Purpose, rng_stream};
    use fedweave_nn::{ModelKind, ModelSpec, TrainConfig};

    /// The whole model trains, the body alone is uploaded, and the start
    /// the `inv_grad` attack reflects about is cut to the body too.
    #[test]
    fn whole_model_trains_and_the_body_is_uploaded() {
        let t = Tiny::new();
        let env = t.env();
        let split = t.spec.split();
        let algo = PartialAvg::new(
            "fedper",
            PartialAvgParams {}.check(env.clients()).unwrap(),
            &env,
        )
        .unwrap();
        let mut model = env.initial_model();
        let mut cx = t.cx(1, 1);
        cx.origin = Some(None);
        let up = algo.local_round(&env, &mut cx, &mut model).up;
        assert!(changed(&t.init, &model.params, split.base.clone()) > 0);
        assert!(changed(&t.init, &model.params, split.head.clone()) > 0);
        assert_eq!(up.bytes(), 4 * split.base.len() as u64);
        assert_eq!(up.values, model.params[split.base.clone()]);
        assert_eq!(cx.origin, Some(Some(t.init[split.base.clone()].to_vec())));
        let mut short = up.clone();
        short.values.pop();
        assert!(algo.check_upload(&env, &short).is_err());
        assert_eq!(algo.check_upload(&env, &up), Ok(()));
    }

    /// FedPer on a `sequential` model (linear 16, ReLU, dropout, linear
    /// 16, ReLU, linear head): after a round every client holds the same
    /// body (the average) and a head of its own.
    #[test]
    fn fedper_on_a_sequential_model_shares_the_body_and_keeps_heads_local() {
        let t = Tiny::sequential();
        let env = t.env();
        let split = t.spec.split();
        assert_eq!(
            split.head,
            4 * 16 + 16 + 16 * 16 + 16..t.spec.layout().len()
        );
        assert_eq!(t.spec.feature_len(), 16);
        let algo = PartialAvg::new(
            "fedper",
            PartialAvgParams {}.check(env.clients()).unwrap(),
            &env,
        )
        .unwrap();
        let mut models: Vec<_> = (0..3).map(|_| env.initial_model()).collect();
        let uploads: Vec<_> = models
            .iter_mut()
            .enumerate()
            .map(|(i, m)| (i, algo.local_round(&env, &mut t.cx(i, 1), m).up))
            .collect();
        let out = algo.aggregate(&env, &mut (), 1, &uploads);
        for (i, down) in out.downloads {
            algo.receive(&env, &mut models[i], down);
        }
        let part = |m: &crate::Model, r: std::ops::Range<usize>| m.params[r].to_vec();
        for m in &models[1..] {
            assert_eq!(
                part(m, split.base.clone()),
                part(&models[0], split.base.clone())
            );
            assert_ne!(
                part(m, split.head.clone()),
                part(&models[0], split.head.clone())
            );
        }
        assert!(changed(&t.init, &models[0].params, split.base.clone()) > 0);
    }

    /// Only the head travels: the upload is the trained head (with the
    /// attack's start cut to the head), the average is the size-weighted
    /// mean of the heads, and receiving it leaves the body alone.
    #[test]
    fn the_head_is_shared_and_the_body_kept() {
        let t = Tiny::new();
        let env = t.env();
        let split = t.spec.split();
        let algo = PartialAvg::new(
            "lg-fedavg",
            PartialAvgParams {}.check(env.clients()).unwrap(),
            &env,
        )
        .unwrap();
        let mut models = [env.initial_model(), env.initial_model()];
        let mut uploads = Vec::new();
        for (i, model) in [0, 2].into_iter().zip(models.iter_mut()) {
            let mut cx = t.cx(i, 1);
            cx.origin = Some(None);
            let up = algo.local_round(&env, &mut cx, model).up;
            assert_eq!(up.bytes(), 4 * split.head.len() as u64);
            assert_eq!(up.values, model.params[split.head.clone()]);
            assert_eq!(cx.origin, Some(Some(t.init[split.head.clone()].to_vec())));
            uploads.push((i, up));
        }
        let out = algo.aggregate(&env, &mut (), 1, &uploads);
        assert_eq!(out.layers[0].0, "base");
        assert_eq!(out.layers[1].0, "head");
        assert_eq!(out.layers[0].1.row(0), &[1.0, 0.0, 0.0]);
        assert_eq!(out.layers[1].1.row(0), &[1.0 / 3.0, 0.0, 2.0 / 3.0]);
        let head = &out.downloads[0].1.values;
        for (k, e) in split.head.clone().enumerate() {
            let want = (models[0].params[e] + 2.0 * models[1].params[e]) / 3.0;
            assert!((head[k] - want).abs() < 1e-6);
        }
        let body = models[0].params[split.base.clone()].to_vec();
        assert!(changed(&t.init, &body, 0..body.len()) > 0);
        algo.receive(&env, &mut models[0], out.downloads[0].1.clone());
        assert_eq!(models[0].params[split.base.clone()], body[..]);
        assert_eq!(models[0].params[split.head.clone()], head[..]);
    }

    /// On `cnn-bn`: the uploads leave out exactly the BN layers; after
    /// aggregation and receipt every BN element is the client's own while
    /// every other element is the size-weighted mean.
    #[test]
    fn batch_norm_layers_are_untouched_by_aggregation() {
        let spec = ModelSpec::new(ModelKind::CNN_BN, &[1, 28, 28], 10).unwrap();
        let d = spec.layout().len();
        let init = spec.init(&mut rng_stream(1, 0, 0, Purpose::ModelInit));
        let train = TrainConfig {
            lr: 0.1,
            momentum: 0.0,
            weight_decay: 0.0,
            batch_size: 4,
            iterations: 1,
            epochs: 1,
        };
        let sizes = [10usize, 30];
        let env = Env {
            spec: &spec,
            train: &train,
            sizes: &sizes,
            init: &init,
            relation: None,
            label_counts: &[],
            kernels: fedweave_core::pairwise::Kernels::cpu(),
        };
        let algo = PartialAvg::new(
            "fedbn",
            PartialAvgParams {}.check(env.clients()).unwrap(),
            &env,
        )
        .unwrap();
        let bn = spec.split().batch_norm;
        assert_eq!(bn.iter().map(|r| r.len()).sum::<usize>(), 2 * (32 + 64));
        let in_bn = |e: usize| bn.iter().any(|r| r.contains(&e));
        // Client models: constants 1 and 5 everywhere (BN included).
        let models: Vec<Model> = [1.0f32, 5.0]
            .iter()
            .map(|&c| Model {
                params: vec![c; d],
                buffers: spec.init_buffers(),
            })
            .collect();
        let uploads: Vec<(usize, Shared)> = models
            .iter()
            .enumerate()
            .map(|(i, m)| (i, algo.fed.upload(&m.params)))
            .collect();
        assert_eq!(uploads[0].1.bytes(), 4 * (d - 192) as u64);
        let out = algo.aggregate(&env, &mut (), 1, &uploads);
        assert_eq!(out.layers[0].0, "bn");
        assert_eq!(out.layers[1].0, "rest");
        assert_eq!(out.layers[0].1.row(0), &[1.0, 0.0]);
        assert_eq!(out.layers[1].1.row(0), &[0.25, 0.75]);
        let mean = 0.25 * 1.0 + 0.75 * 5.0;
        for (i, down) in out.downloads {
            let mut m = models[i].clone();
            algo.receive(&env, &mut m, down);
            let own = models[i].params[0];
            for (e, x) in m.params.iter().enumerate() {
                let want = if in_bn(e) { own } else { mean };
                assert_eq!(*x, want, "client {i}, element {e}");
            }
            assert_eq!(m.buffers, models[i].buffers);
        }
    }

    /// Without BN every element is shared: the upload is the whole model,
    /// the graph FedAvg's, no per-group graphs.
    #[test]
    fn without_batch_norm_it_is_fedavg() {
        let t = crate::testkit::Tiny::new();
        let env = t.env();
        let algo = PartialAvg::new(
            "fedbn",
            PartialAvgParams {}.check(env.clients()).unwrap(),
            &env,
        )
        .unwrap();
        let up = algo.fed.upload(&t.init);
        assert_eq!(up.values, t.init);
        let out = algo.aggregate(&env, &mut (), 1, &[(0, up.clone()), (2, up)]);
        assert!(out.layers.is_empty());
        assert_eq!(out.graph.row(1), &[1.0 / 3.0, 0.0, 2.0 / 3.0]);
        assert_eq!(algo.eval_point(), EvalPoint::AfterReceive);
    }
}
