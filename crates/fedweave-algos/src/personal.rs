//! A personal part for any server-mixing method: `[algorithm] personal =
//! "head" | "body" | "batch_norm"` keeps that part of every client's model
//! out of the federation, while the method's own rule mixes the rest.
//!
//! SFL's Table 4 composes its graph aggregation with FedPer's split (the
//! head personal) and LG-FedAvg's (the body personal); the same
//! composition gives pFedGraph, FedDWA, FedAGHN, FedAMP, FedAvgM or FedAtt
//! a personal head, or FedBN's local batch-norm layers. `fedavg` with
//! `personal = "head"` trains, uploads and mixes exactly as `fedper` does
//! (`"body"`: as `lg-fedavg`; tested bit for bit), which is the check that
//! the composition is the split methods' rule and not a new one.
//!
//! The wrapper works on messages, not inside the method (Flower's way of
//! wrapping strategies):
//! - **up**: each model vector of the method's upload is cut to the shared
//!   part, so only the shared part travels and is counted;
//! - **server**: the cut uploads are completed with the initial model's
//!   kept part — the same values for every client, so they add nothing to
//!   the distances and similarities the method's graph is built from
//!   (pFedGraph's cos(θ − θ_init), FedDWA's and SFL*'s distances) — and the
//!   method aggregates as usual; its downloads are cut to the shared part;
//! - **down**: the client completes each received vector with its own kept
//!   part before the method applies it, so the kept part stays the
//!   client's own.
//!
//! What the method's local objective does with a received model reaches
//! the kept part as a pull toward the client's own values at the start of
//! the round (SFL's and FedAMP's proximal terms, pFedGraph's cosine): the
//! kept part is never pulled toward another client's. Methods qualify when
//! every vector they exchange is a model (or a model-shaped vector whose
//! kept part may be the client's own): they implement [`Splittable`].

use crate::contract::{HoldsModel, ModelRef, check_parts};
use crate::params::{Checked, ParamError, Validate};
use crate::split::Part;
use crate::{
    AlgoError, Algorithm, ClientCx, Env, EvalPoint, Info, Message, RoundOutcome, Topology, Trained,
};
use fedweave_nn::{EvalStats, LocalData};
use serde::de::{DeserializeOwned, Error as _};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The `[algorithm]` key that asks for a personal part.
pub const KEY: &str = "personal";

/// A message whose every vector is model-shaped, so each can be cut to a
/// part and completed again.
pub trait ModelMessage: Message {
    /// The message with each vector replaced by `f` of it.
    fn map_models(self, f: impl FnMut(Vec<f32>) -> Vec<f32>) -> Self;
}

impl ModelMessage for Vec<f32> {
    fn map_models(self, mut f: impl FnMut(Vec<f32>) -> Vec<f32>) -> Self {
        f(self)
    }
}

/// A server-mixing method that can take a personal part: its messages
/// carry models only. Opting in is this impl in the method's file plus
/// `[split]` after its registry line.
pub trait Splittable: Algorithm<Up: ModelMessage, Down: ModelMessage> {}

/// Which part of the model each client keeps to itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Keep {
    /// The last linear layer (FedPer's split).
    #[default]
    Head,
    /// Every layer before the head (LG-FedAvg's split).
    Body,
    /// The batch-norm scales and shifts (FedBN's split).
    BatchNorm,
}

impl Keep {
    /// The kept part of `env`'s model.
    fn part(self, env: &Env) -> Part {
        match self {
            Keep::Head => Part::head(env.spec),
            Keep::Body => Part::base(env.spec),
            Keep::BatchNorm => Part::batch_norm(env.spec),
        }
    }
}

/// A method's parameters plus `personal`: parsed from the same
/// `[algorithm]` table, `personal` taken out before the method's own
/// parameters are read (so they still reject unknown keys).
#[derive(Clone, Debug, Default)]
pub struct PersonalParams<P> {
    /// The method's own parameters.
    pub inner: P,
    /// The part each client keeps.
    pub keep: Keep,
}

impl<'de, P: DeserializeOwned> Deserialize<'de> for PersonalParams<P> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut table = toml::Table::deserialize(d)?;
        let keep = table
            .remove(KEY)
            .ok_or_else(|| D::Error::missing_field(KEY))?
            .try_into::<Keep>()
            .map_err(|_| {
                D::Error::custom(format!(
                    "algorithm.{KEY} must be \"head\", \"body\" or \"batch_norm\""
                ))
            })?;
        let inner = toml::Value::Table(table)
            .try_into::<P>()
            .map_err(|e| D::Error::custom(e.message()))?;
        Ok(Self { inner, keep })
    }
}

