//! Server-relayed model exchange, shared by the methods whose *clients*
//! weigh other clients' models (FedFomo, L2C, APPLE): the client needs its
//! own validation data to choose the weights, so it mixes at the start of its
//! next round and uploads the row it used next to its trained model; the
//! server stores every client's latest model, relays the ones each client
//! asked for (or the server chose), and logs the uploaded rows as the
//! round's graph.

use crate::contract::{ClientCx, Env, Message};
use fedweave_core::CollaborationGraph;
use fedweave_nn::{Device, LocalData, LocalTrainer};
use serde::{Deserialize, Serialize};

/// Other clients' models as relayed to one client.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Relayed {
    /// Whose models, in the order of `models`.
    pub ids: Vec<usize>,
    /// Their latest models.
    #[serde(with = "fedweave_core::stash::vectors")]
    pub models: Vec<Vec<f32>>,
}

impl Message for Relayed {
    fn vectors(&self) -> Vec<&[f32]> {
        self.models.iter().map(|m| m.as_slice()).collect()
    }
    fn vectors_mut(&mut self) -> Vec<&mut [f32]> {
        self.models.iter_mut().map(|m| m.as_mut_slice()).collect()
    }
}

impl Relayed {
    /// What a client checks before keeping relayed models: one known,
    /// distinct client id per whole, finite model.
    pub fn check(&self, env: &Env) -> Result<(), String> {
        if self.ids.len() != self.models.len() {
            return Err(format!(
                "{} ids for {} models",
                self.ids.len(),
                self.models.len()
            ));
        }
        let n = env.clients();
        let mut seen = vec![false; n];
        for &j in &self.ids {
            if j >= n || std::mem::replace(&mut seen[j], true) {
                return Err(format!("client id {j} unknown or repeated"));
            }
        }
        crate::contract::check_whole_models(env, self.vectors())
    }
}

/// A trained model and the graph row its client mixed with at the start of
/// the round, with the method's own addition `E` (FedFomo's scores, L2C's
/// kept neighbours; nothing for APPLE).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RowUp<E = ()> {
    /// The model after local training.
    #[serde(with = "fedweave_core::stash::vector")]
    pub model: Vec<f32>,
    /// (client, weight) pairs summing to 1, the uploader included; empty
    /// when the client kept its own model (W_ii = 1). A few scalars next to
    /// a model: not counted on the wire.
    pub row: Vec<(usize, f64)>,
    /// The method's own addition (a few scalars: not counted either).
    pub extra: E,
}

impl<E> Message for RowUp<E>
where
    E: Serialize + serde::de::DeserializeOwned + Clone + Send + Sync + 'static,
{
    fn vectors(&self) -> Vec<&[f32]> {
        vec![&self.model]
    }
    fn vectors_mut(&mut self) -> Vec<&mut [f32]> {
        vec![&mut self.model]
    }
}

/// The server's memory: every client's latest uploaded model.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Store {
    /// θ_j (`None`: j has not uploaded yet).
    #[serde(with = "fedweave_core::stash::opt_vectors")]
    models: Vec<Option<Vec<f32>>>,
}

impl Store {
    /// An empty store for `n` clients.
    pub fn new(n: usize) -> Self {
        Self {
            models: vec![None; n],
        }
    }

    /// Keeps the round's uploaded models.
    pub fn update<E>(&mut self, uploads: &[(usize, RowUp<E>)]) {
        for (i, up) in uploads {
            self.models[*i] = Some(up.model.clone());
        }
    }

    /// The clients whose model the server holds, ascending.
    pub fn known(&self) -> Vec<usize> {
        (0..self.models.len())
            .filter(|&j| self.models[j].is_some())
            .collect()
    }

    /// The stored models of `ids` (unknown ones skipped).
    pub fn relay(&self, ids: &[usize]) -> Relayed {
        let mut out = Relayed::default();
        for &j in ids {
            if let Some(m) = &self.models[j] {
                out.ids.push(j);
                out.models.push(m.clone());
            }
        }
        out
    }
}

/// The round's graph over `n` clients: each uploader's row, identity rows
/// for the others and for uploaders that kept their own model.
pub fn uploaded_rows<E>(n: usize, uploads: &[(usize, RowUp<E>)]) -> CollaborationGraph {
    let mut g = CollaborationGraph::identity(n);
    for (i, up) in uploads {
        if up.row.is_empty() {
            continue;
        }
        let mut full = vec![0.0; n];
        for &(j, w) in &up.row {
            full[j] += w;
        }
        g.set_row(*i, &full);
    }
    g
}

/// The data a client scores candidate models on: its validation split, or
/// its training data when it has none.
pub fn holdout<'a>(cx: &ClientCx<'a>) -> LocalData<'a> {
    if cx.data.val.is_empty() {
        cx.data.train
    } else {
        cx.data.val
    }
}

/// The mean task loss on `data` at `params` and its gradient (one pass over
/// all of `data` as a single batch; batch-norm statistics of the pass are
/// discarded): what L2C's mixing weights descend. `None` on empty data.
pub fn holdout_grad(
    env: &Env,
    data: &LocalData,
    params: &[f32],
    buffers: &[f32],
) -> Option<(f64, Vec<f32>)> {
    if data.is_empty() {
        return None;
    }
    let mut trainer = LocalTrainer::new(
        env.spec,
        &Device::flex(),
        params,
        buffers,
        env.train.sgd(),
        None,
    );
    let all: Vec<usize> = (0..data.len()).collect();
    let loss = trainer.loss_and_grad(data, &all, &[]);
    let mut grad = vec![0.0f32; params.len()];
    trainer.read_grad(&mut grad);
    Some((loss, grad))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relayed_models_need_known_distinct_ids_one_per_whole_model() {
        let t = crate::testkit::Tiny::new();
        let env = t.env();
        let m = || t.init.clone();
        let relayed = |ids: Vec<usize>, models: Vec<Vec<f32>>| Relayed { ids, models };
        assert_eq!(relayed(vec![2, 0], vec![m(), m()]).check(&env), Ok(()));
        assert_eq!(relayed(vec![], vec![]).check(&env), Ok(()));
        for (what, bad) in [
            ("unknown id", relayed(vec![3], vec![m()])),
            ("repeated id", relayed(vec![1, 1], vec![m(), m()])),
            ("more ids", relayed(vec![0, 1], vec![m()])),
            ("more models", relayed(vec![0], vec![m(), m()])),
            ("short model", relayed(vec![0], vec![vec![0.0; 3]])),
        ] {
            assert!(bad.check(&env).is_err(), "{what}");
        }
    }

    #[test]
    fn rows_become_the_graph_and_the_store_relays_what_it_knows() {
        let up = |row: Vec<(usize, f64)>| RowUp {
            model: vec![1.0, 2.0],
            row,
            extra: (),
        };
        let uploads = vec![(0, up(vec![(0, 0.25), (2, 0.75)])), (2, up(vec![]))];
        let g = uploaded_rows(3, &uploads);
        assert_eq!(g.row(0), &[0.25, 0.0, 0.75]);
        assert_eq!(g.row(1), &[0.0, 1.0, 0.0]);
        assert_eq!(g.row(2), &[0.0, 0.0, 1.0]);
        let mut store = Store::new(3);
        store.update(&uploads);
        assert_eq!(store.known(), vec![0, 2]);
        let r = store.relay(&[1, 2]);
        assert_eq!(r.ids, vec![2]);
        assert_eq!(r.bytes(), 8);
    }
}
