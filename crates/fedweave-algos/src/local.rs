//! Local training: no collaboration, W = I. The floor every personalised
//! method must beat. Its graph rule is the trait's default `aggregate`.

use crate::Checked;
use crate::params::Validate;
use crate::{AlgoError, Algorithm, ClientCx, Env, Info, Model, Trained};
use serde::{Deserialize, Serialize};

/// Local has no parameters.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LocalParams {}

impl Validate for LocalParams {}

/// Each client trains alone.
pub struct Local;

impl Algorithm for Local {
    const NAMES: &'static [Info] = &[Info {
        name: "local",
        summary: "each client trains alone; W = I",
        reference: "—",
    }];
    type Params = LocalParams;
    type Client = Model;
    type Server = ();
    type Down = ();
    type Up = ();

    fn new(_: &'static str, _: Checked<LocalParams>, _: &Env) -> Result<Self, AlgoError> {
        Ok(Self)
    }

    fn init_client(&self, env: &Env, _: usize) -> Model {
        env.initial_model()
    }

    fn local_round(&self, env: &Env, cx: &mut ClientCx, model: &mut Model) -> Trained<()> {
        // Nothing leaves the client.
        Trained {
            up: (),
            train_loss: cx.train_plain(env, model, &[]),
        }
    }

    fn receive(&self, _: &Env, _: &mut Model, _: ()) {}
}
