//! FedPer (Arivazhagan et al., 2019): a shared body, a personal head.
//!
//! Graph rule: the body ("base") is averaged with the data-size weights p
//! over the round's participants and sent to every client; the head stays
//! with its client (identity graph). Both graphs are logged per group
//! ([`crate::split`]). Local objective: cross-entropy on the whole model
//! (body and head train together, the usual local training). Evaluation:
//! the model after local training (the global body fine-tuned with the
//! personal head), as for the other personalised methods.
//!
//! The body is every layer before the last linear layer
//! ([`fedweave_nn::ModelSpec::split`]); PFLlib splits at the same place
//! (`model.fc` becomes the head). Only the body travels, both ways.
//! FedPer has no parameters.

use crate::params::Validate;
use crate::split::{Federation, Part, Shared};
use crate::{AlgoError, Algorithm, ClientCx, Env, Info, Model, ModelRef, RoundOutcome, Trained};
use serde::{Deserialize, Serialize};

/// FedPer has no parameters.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FedPerParams {}

impl Validate for FedPerParams {}

/// The FedPer algorithm.
pub struct FedPer {
    fed: Federation,
}

impl Algorithm for FedPer {
    const NAMES: &'static [Info] = &[Info {
        name: "fedper",
        summary: "body (all but the last layer) averaged with p and broadcast, head personal; whole model trained",
        reference: "Arivazhagan et al., arXiv 2019",
    }];
    type Params = FedPerParams;
    type Client = Model;
    type Server = ();
    /// The averaged body.
    type Down = Shared;
    /// The trained body.
    type Up = Shared;

    fn new(_: &str, _: FedPerParams, env: &Env) -> Result<Self, AlgoError> {
        Ok(Self {
            fed: Federation::new(Part::base(env.spec), env.init.len(), "base", "head"),
        })
    }

    fn name(&self) -> &'static str {
        "fedper"
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

    fn receive(&self, _: &Env, model: &mut Model, body: Shared) {
        self.fed.receive(model, &body);
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

    /// The whole model trains, the body alone is uploaded, and the start
    /// the `inv_grad` attack reflects about is cut to the body too.
    #[test]
    fn whole_model_trains_and_the_body_is_uploaded() {
        let t = Tiny::new();
        let env = t.env();
        let split = t.spec.split();
        let algo = FedPer::new("fedper", FedPerParams {}, &env).unwrap();
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
}