impl<P: Serialize> Serialize for PersonalParams<P> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::Error as _;
        let mut table = match toml::Value::try_from(&self.inner) {
            Ok(toml::Value::Table(t)) => t,
            Ok(_) => toml::Table::new(),
            Err(e) => return Err(S::Error::custom(e)),
        };
        let keep = toml::Value::try_from(self.keep).map_err(S::Error::custom)?;
        table.insert(KEY.to_string(), keep);
        table.serialize(s)
    }
}

impl<P: Validate> Validate for PersonalParams<P> {
    fn validate(&self) -> Result<(), ParamError> {
        self.inner.validate()
    }

    fn resolve(&mut self, clients: usize) {
        self.inner.resolve(clients);
    }

    fn applies(name: &str, key: &str) -> bool {
        key == KEY || P::applies(name, key)
    }
}

/// Method `A` with each client's `keep` part kept out of the federation.
pub struct Personal<A> {
    inner: A,
    /// The part that travels and is mixed (the complement of the kept one).
    shared: Part,
}

impl<A: Splittable> Personal<A> {
    /// `message` with each vector cut to the shared part.
    fn cut<M: ModelMessage>(&self, message: M) -> M {
        message.map_models(|v| self.shared.gather(&v))
    }

    /// `message` (cut) completed: each vector's kept part from `base`.
    fn complete<M: ModelMessage>(&self, message: M, base: &[f32]) -> M {
        message.map_models(|v| {
            let mut full = base.to_vec();
            self.shared.scatter(&v, &mut full);
            full
        })
    }

    /// Every vector of a cut message finite and of the shared part's length.
    fn check_cut(&self, vectors: Vec<&[f32]>) -> Result<(), String> {
        let parts: Vec<(&str, &[f32], usize)> = vectors
            .into_iter()
            .map(|v| ("a shared part", v, self.shared.len()))
            .collect();
        check_parts(&parts)
    }
}

impl<A: Splittable> Algorithm for Personal<A> {
    const NAMES: &'static [Info] = A::NAMES;
    type Params = PersonalParams<A::Params>;
    type Client = A::Client;
    type Server = A::Server;
    /// The method's download, each vector cut to the shared part.
    type Down = A::Down;
    /// The method's upload, each vector cut to the shared part.
    type Up = A::Up;

    fn new(
        name: &'static str,
        params: Checked<Self::Params>,
        env: &Env,
    ) -> Result<Self, AlgoError> {
        let keep = params.keep;
        let unsupported = |message: String| AlgoError::Unsupported {
            algorithm: name.to_string(),
            message,
        };
        let kept = keep.part(env);
        if kept.is_empty() {
            return Err(unsupported(format!(
                "algorithm.{KEY} = \"batch_norm\" keeps nothing: the model has no batch-norm \
                 layers (use cnn-bn, cnn-dwa or a ResNet)"
            )));
        }
        let inner = A::new(name, params.map(|p| p.inner), env)?;
        if inner.topology() != Topology::Server {
            return Err(unsupported(format!(
                "algorithm.{KEY} needs a server that mixes models"
            )));
        }
        Ok(Self {
            shared: kept.complement(env.init.len()),
            inner,
        })
    }

    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn init_server(&self, env: &Env) -> A::Server {
        self.inner.init_server(env)
    }

    fn init_client(&self, env: &Env, client: usize) -> A::Client {
        self.inner.init_client(env, client)
    }

    fn local_round(&self, env: &Env, cx: &mut ClientCx, state: &mut A::Client) -> Trained<A::Up> {
        let trained = self.inner.local_round(env, cx, state);
        // The `inv_grad` attack reflects each uploaded element about its own
        // start: cut the recorded start as the upload is cut.
        if let Some(Some(origin)) = &mut cx.origin {
            *origin = self.shared.gather(origin);
        }
        Trained {
            up: self.cut(trained.up),
            train_loss: trained.train_loss,
        }
    }

    fn aggregate(
        &self,
        env: &Env,
        server: &mut A::Server,
        round: usize,
        uploads: &[(usize, A::Up)],
    ) -> RoundOutcome<A::Down> {
        let completed: Vec<(usize, A::Up)> = uploads
            .iter()
            .map(|(i, up)| (*i, self.complete(up.clone(), env.init)))
            .collect();
        let outcome = self.inner.aggregate(env, server, round, &completed);
        RoundOutcome {
            graph: outcome.graph,
            layers: outcome.layers,
            downloads: outcome
                .downloads
                .into_iter()
                .map(|(i, down)| (i, self.cut(down)))
                .collect(),
        }
    }

    fn receive(&self, env: &Env, state: &mut A::Client, down: A::Down) {
        let down = self.complete(down, &state.held().params);
        self.inner.receive(env, state, down);
    }

