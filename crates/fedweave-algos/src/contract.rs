//! The algorithm contract: what an algorithm declares and what a runtime
//! (the simulator, the client/server deployment and the peer-to-peer
//! deployment of `fedweave-net`) does with it.
//!
//! Writing a method is one file and one line in the registry: the trait's
//! provided methods cover the common cases (the name is the first of
//! [`Algorithm::NAMES`], the server starts from `Server::default()`, a
//! whole-model upload and download are checked as models, the engine scores
//! after training), and the parameters arrive checked.
//!
//! An algorithm owns its state types: `Client` (what one client keeps
//! between rounds) and `Server` (what the server keeps). The runtime stores
//! them, moves them and checkpoints them, but never looks inside. Messages
//! are the algorithm's own types too (`Up`: what a client uploads, `Down`:
//! what the server sends one client); each says how many bytes it is on the
//! wire and which model-sized vectors it carries (attacks wrap those, the
//! server checks them), so every method's byte accounting is exact.
//!
//! One round, as every runtime runs it:
//! 1. each participant trains: [`Algorithm::local_round`] → `Up`;
//! 2. the server infers the graph and answers: [`Algorithm::aggregate`] →
//!    [`RoundOutcome`] (or, for peer-to-peer methods, each client decides its
//!    own row in [`Algorithm::peer_step`]);
//! 3. each addressed client applies its `Down`: [`Algorithm::receive`];
//! 4. the protocol scores [`Algorithm::personalized`] at the algorithm's
//!    [`EvalPoint`].

use crate::AlgoError;
use crate::batching::TrainBatch;
use crate::params::{Checked, Validate};
use fedweave_core::pairwise::Kernels;
use fedweave_core::{CollaborationGraph, RelationGraph, RngStream};
use fedweave_nn::{
    BatchSampler, EvalStats, ExtraLoss, LocalData, LocalTrainer, ModelSpec, Objective, SgdConfig,
    SgdState, TrainConfig, TrainStats,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::ops::Range;

/// What every algorithm may read about the federation.
pub struct Env<'a> {
    /// The model architecture.
    pub spec: &'a ModelSpec,
    /// Local training settings. In [`Algorithm::local_round`] and
    /// [`Algorithm::peer_step`] they are the training client's own: they
    /// differ between clients in the step count when `train.local_iterations`
    /// is a range (unequal local work, FedNova's setting).
    pub train: &'a TrainConfig,
    /// n_i: each client's share of training data (train + validation), as
    /// the reference codes weight clients by it.
    pub sizes: &'a [usize],
    /// The common round-0 model every client starts from.
    pub init: &'a [f32],
    /// The dataset's own relation graph between clients, if it has one
    /// (the weather-station graph); SFL propagates along it.
    pub relation: Option<&'a RelationGraph>,
    /// Each client's training label counts (empty for forecasting). Only
    /// oracle graphs read it (SFL's `label_overlap`), and say so.
    pub label_counts: &'a [Vec<usize>],
    /// Where the server's pairwise products run (the host unless a device
    /// is configured): every similarity, distance and mixing goes through it.
    pub kernels: &'a Kernels,
}

/// Data-size weights p_i = n_i / Σ_j n_j (in the order of `sizes`; all 0
/// when every size is 0): FedAvg's weights, and the prior of pFedGraph's W.
pub fn size_weights(sizes: &[usize]) -> Vec<f64> {
    let total: f64 = sizes.iter().map(|&n| n as f64).sum();
    sizes.iter().map(|&n| n as f64 / total.max(1.0)).collect()
}

impl Env<'_> {
    /// Number of clients.
    pub fn clients(&self) -> usize {
        self.sizes.len()
    }

    /// Data-size weights p over `who` (sums to 1), in the order of `who`.
    pub fn size_weights(&self, who: &[usize]) -> Vec<f64> {
        size_weights(&who.iter().map(|&i| self.sizes[i]).collect::<Vec<_>>())
    }

    /// A client's starting model: the common init and fresh batch-norm
    /// statistics.
    pub fn initial_model(&self) -> Model {
        Model {
            params: self.init.to_vec(),
            buffers: self.spec.init_buffers(),
        }
    }
}

/// A client's own data.
#[derive(Clone, Copy)]
pub struct ClientData<'a> {
    /// Training samples.
    pub train: LocalData<'a>,
    /// Validation samples.
    pub val: LocalData<'a>,
}

