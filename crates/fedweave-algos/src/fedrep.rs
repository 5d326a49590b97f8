//! FedRep (Collins et al., ICML 2021): a shared representation, a personal
//! head, trained in two phases.
//!
//! Local objective: cross-entropy, in two phases per round (PFLlib's
//! `clientrep.py` order): first the head alone for `head_epochs` full
//! passes over the local data (the body frozen), then the body alone with
//! the usual local training (`[train]`, the head frozen). Each phase builds
//! a fresh optimiser, as PFLlib's two optimisers start each round from
//! their own (momentum-free) state; a frozen element keeps its value and its
//! momentum, weight decay included. The reported training loss is the mean
//! over both phases' steps.
//!
//! Graph rule: the body ("base") is averaged with the data-size weights p
//! over the round's participants and sent to every client; the head stays
//! with its client (identity graph). Both graphs are logged per group
//! ([`crate::split`]); only the body travels, both ways, so the upload is
//! exactly the body's bytes.
//!
//! Defaults: `head_epochs` = 5, the τ FedAGHN ran FedRep with (PFLlib's
//! `plocal_epochs` defaults to 1; the FedRep paper uses more head epochs
//! than body epochs too). Evaluation: the model after local training.

use crate::Checked;
use crate::params::Validate;
use crate::params::params;
use crate::split::{Federation, Part, Shared};
use crate::{AlgoError, Algorithm, ClientCx, Env, Info, Model, RoundOutcome, Trained};
use fedweave_nn::{TrainConfig, TrainStats};

params! {
    /// FedRep's parameters.
    pub struct FedRepParams {
        /// Full passes over the local data training the head alone before the
        /// body trains (FedAGHN's τ = 5; 0 skips the head phase).
        pub head_epochs: usize = 5,
    }
}

impl Validate for FedRepParams {}

/// The FedRep algorithm.
pub struct FedRep {
    fed: Federation,
    head_epochs: usize,
}

impl FedRep {
    /// Phase 1: the head trains for `head_epochs` passes, the body frozen.
    pub fn train_head(&self, env: &Env, cx: &mut ClientCx, model: &mut Model) -> TrainStats {
        if self.head_epochs == 0 {
            return TrainStats::default();
        }
        let cfg = TrainConfig {
            iterations: 0,
            epochs: self.head_epochs,
            ..env.train.clone()
        };
        cx.train(env, model, &cfg, &[], self.fed.shared().ranges(), None)
    }

    /// Phase 2: the body trains as usual (`env.train`), the head frozen.
    pub fn train_base(&self, env: &Env, cx: &mut ClientCx, model: &mut Model) -> TrainStats {
        cx.train(env, model, env.train, &[], self.fed.kept().ranges(), None)
    }
}

impl Algorithm for FedRep {
    const NAMES: &'static [Info] = &[Info {
        name: "fedrep",
        summary: "body averaged with p and broadcast, head personal; head trained first (body frozen, head_epochs = 5), then the body (head frozen)",
        reference: "Collins et al., ICML 2021",
    }];
    type Params = FedRepParams;
    type Client = Model;
    type Server = ();
    /// The averaged body.
    type Down = Shared;
    /// The trained body.
    type Up = Shared;

    fn new(_: &'static str, params: Checked<FedRepParams>, env: &Env) -> Result<Self, AlgoError> {
        Ok(Self {
            fed: Federation::new(Part::base(env.spec), env.init.len(), "base", "head"),
            head_epochs: params.head_epochs,
        })
    }

    fn init_client(&self, env: &Env, _: usize) -> Model {
        env.initial_model()
    }

    fn local_round(&self, env: &Env, cx: &mut ClientCx, model: &mut Model) -> Trained<Shared> {
        let head = self.train_head(env, cx, model);
        let base = self.train_base(env, cx, model);
        let steps = (head.steps + base.steps).max(1) as f64;
        let train_loss =
            (head.mean_loss * head.steps as f64 + base.mean_loss * base.steps as f64) / steps;
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

    fn fedrep(t: &Tiny, head_epochs: usize) -> FedRep {
        FedRep::new(
            "fedrep",
            FedRepParams { head_epochs }
                .check(t.env().clients())
                .unwrap(),
            &t.env(),
        )
        .unwrap()
    }

    /// Each phase moves its own group and leaves the other bit for bit,
    /// momentum and weight decay notwithstanding.
    #[test]
    fn each_phase_trains_its_group_and_freezes_the_other() {
        let t = Tiny::new();
        let env = t.env();
        let split = t.spec.split();
        let algo = fedrep(&t, 2);
        let mut cx = t.cx(2, 1);
        let mut model = env.initial_model();

        let before = model.params.clone();
        let stats = algo.train_head(&env, &mut cx, &mut model);
        // 2 epochs × ⌈24 / 4⌉ batches.
        assert_eq!(stats.steps, 12);
        assert_eq!(changed(&before, &model.params, split.base.clone()), 0);
        assert!(changed(&before, &model.params, split.head.clone()) > split.head.len() / 2);

        let before = model.params.clone();
        let stats = algo.train_base(&env, &mut cx, &mut model);
        assert_eq!(stats.steps, 3, "the usual local training");
        assert_eq!(changed(&before, &model.params, split.head.clone()), 0);
        assert!(changed(&before, &model.params, split.base.clone()) > 0);

        let none = fedrep(&t, 0);
        let before = model.params.clone();
        assert_eq!(none.train_head(&env, &mut cx, &mut model).steps, 0);
        assert_eq!(before, model.params);
    }

    /// The upload is exactly the body (its bytes are the body's), the round
    /// runs both phases, and receiving replaces the body only.
    #[test]
    fn upload_is_the_body_and_receive_keeps_the_head() {
        let t = Tiny::new();
        let env = t.env();
        let split = t.spec.split();
        let algo = fedrep(&t, 1);
        let mut model = env.initial_model();
        let trained = algo.local_round(&env, &mut t.cx(0, 1), &mut model);
        assert_eq!(trained.up.bytes(), 4 * split.base.len() as u64);
        assert_eq!(trained.up.values, model.params[split.base.clone()].to_vec());
        assert!(changed(&t.init, &model.params, split.head.clone()) > 0);
        assert!(trained.train_loss.is_finite() && trained.train_loss > 0.0);
        assert_eq!(algo.check_upload(&env, &trained.up), Ok(()));
        let whole = Shared {
            values: model.params.clone(),
        };
        assert!(algo.check_upload(&env, &whole).is_err());

        let mut other = env.initial_model();
        let out = algo.aggregate(&env, &mut (), 1, &[(0, trained.up)]);
        assert_eq!(out.downloads.len(), 3);
        assert_eq!(out.layers[0].0, "base");
        assert_eq!(out.layers[1].0, "head");
        assert_eq!(out.layers[0].1.row(1), &[1.0, 0.0, 0.0]);
        assert_eq!(out.layers[1].1.row(1), &[0.0, 1.0, 0.0]);
        assert_eq!(out.graph.row(1), &[0.5, 0.5, 0.0]);
        let personal_head = vec![0.25f32; split.head.len()];
        other.params[split.head.clone()].copy_from_slice(&personal_head);
        algo.receive(&env, &mut other, out.downloads[1].1.clone());
        assert_eq!(
            other.params[split.base.clone()],
            model.params[split.base.clone()]
        );
        assert_eq!(other.params[split.head.clone()], personal_head[..]);
    }
}
