//! FedBABU (Oh, Kim, Yun, ICLR 2022): federate the body only, with the head
//! frozen at its random initialisation; personalise by fine-tuning the head.
//!
//! Local objective: cross-entropy with the head frozen (every client holds
//! the common initial head, which never changes during federated training).
//! Graph rule: the body ("base") is averaged with the data-size weights p
//! over the round's participants and sent to every client; the head graph
//! is the identity (it never travels). Both are logged per group
//! ([`crate::split`]); only the body travels, both ways.
//!
//! Personalisation: after its local training, each participant fine-tunes
//! a copy of its model's head for `ft_epochs` full passes over its training
//! data (the body frozen, a fresh optimiser with `[train]`'s settings) and
//! keeps that head and the copy's batch-norm statistics. The personalised
//! model it is scored on is its current body with that fine-tuned head:
//! right after training, exactly the fine-tuned copy; for a client absent
//! from a round, the newly received body under its last fine-tuned head. The
//! federated model itself (what trains and uploads) keeps the initial head.
//!
//! Deviations: the paper and PFLlib fine-tune once, after the last round
//! (PFLlib's `fine_tune` defaults to body and head); fedweave fine-tunes the
//! head every round on a copy so every round has a personalised score, as
//! the other methods do, and fine-tunes the head only (the paper's
//! personalisation of "the head fine-tuned during evaluation").
//! `ft_epochs` = 10 is PFLlib's `fine_tuning_epochs` default.

use crate::Checked;
use crate::contract::holds_model;
use crate::params::Validate;
use crate::params::params;
use crate::split::{Federation, Part, Shared};
use crate::{AlgoError, Algorithm, ClientCx, Env, Info, Model, ModelRef, RoundOutcome, Trained};
use fedweave_nn::TrainConfig;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;

params! {
    /// FedBABU's parameters.
    pub struct FedBabuParams {
        /// Full passes over the local training data fine-tuning the head before
        /// scoring (PFLlib's `fine_tuning_epochs` = 10; 0 scores the federated
        /// model with its initial head).
        pub ft_epochs: usize = 10,
    }
}

impl Validate for FedBabuParams {}

/// The personalisation of a client's last round.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Tuned {
    /// The fine-tuned head.
    #[serde(with = "fedweave_core::stash::vector")]
    pub head: Vec<f32>,
    /// The fine-tuned copy's batch-norm statistics.
    #[serde(with = "fedweave_core::stash::vector")]
    pub buffers: Vec<f32>,
}

/// What a FedBABU client keeps.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BabuClient {
    /// The federated model: the body and the initial head.
    pub model: Model,
    /// The head fine-tuned after the last local training (`None` before the
    /// client's first round).
    pub tuned: Option<Tuned>,
}

/// The FedBABU algorithm.
pub struct FedBabu {
    fed: Federation,
    ft_epochs: usize,
}

impl FedBabu {
    /// Fine-tunes the head of a copy of `model` (the body frozen) and
    /// returns it with the copy's batch-norm statistics.
    pub fn fine_tune(&self, env: &Env, cx: &mut ClientCx, model: &Model) -> Tuned {
        let mut copy = model.clone();
        if self.ft_epochs > 0 {
            let cfg = TrainConfig {
                iterations: 0,
                epochs: self.ft_epochs,
                ..env.train.clone()
            };
            cx.train(env, &mut copy, &cfg, &[], self.fed.shared().ranges(), None);
        }
        Tuned {
            head: self.fed.kept().gather(&copy.params),
            buffers: copy.buffers,
        }
    }
}

holds_model!(BabuClient: model);