/// One model as a client holds it: the trainable parameters (what may be
/// shared) and the batch-norm running statistics (always the client's own).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Model {
    /// Trainable parameters, laid out by the model's `ParamLayout`.
    #[serde(with = "fedweave_core::stash::vector")]
    pub params: Vec<f32>,
    /// Batch-norm running statistics (empty for models without BN).
    #[serde(with = "fedweave_core::stash::vector")]
    pub buffers: Vec<f32>,
}

impl Model {
    /// A read-only view for evaluation.
    pub fn view(&self) -> ModelRef<'_> {
        ModelRef {
            params: Cow::Borrowed(&self.params),
            buffers: &self.buffers,
        }
    }
}

/// The model the protocol scores for a client: borrowed from its state, or
/// computed (APFL's mixture).
pub struct ModelRef<'a> {
    /// Parameters.
    pub params: Cow<'a, [f32]>,
    /// Batch-norm running statistics.
    pub buffers: &'a [f32],
}

/// The per-round context of one client: who it is, its data, and its random
/// stream for mini-batches. Local training goes through [`ClientCx::train`]
/// so a runtime can observe it (the `inv_grad` attack needs the model the
/// round's training started from).
pub struct ClientCx<'a> {
    /// The client's index.
    pub client: usize,
    /// The round, from 1.
    pub round: usize,
    /// Its training and validation data.
    pub data: ClientData<'a>,
    /// Mini-batch order (keyed by seed, round, client: thread-independent).
    pub rng: RngStream,
    /// When `Some`, filled with the parameters the first training call of
    /// the round started from.
    pub origin: Option<Option<Vec<f32>>>,
    /// The group whose plain training calls run batched with this one's
    /// (`[device] batch_clients`), if any.
    pub batch: Option<&'a TrainBatch<'a>>,
}

impl ClientCx<'_> {
    /// Trains `model` on the client's training data with `cfg` (usually
    /// `env.train`), the algorithm's extra loss terms, frozen parameter
    /// ranges and, for methods whose optimiser persists across rounds, its
    /// SGD state.
    pub fn train(
        &mut self,
        env: &Env,
        model: &mut Model,
        cfg: &TrainConfig,
        extras: &[&dyn ExtraLoss],
        frozen: &[Range<usize>],
        sgd: Option<&mut SgdState>,
    ) -> TrainStats {
        self.train_with(env, model, cfg, extras, frozen, sgd, None)
    }

    /// [`ClientCx::train`] with `objective` in place of the task loss when
    /// given (feature-level methods: FedProto, FedRoD, FedPAC).
    #[allow(clippy::too_many_arguments)]
    pub fn train_with(
        &mut self,
        env: &Env,
        model: &mut Model,
        cfg: &TrainConfig,
        extras: &[&dyn ExtraLoss],
        frozen: &[Range<usize>],
        sgd: Option<&mut SgdState>,
        objective: Option<&dyn Objective>,
    ) -> TrainStats {
        self.mark_origin(&model.params);
        if let Some(batch) = self.batch
            && extras.is_empty()
            && frozen.is_empty()
            && sgd.is_none()
            && objective.is_none()
            && batch.takes(self.client)
        {
            return batch.train(self.client, model, cfg, &mut self.rng);
        }
        fedweave_nn::train_local_with(
            env.spec,
            &mut model.params,
            &mut model.buffers,
            &self.data.train,
            cfg,
            extras,
            frozen,
            sgd,
            &mut self.rng,
            objective,
        )
    }

    /// A step-level training session on `model` (Ditto, APFL, FedALA:
    /// methods that need control inside the round), with a mini-batch
    /// sampler over the client's training data drawn from its stream.
    pub fn session<'s>(
        &mut self,
        env: &Env<'s>,
        model: &Model,
    ) -> (LocalTrainer<'s>, BatchSampler) {
        self.session_with(env, model, env.train.sgd())
    }

    /// [`ClientCx::session`] with optimiser settings `sgd` in place of the
    /// `[train]` ones: for methods whose paper's update is plain gradient
    /// descent (Per-FedAvg's two steps, pFedMe's inner solver).
    pub fn session_with<'s>(
        &mut self,
        env: &Env<'s>,
        model: &Model,
        sgd: SgdConfig,
    ) -> (LocalTrainer<'s>, BatchSampler) {
        self.mark_origin(&model.params);
        let mut trainer = LocalTrainer::new(
            env.spec,
            env.spec.device(),
            &model.params,
            &model.buffers,
            sgd,
            None,
        );
        let sampler = BatchSampler::new(self.data.train.len(), env.train.batch_size, &mut self.rng);
        if self.data.train.augment != fedweave_nn::Augment::None || env.spec.draws_in_training() {
            trainer.seed_augmentation(&mut self.rng);
        }
        (trainer, sampler)
    }

    /// Records the parameters the round's first training started from (the
    /// `inv_grad` attack needs them).
    fn mark_origin(&mut self, params: &[f32]) {
        if let Some(origin @ None) = &mut self.origin {
            *origin = Some(params.to_vec());
        }
    }

    /// Plain local training with `env.train` and optional extra terms;
    /// returns the mean training loss.
    pub fn train_plain(&mut self, env: &Env, model: &mut Model, extras: &[&dyn ExtraLoss]) -> f64 {
        self.train(env, model, env.train, extras, &[], None)
            .mean_loss
    }

    /// The round of a method that trains the whole model plainly and
    /// uploads it: [`Self::train_plain`] with no extra terms, the trained
    /// parameters as the upload.
    pub fn train_whole(&mut self, env: &Env, model: &mut Model) -> Trained<Vec<f32>> {
        let train_loss = self.train_plain(env, model, &[]);
        Trained {
            up: model.params.clone(),
            train_loss,
        }
    }
}

