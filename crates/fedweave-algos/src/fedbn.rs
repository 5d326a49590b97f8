//! FedBN (Li et al., ICLR 2021): FedAvg of every parameter except the
//! batch-norm layers, which stay with their client.
//!
//! Graph rule: everything but the BN scales and shifts ("rest") is averaged
//! with the data-size weights p over the round's participants and sent to
//! every client; the BN layers ("bn") stay local (identity graph). Both are
//! logged per group ([`crate::split`]), "bn" first. Local objective:
//! cross-entropy on the whole model from the received model and the
//! client's own BN layers. Evaluation: the model after receiving (the
//! averaged parameters with the client's BN layers), as FedAvg evaluates
//! the global model and PFLlib evaluates FedBN.
//!
//! BN running statistics are never shared by any fedweave method (they are
//! client buffers, not parameters), so the only difference from FedAvg is
//! the BN scales and shifts. With a model without batch norm (`mlp`, `cnn`)
//! nothing is kept and FedBN *is* FedAvg, bit for bit: same uploads, same
//! graph, and no per-group graphs (one group, the whole model). Use it with
//! `cnn-bn` or `cnn-dwa`. FedBN has no parameters.

use crate::params::Validate;
use crate::split::{Federation, Part, Shared};
use crate::{
    AlgoError, Algorithm, ClientCx, Env, EvalPoint, Info, Model, ModelRef, RoundOutcome, Trained,
};
use serde::{Deserialize, Serialize};

/// FedBN has no parameters.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FedBnParams {}

impl Validate for FedBnParams {}

/// The FedBN algorithm.
pub struct FedBn {
    fed: Federation,
}

impl Algorithm for FedBn {
    const NAMES: &'static [Info] = &[Info {
        name: "fedbn",
        summary: "FedAvg of every parameter but the batch-norm layers, which stay local (= FedAvg without BN); evaluates the received model",
        reference: "Li et al., ICLR 2021",
    }];
    type Params = FedBnParams;
    type Client = Model;
    type Server = ();
    /// Everything but the BN layers, averaged.
    type Down = Shared;
    /// Everything but the BN layers, trained.
    type Up = Shared;

    fn new(_: &str, _: FedBnParams, env: &Env) -> Result<Self, AlgoError> {
        let d = env.init.len();
        let rest = Part::batch_norm(env.spec).complement(d);
        Ok(Self {
            fed: Federation::new(rest, d, "rest", "bn").kept_first(),
        })
    }

    fn name(&self) -> &'static str {
        "fedbn"
    }

    fn init_server(&self, _: &Env) {}

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

    fn receive(&self, _: &Env, model: &mut Model, rest: Shared) {
        self.fed.receive(model, &rest);
    }

    fn personalized<'c>(&self, model: &'c Model) -> ModelRef<'c> {
        model.view()
    }

    fn eval_point(&self) -> EvalPoint {
        EvalPoint::AfterReceive
    }

    fn check_upload(&self, _: &Env, up: &Shared) -> Result<(), String> {
        self.fed.check(up)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Message;
    use fedweave_core::{Purpose, rng_stream};
    use fedweave_nn::{ModelKind, ModelSpec, TrainConfig};

    /// On `cnn-bn`: the uploads leave out exactly the BN layers; after
    /// aggregation and receipt every BN element is the client's own while
    /// every other element is the size-weighted mean.
    #[test]
    fn batch_norm_layers_are_untouched_by_aggregation() {
        let spec = ModelSpec::new(ModelKind::CnnBn, &[1, 28, 28], 10).unwrap();
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
        };
        let algo = FedBn::new("fedbn", FedBnParams {}, &env).unwrap();
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
        let t = crate::split::tiny::Tiny::new();
        let env = t.env();
        let algo = FedBn::new("fedbn", FedBnParams {}, &env).unwrap();
        let up = algo.fed.upload(&t.init);
        assert_eq!(up.values, t.init);
        let out = algo.aggregate(&env, &mut (), 1, &[(0, up.clone()), (2, up)]);
        assert!(out.layers.is_empty());
        assert_eq!(out.graph.row(1), &[1.0 / 3.0, 0.0, 2.0 / 3.0]);
        assert_eq!(algo.eval_point(), EvalPoint::AfterReceive);
    }
}