impl Algorithm for FedBabu {
    const NAMES: &'static [Info] = &[Info {
        name: "fedbabu",
        summary: "body averaged with p and broadcast; head frozen at its random init while federating; scored after fine-tuning the head (ft_epochs = 10)",
        reference: "Oh, Kim, Yun, ICLR 2022",
    }];
    type Params = FedBabuParams;
    type Client = BabuClient;
    type Server = ();
    /// The averaged body.
    type Down = Shared;
    /// The trained body.
    type Up = Shared;

    fn new(_: &'static str, params: Checked<FedBabuParams>, env: &Env) -> Result<Self, AlgoError> {
        Ok(Self {
            fed: Federation::new(Part::base(env.spec), env.init.len(), "base", "head"),
            ft_epochs: params.ft_epochs,
        })
    }

    fn init_client(&self, env: &Env, _: usize) -> BabuClient {
        BabuClient {
            model: env.initial_model(),
            tuned: None,
        }
    }

    fn local_round(&self, env: &Env, cx: &mut ClientCx, state: &mut BabuClient) -> Trained<Shared> {
        let model = &mut state.model;
        let head = self.fed.kept().ranges();
        let train_loss = cx.train(env, model, env.train, &[], head, None).mean_loss;
        state.tuned = Some(self.fine_tune(env, cx, &state.model));
        Trained {
            up: self.fed.send(cx, &state.model.params),
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

    fn receive(&self, _: &Env, state: &mut BabuClient, body: Shared) {
        self.fed.receive(&mut state.model, &body);
    }

    fn personalized<'c>(&self, state: &'c BabuClient) -> ModelRef<'c> {
        match &state.tuned {
            None => state.model.view(),
            Some(tuned) => {
                let mut params = state.model.params.clone();
                self.fed.kept().scatter(&tuned.head, &mut params);
                ModelRef {
                    params: Cow::Owned(params),
                    buffers: &tuned.buffers,
                }
            }
        }
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

    fn fedbabu(t: &Tiny, ft_epochs: usize) -> FedBabu {
        FedBabu::new(
            "fedbabu",
            FedBabuParams { ft_epochs }
                .check(t.env().clients())
                .unwrap(),
            &t.env(),
        )
        .unwrap()
    }

    /// Over rounds of training, averaging and receiving, the federated
    /// model's head stays the initial head bit for bit while its body
    /// moves; only the scored copy's head is fine-tuned.
    #[test]
    fn head_stays_at_init_until_fine_tuning() {
        let t = Tiny::new();
        let env = t.env();
        let split = t.spec.split();
        let algo = fedbabu(&t, 2);
        let mut clients: Vec<BabuClient> = (0..3).map(|i| algo.init_client(&env, i)).collect();
        // Before any round the scored model is the initial model.
        assert_eq!(algo.personalized(&clients[0]).params[..], t.init[..]);
        for round in 1..=3 {
            let mut uploads = Vec::new();
            for (i, c) in clients.iter_mut().enumerate().filter(|(i, _)| *i != 1) {
                let up = algo.local_round(&env, &mut t.cx(i, round), c).up;
                assert_eq!(up.bytes(), 4 * split.base.len() as u64);
                assert_eq!(
                    c.model.params[split.head.clone()],
                    t.init[split.head.clone()]
                );
                assert!(changed(&t.init, &c.model.params, split.base.clone()) > 0);
                let scored = algo.personalized(c).params.into_owned();
                assert_eq!(
                    scored[split.base.clone()],
                    c.model.params[split.base.clone()]
                );
                assert!(changed(&t.init, &scored, split.head.clone()) > split.head.len() / 2);
                uploads.push((i, up));
            }
            let out = algo.aggregate(&env, &mut (), round, &uploads);
            for (i, down) in out.downloads {
                algo.receive(&env, &mut clients[i], down);
            }
            for c in &clients {
                assert_eq!(
                    c.model.params[split.head.clone()],
                    t.init[split.head.clone()]
                );
            }
            // Every body is the average; the absent client 1 has no
            // fine-tuned head yet and is scored on body + initial head.
            assert_eq!(clients[0].model.params, clients[1].model.params);
            assert_eq!(
                algo.personalized(&clients[1]).params[..],
                clients[1].model.params[..]
            );
        }
    }

    /// The fine-tuned copy: body untouched, head moved, the fit improves;
    /// with `ft_epochs` = 0 the copy is the model.
    #[test]
    fn fine_tuning_moves_the_head_only_and_lowers_the_loss() {
        let t = Tiny::new();
        let env = t.env();
        let split = t.spec.split();
        let model = env.initial_model();
        let data = t.cx(2, 1).data.train;
        let loss = |params: &[f32]| {
            fedweave_nn::evaluate(&t.spec, params, &model.buffers, &data).mean_loss()
        };
        let tuned = fedbabu(&t, 5).fine_tune(&env, &mut t.cx(2, 1), &model);
        let mut copy = model.params.clone();
        Part::head(&t.spec).scatter(&tuned.head, &mut copy);
        assert_eq!(copy[split.base.clone()], model.params[split.base.clone()]);
        assert!(
            loss(&copy) < loss(&model.params),
            "{} vs {}",
            loss(&copy),
            loss(&model.params)
        );
        let none = fedbabu(&t, 0).fine_tune(&env, &mut t.cx(2, 1), &model);
        assert_eq!(none.head, model.params[split.head.clone()]);
    }
}