/// A message between a client and the server (or between peers).
///
/// Its model-sized vectors are listed by [`Message::vectors`]: the first is
/// the model itself (what model-poisoning attacks overwrite); all of them
/// are checked on arrival (finite, right length).
pub trait Message: Serialize + DeserializeOwned + Clone + Send + Sync + 'static {
    /// The vectors carried, model first.
    fn vectors(&self) -> Vec<&[f32]>;
    /// The same vectors, mutable (for attacks).
    fn vectors_mut(&mut self) -> Vec<&mut [f32]>;
    /// Size on the wire: 4 bytes per `f32` element (scalars and ids are
    /// negligible next to models and not counted).
    fn bytes(&self) -> u64 {
        self.vectors().iter().map(|v| 4 * v.len() as u64).sum()
    }
}

/// Nothing: Local uploads nothing.
impl Message for () {
    fn vectors(&self) -> Vec<&[f32]> {
        Vec::new()
    }
    fn vectors_mut(&mut self) -> Vec<&mut [f32]> {
        Vec::new()
    }
}

/// One whole model's parameters.
impl Message for Vec<f32> {
    fn vectors(&self) -> Vec<&[f32]> {
        vec![self]
    }
    fn vectors_mut(&mut self) -> Vec<&mut [f32]> {
        vec![self]
    }
}

/// A client's upload with what the logs need besides the message.
pub struct Trained<U> {
    /// The message to the server (or, peer-to-peer, published to peers).
    pub up: U,
    /// Mean local training loss of the round.
    pub train_loss: f64,
}

/// What the server decided in one round.
pub struct RoundOutcome<D> {
    /// The round's graph over all clients (identity rows for absent ones;
    /// the mean over layers for per-layer methods).
    pub graph: CollaborationGraph,
    /// Per-layer graphs, for methods that mix layer by layer.
    pub layers: Vec<(String, CollaborationGraph)>,
    /// What each addressed client receives (client index, message).
    pub downloads: Vec<(usize, D)>,
}

impl<D> RoundOutcome<D> {
    /// One graph for the whole model and what each client receives.
    pub fn new(graph: CollaborationGraph, downloads: Vec<(usize, D)>) -> Self {
        Self {
            graph,
            layers: Vec::new(),
            downloads,
        }
    }

    /// Every one of `n` clients keeps its model: W = I, nothing is sent.
    pub fn keep_all(n: usize) -> Self {
        Self::new(CollaborationGraph::identity(n), Vec::new())
    }
}

/// When in the round the protocol scores [`Algorithm::personalized`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EvalPoint {
    /// After local training (personalised methods; FedAvg-FT: the global
    /// model fine-tuned by a round of local training).
    AfterTraining,
    /// After the round's downloads are applied (FedAvg: the global model;
    /// FedDWA: the mixed model before it trains again).
    AfterReceive,
}

/// How a round's models meet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Topology {
    /// Clients upload, a server aggregates and sends messages back.
    Server,
    /// No server: every client fetches peer messages and combines them.
    PeerToPeer,
}

/// The message layer between peers: what a client can ask of the others.
/// The simulator serves published messages from memory and counts every
/// transfer; a deployment serves them over the network.
pub trait PeerNet<M>: Sync {
    /// The message `peer` published this round, delivered to `to` (one
    /// transfer), or `None` when `peer` published nothing (absent, rejected).
    fn fetch(&self, to: usize, peer: usize) -> Option<&M>;
    /// The peers that published this round (ascending).
    fn published(&self) -> &[usize];
}

