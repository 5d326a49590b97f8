//! LG-FedAvg (Liang et al., 2020), as PFLlib runs it: the opposite split of
//! FedPer, a shared head and a personal body.
//!
//! Graph rule: the head (the last linear layer) is averaged with the
//! data-size weights p over the round's participants and sent to every
//! client; the body ("base") stays with its client (identity graph). Both
//! graphs are logged per group ([`crate::split`]). Local objective:
//! cross-entropy on the whole model. Evaluation: the model after local
//! training.
//!
//! The paper's "local representations" are the lower layers kept personal
//! and the global part the top layers; PFLlib shares exactly the last
//! linear layer (`model.head`), as fedweave does. Only the head travels,
//! both ways. LG-FedAvg has no parameters.

use crate::params::Validate;
use crate::split::{Federation, Part, Shared};
use crate::{AlgoError, Algorithm, ClientCx, Env, Info, Model, ModelRef, RoundOutcome, Trained};
use serde::{Deserialize, Serialize};

/// LG-FedAvg has no parameters.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LgFedAvgParams {}

impl Validate for LgFedAvgParams {}

/// The LG-FedAvg algorithm.
pub struct LgFedAvg {
    fed: Federation,
}

impl Algorithm for LgFedAvg {
    const NAMES: &'static [Info] = &[Info {
        name: "lg-fedavg",
        summary: "head (last layer) averaged with p and broadcast, body personal; whole model trained",
        reference: "Liang et al., arXiv 2020 (PFLlib version)",
    }];
    type Params = LgFedAvgParams;
    type Client = Model;
    type Server = ();
    /// The averaged head.
    type Down = Shared;
    /// The trained head.
    type Up = Shared;

    fn new(_: &str, _: LgFedAvgParams, env: &Env) -> Result<Self, AlgoError> {
        Ok(Self {
            fed: Federation::new(Part::head(env.spec), env.init.len(), "head", "base").kept_first(),
        })
    }

    fn name(&self) -> &'static str {
        "lg-fedavg"
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

    fn receive(&self, _: &Env, model: &mut Model, head: Shared) {
        self.fed.receive(model, &head);
    }

    fn personalized<'c>(&self, model: &'c Model) -> ModelRef<'c> {
        model.view()
    }

    fn check_upload(&self, _: &Env, up: &Shared) -> Result<(), String> {
        self.fed.check(up)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Message;
    use crate::split::tiny::{Tiny, changed};

    /// Only the head travels: the upload is the trained head (with the
    /// attack's start cut to the head), the average is the size-weighted
    /// mean of the heads, and receiving it leaves the body alone.
    #[test]
    fn the_head_is_shared_and_the_body_kept() {
        let t = Tiny::new();
        let env = t.env();
        let split = t.spec.split();
        let algo = LgFedAvg::new("lg-fedavg", LgFedAvgParams {}, &env).unwrap();
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
}
