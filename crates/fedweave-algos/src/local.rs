//! Local training: no collaboration, W = I. The floor every personalised
//! method must beat. Its graph rule is the trait's default `aggregate`.

use crate::params::Validate;
use crate::{Algorithm, ClientData, ClientState, Env, Upload, train_plain};
use fedweave_core::RngStream;
use serde::{Deserialize, Serialize};

/// Local has no parameters.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LocalParams {}

impl Validate for LocalParams {}

/// Each client trains alone.
pub struct Local;

impl Local {
    /// Builds the algorithm.
    pub fn new(_: LocalParams) -> Self {
        Self
    }
}

impl Algorithm for Local {
    fn name(&self) -> &'static str {
        "local"
    }

    fn local_round(
        &self,
        env: &Env,
        _: usize,
        _: usize,
        data: &ClientData,
        state: &mut ClientState,
        rng: &mut RngStream,
    ) -> Upload {
        let train_loss = train_plain(env, data, state, &[], rng);
        // Nothing leaves the client.
        Upload {
            model: Vec::new(),
            vectors: 0,
            train_loss,
            extra: None,
        }
    }
}