/// What one client decided in a peer-to-peer round.
#[derive(Clone, Debug, PartialEq)]
pub struct PeerStep {
    /// The client's graph row: (peer, weight) pairs, itself included,
    /// weights summing to 1.
    pub row: Vec<(usize, f64)>,
    /// Reward evaluations the client spent choosing (DPFL: validation
    /// passes over averaged models).
    pub evaluations: usize,
    /// Reward of the client alone and of the set it chose, when it ran a
    /// selection (to check that choosing never made things worse).
    pub rewards: Option<(f64, f64)>,
}

impl PeerStep {
    /// The client keeps its own model.
    pub fn keep(client: usize) -> Self {
        Self {
            row: vec![(client, 1.0)],
            evaluations: 0,
            rewards: None,
        }
    }
}

/// The model a client's state holds and trains: what the protocol scores
/// unless the algorithm overrides [`Algorithm::personalized`].
pub trait HoldsModel {
    /// The model.
    fn held(&self) -> &Model;
}

impl HoldsModel for Model {
    fn held(&self) -> &Model {
        self
    }
}

/// [`HoldsModel`] for client states that keep the model in a field:
/// `holds_model!(DittoClient: personal)`.
macro_rules! holds_model {
    ($($ty:ty: $field:ident),* $(,)?) => {
        $(impl $crate::contract::HoldsModel for $ty {
            fn held(&self) -> &$crate::Model {
                &self.$field
            }
        })*
    };
}
pub(crate) use holds_model;

/// Bounds every piece of algorithm state satisfies: checkpointable and
/// movable between threads.
pub trait State: Serialize + DeserializeOwned + Send + Sync + 'static {}
impl<T: Serialize + DeserializeOwned + Send + Sync + 'static> State for T {}

/// Parameters: parsed from `[algorithm]` (unknown keys rejected), checked
/// once by [`Validate`], resolved defaults written back to the config.
pub trait Params: Serialize + DeserializeOwned + Default + Validate + Clone {}
impl<T: Serialize + DeserializeOwned + Default + Validate + Clone> Params for T {}

/// A name an algorithm answers to, for `fedweave list` and the README.
#[derive(Clone, Copy, Debug)]
pub struct Info {
    /// The name in configs.
    pub name: &'static str,
    /// Graph rule and local objective in one line.
    pub summary: &'static str,
    /// The paper.
    pub reference: &'static str,
}