    fn personalized<'c>(&self, state: &'c A::Client) -> ModelRef<'c> {
        self.inner.personalized(state)
    }

    fn evaluate(
        &self,
        env: &Env,
        state: &A::Client,
        train: &LocalData,
        sets: &[&LocalData],
    ) -> Vec<EvalStats> {
        self.inner.evaluate(env, state, train, sets)
    }

    fn scores_personalized(&self) -> bool {
        self.inner.scores_personalized()
    }

    fn eval_point(&self) -> EvalPoint {
        self.inner.eval_point()
    }

    fn check_upload(&self, _: &Env, up: &A::Up) -> Result<(), String> {
        self.check_cut(up.vectors())
    }

    fn check_download(&self, _: &Env, down: &A::Down) -> Result<(), String> {
        self.check_cut(down.vectors())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::{Visitor, check_params, dispatch};
    use crate::testkit::Tiny;

    /// What `rounds` rounds of every client participating leave behind:
    /// each client's held parameters after each round, and the bytes each
    /// round's uploads and downloads carried.
    struct Rounds<'a> {
        tiny: &'a Tiny,
        rounds: usize,
    }

    type History = (Vec<Vec<Vec<f32>>>, Vec<(u64, u64)>);

    impl Visitor for Rounds<'_> {
        type Output = History;

        fn visit<A: Algorithm>(self, algo: A, _: toml::Table) -> History {
            let env = self.tiny.env();
            let n = env.clients();
            let mut server = algo.init_server(&env);
            let mut clients: Vec<A::Client> = (0..n).map(|i| algo.init_client(&env, i)).collect();
            let (mut models, mut bytes) = (Vec::new(), Vec::new());
            for round in 1..=self.rounds {
                let uploads: Vec<(usize, A::Up)> = clients
                    .iter_mut()
                    .enumerate()
                    .map(|(i, c)| (i, algo.local_round(&env, &mut self.tiny.cx(i, round), c).up))
                    .collect();
                for (_, up) in &uploads {
                    assert_eq!(algo.check_upload(&env, up), Ok(()));
                }
                let outcome = algo.aggregate(&env, &mut server, round, &uploads);
                let up: u64 = uploads.iter().map(|(_, u)| u.bytes()).sum();
                let down: u64 = outcome.downloads.iter().map(|(_, d)| d.bytes()).sum();
                bytes.push((up, down));
                for (i, d) in outcome.downloads {
                    assert_eq!(algo.check_download(&env, &d), Ok(()));
                    algo.receive(&env, &mut clients[i], d);
                }
                models.push(clients.iter().map(|c| c.held().params.clone()).collect());
            }
            (models, bytes)
        }
    }

    fn run(tiny: &Tiny, name: &str, table: &str) -> History {
        let table: toml::Table = toml::from_str(table).unwrap();
        dispatch(name, &table, &tiny.env(), Rounds { tiny, rounds: 3 }).unwrap()
    }

    #[test]
    fn fedavg_with_a_personal_head_is_fedper_and_with_a_personal_body_lg_fedavg() {
        let tiny = Tiny::new();
        for (keep, split) in [("head", "fedper"), ("body", "lg-fedavg")] {
            let composed = run(&tiny, "fedavg", &format!("personal = \"{keep}\""));
            let reference = run(&tiny, split, "");
            assert!(
                composed == reference,
                "fedavg + personal = {keep} differs from {split}"
            );
            // Only the shared part travels: 3 clients, each way.
            let head = tiny.spec.split().head.len() as u64;
            let shared = if keep == "head" {
                tiny.init.len() as u64 - head
            } else {
                head
            };
            assert_eq!(composed.1[0], (3 * 4 * shared, 3 * 4 * shared), "{keep}");
        }
    }

    #[test]
    fn sfl_keeps_each_clients_head_and_mixes_the_bodies() {
        let tiny = Tiny::new();
        let (plain, _) = run(&tiny, "sfl", "graph = \"learned\"");
        let (composed, _) = run(&tiny, "sfl", "graph = \"learned\"\npersonal = \"head\"");
        let split = tiny.spec.split();
        let last = &composed[2];
        // Each client's head is its own: no two clients share one, and none
        // equals what plain SFL (heads mixed) gives it.
        for i in 0..3 {
            for j in 0..i {
                assert!(last[i][split.head.clone()] != last[j][split.head.clone()]);
            }
            assert!(last[i][split.head.clone()] != plain[2][i][split.head.clone()]);
        }
        // The bodies are SFL's mixtures: the learned graph links every
        // client, so after receiving, each body is a blend that differs from
        // the plain run's (heads trained differently) but stays finite.
        assert!(last.iter().flatten().all(|v| v.is_finite()));
        assert!(last[0][split.base.clone()] != plain[2][0][split.base.clone()]);
    }

    #[test]
    fn a_personal_head_never_moves_at_receive() {
        // Receiving replaces the model by u_i with the client's own kept
        // part: right after round 1's receive, each head equals the head the
        // client trained and uploaded nothing of.
        let tiny = Tiny::new();
        let table: toml::Table = toml::from_str("personal = \"head\"").unwrap();
        struct OneRound<'a>(&'a Tiny);
        impl Visitor for OneRound<'_> {
            type Output = ();
            fn visit<A: Algorithm>(self, algo: A, _: toml::Table) {
                let env = self.0.env();
                let head = env.spec.split().head;
                let mut server = algo.init_server(&env);
                let mut clients: Vec<A::Client> =
                    (0..3).map(|i| algo.init_client(&env, i)).collect();
                let uploads: Vec<(usize, A::Up)> = clients
                    .iter_mut()
                    .enumerate()
                    .map(|(i, c)| (i, algo.local_round(&env, &mut self.0.cx(i, 1), c).up))
                    .collect();
                let trained: Vec<Vec<f32>> =
                    clients.iter().map(|c| c.held().params.clone()).collect();
                let outcome = algo.aggregate(&env, &mut server, 1, &uploads);
                for (i, d) in outcome.downloads {
                    algo.receive(&env, &mut clients[i], d);
                    let held = &clients[i].held().params;
                    let name = algo.name();
                    assert!(
                        held[head.clone()] == trained[i][head.clone()],
                        "{name}: head"
                    );
                    // Methods that adopt the received model take the mixed body.
                    if name != "fedamp" {
                        assert!(held[..head.start] != trained[i][..head.start], "{name}");
                    }
                }
            }
        }
        for name in ["sfl", "pfedgraph", "feddwa", "fedaghn", "fedamp", "fedatt"] {
            dispatch(name, &table, &tiny.env(), OneRound(&tiny)).unwrap();
        }
    }

    #[test]
    fn uploads_of_the_wrong_length_or_not_finite_are_refused() {
        let tiny = Tiny::new();
        let table: toml::Table = toml::from_str("personal = \"head\"").unwrap();
        struct Checks<'a>(&'a Tiny);
        impl Visitor for Checks<'_> {
            type Output = ();
            fn visit<A: Algorithm>(self, algo: A, _: toml::Table) {
                let env = self.0.env();
                let mut client = algo.init_client(&env, 0);
                let up = algo.local_round(&env, &mut self.0.cx(0, 1), &mut client).up;
                assert_eq!(algo.check_upload(&env, &up), Ok(()));
                let mut nan = up.clone();
                nan.vectors_mut()[0][0] = f32::NAN;
                assert!(algo.check_upload(&env, &nan).is_err());
                // A whole model where only the shared part belongs.
                let whole = toml::Value::try_from(env.init.to_vec()).unwrap();
                let whole: A::Up = whole.try_into().unwrap();
                let err = algo.check_upload(&env, &whole).unwrap_err();
                assert!(err.contains("values where"), "{err}");
            }
        }
        dispatch("pfedgraph", &table, &tiny.env(), Checks(&tiny)).unwrap();
    }

    #[test]
    fn personal_is_refused_where_it_does_not_apply() {
        let tiny = Tiny::new();
        let head: toml::Table = toml::from_str("personal = \"head\"").unwrap();
        let err = check_params("ditto", &head, 3).unwrap_err().to_string();
        assert!(
            err.contains("algorithm.personal does not apply to `ditto`") && err.contains("sfl"),
            "{err}"
        );
        let bad: toml::Table = toml::from_str("personal = \"tail\"").unwrap();
        let err = check_params("sfl", &bad, 3).unwrap_err().to_string();
        assert!(
            err.contains("\"head\", \"body\" or \"batch_norm\""),
            "{err}"
        );
        // The method's own keys are still checked, and resolved with it.
        let typo: toml::Table = toml::from_str("personal = \"head\"\nhopz = 2").unwrap();
        let err = check_params("sfl", &typo, 3).unwrap_err().to_string();
        assert!(err.contains("hopz"), "{err}");
        let resolved = check_params("sfl", &head, 3).unwrap();
        assert_eq!(resolved["personal"].as_str(), Some("head"));
        assert!(resolved.contains_key("hops"), "{resolved:?}");
        // The tiny MLP has no batch norm: keeping it would keep nothing.
        let bn: toml::Table = toml::from_str("personal = \"batch_norm\"").unwrap();
        struct Never;
        impl Visitor for Never {
            type Output = ();
            fn visit<A: Algorithm>(self, _: A, _: toml::Table) {
                panic!("built");
            }
        }
        let Err(err) = dispatch("fedavg", &bn, &tiny.env(), Never) else {
            panic!("built")
        };
        assert!(err.to_string().contains("no batch-norm"), "{err}");
    }
}
