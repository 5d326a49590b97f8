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
            up: self.fed.upload(&model.params),
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