/// A federated algorithm: a graph rule and a local objective, with the
/// state and messages they need.
pub trait Algorithm: Sized + Send + Sync + 'static {
    /// The names it answers to (variants such as `fedavg-ft` share a type).
    const NAMES: &'static [Info];
    /// Its checked parameters.
    type Params: Params;
    /// What one client keeps between rounds, and the model it holds.
    type Client: State + HoldsModel;
    /// What the server keeps between rounds (`()` for stateless servers);
    /// its `Default` is the state before round 1 unless
    /// [`Algorithm::init_server`] says otherwise.
    type Server: State + Default;
    /// What the server sends one client.
    type Down: Message;
    /// What a client uploads (or, peer-to-peer, publishes).
    type Up: Message;

    /// Builds the algorithm called `name` (always one of
    /// [`Algorithm::NAMES`]: the registry passes the entry's own string) for
    /// this federation, from parameters already checked for `name`; `Err`
    /// says what the federation lacks (e.g. SFL's `graph = "given"` without
    /// a dataset graph).
    fn new(name: &'static str, params: Checked<Self::Params>, env: &Env)
    -> Result<Self, AlgoError>;

    /// The name it runs under: the first of [`Algorithm::NAMES`]; types
    /// with several names override it.
    fn name(&self) -> &'static str {
        Self::NAMES[0].name
    }

    /// The server's state before round 1: `Server::default()` unless the
    /// method overrides it.
    fn init_server(&self, _env: &Env) -> Self::Server {
        Self::Server::default()
    }

    /// Client `client`'s state before round 1.
    fn init_client(&self, env: &Env, client: usize) -> Self::Client;

    /// Trains one participant and returns its upload.
    fn local_round(
        &self,
        env: &Env,
        cx: &mut ClientCx,
        state: &mut Self::Client,
    ) -> Trained<Self::Up>;

    /// Infers the round's graph from the participants' sound uploads (in
    /// ascending client order) and says what each client receives. Never
    /// called with no uploads. The default is Local's rule: W = I.
    fn aggregate(
        &self,
        env: &Env,
        _server: &mut Self::Server,
        _round: usize,
        _uploads: &[(usize, Self::Up)],
    ) -> RoundOutcome<Self::Down> {
        RoundOutcome::keep_all(env.clients())
    }

    /// Client-side application of a download.
    fn receive(&self, env: &Env, state: &mut Self::Client, down: Self::Down);

    /// The client's personalised model: what the protocol scores. The
    /// default is the model its state holds ([`HoldsModel`]); methods that
    /// score something computed (APFL's mixture) override it.
    fn personalized<'c>(&self, state: &'c Self::Client) -> ModelRef<'c> {
        state.held().view()
    }

    /// Scores client `state`'s personalised model on each of `sets` (its
    /// validation and test data), in order. The default evaluates
    /// [`Algorithm::personalized`]; methods whose prediction is more than one
    /// model's output (kNN-Per interpolates with a datastore built from the
    /// client's `train` data, once for all sets) override it.
    fn evaluate(
        &self,
        env: &Env,
        state: &Self::Client,
        _train: &LocalData,
        sets: &[&LocalData],
    ) -> Vec<EvalStats> {
        let model = self.personalized(state);
        sets.iter()
            .map(|on| fedweave_nn::evaluate(env.spec, &model.params, model.buffers, on))
            .collect()
    }

    /// Whether [`Algorithm::evaluate`] scores exactly the model
    /// [`Algorithm::personalized`] returns (its parameters and buffers
    /// alone), so that model, kept on disk, reproduces the client's scores.
    /// Methods whose prediction needs more (kNN-Per's datastore, FedEM's
    /// mixture, FedCP's policy network) say `false`.
    fn scores_personalized(&self) -> bool {
        true
    }

    /// When the protocol scores it.
    fn eval_point(&self) -> EvalPoint {
        EvalPoint::AfterTraining
    }

    /// Whether the model a client holds before local training is one the
    /// method reports, so `eval.when = "before_and_after"` scores it too.
    /// FedAvg-FT's is the global model it has not fine-tuned yet, which
    /// pFedGraph's authors never score for it (`fedavg_ft.py` scores the
    /// fine-tuned model only).
    fn scores_before_training(&self) -> bool {
        true
    }

    /// Whether the server checks an upload's vectors against the full model
    /// length; methods uploading part of a model override it.
    fn check_upload(&self, env: &Env, up: &Self::Up) -> Result<(), String> {
        check_whole_models(env, up.vectors())
    }

    /// Whether a client accepts a download: its check of what the server
    /// sent before [`Algorithm::receive`] applies it (a hostile or broken
    /// server must not crash or poison a client). Every vector a whole,
    /// finite model unless the method sends something else.
    fn check_download(&self, env: &Env, down: &Self::Down) -> Result<(), String> {
        check_whole_models(env, down.vectors())
    }

    /// Whether a server mixes ([`Algorithm::aggregate`]) or the clients
    /// exchange messages among themselves ([`Algorithm::peer_step`]).
    fn topology(&self) -> Topology {
        Topology::Server
    }

    /// Peer-to-peer methods: client `cx.client`, after local training,
    /// fetches the peer messages it wants through `net`, updates its own
    /// state from them and returns its graph row. No other client's state is
    /// visible: the row is the client's own decision. The default keeps the
    /// model (W_ii = 1).
    fn peer_step(
        &self,
        _env: &Env,
        cx: &mut ClientCx,
        _state: &mut Self::Client,
        _net: &dyn PeerNet<Self::Up>,
    ) -> PeerStep {
        PeerStep::keep(cx.client)
    }
}

/// Each named vector finite and of its expected length.
pub fn check_parts(parts: &[(&str, &[f32], usize)]) -> Result<(), String> {
    for &(what, v, len) in parts {
        if v.len() != len {
            return Err(format!(
                "{what} of {} values where {len} are expected",
                v.len()
            ));
        }
        if !fedweave_core::vecmath::all_finite(v) {
            return Err(format!("non-finite {what}"));
        }
    }
    Ok(())
}

/// Every vector finite and of the model's length.
pub fn check_whole_models(env: &Env, vectors: Vec<&[f32]>) -> Result<(), String> {
    for v in vectors {
        if v.len() != env.init.len() {
            return Err(format!(
                "a vector of {} values where the model has {}",
                v.len(),
                env.init.len()
            ));
        }
        if !fedweave_core::vecmath::all_finite(v) {
            return Err("non-finite values".into());
        }
    }
    Ok(())
}
