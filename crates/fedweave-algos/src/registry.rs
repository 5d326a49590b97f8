//! The one list of algorithms. `fedweave list`, config validation, the
//! README table and the engine's dispatch all read it; adding a method is
//! its own file plus one line in the `registry!` invocation below.

use crate::contract::{Algorithm, Env, Info};
use crate::params::{AlgoError, parse};
use crate::{
    apfl, apple, cfl, ditto, dpfl, fedaghn, fedala, fedamp, fedavg, fedbabu, fedcp, feddwa, feddyn,
    fedem, fedfomo, fednova, fedpac, fedphp, fedproto, fedrep, fedrod, ifca, knnper, l2c, local,
    moon, partial, perfedavg, pfedgraph, pfedhn, pfedla, pfedme, scaffold, sfl,
};

/// What the engine does with a concrete algorithm type: the registry hands
/// it the built algorithm, so the engine runs monomorphised code with the
/// algorithm's own state and message types.
pub trait Visitor {
    /// What the visit returns.
    type Output;
    /// Runs with the built algorithm and its resolved parameter table.
    fn visit<A: Algorithm>(self, algorithm: A, resolved: toml::Table) -> Self::Output;
}

macro_rules! registry {
    ($($ty:ty),* $(,)?) => {
        /// Every algorithm's names, summaries and references, in list order.
        pub fn catalogue() -> Vec<Info> {
            let mut all = Vec::new();
            $(all.extend_from_slice(<$ty as Algorithm>::NAMES);)*
            all
        }

        /// Parses and checks `[algorithm]` parameters for `name` without
        /// building anything; returns the resolved table.
        pub fn check_params(
            name: &str,
            table: &toml::Table,
            clients: usize,
        ) -> Result<toml::Table, AlgoError> {
            $(
                if <$ty as Algorithm>::NAMES.iter().any(|i| i.name == name) {
                    return parse::<<$ty as Algorithm>::Params>(name, table, clients).map(|p| p.1);
                }
            )*
            Err(unknown(name))
        }

        /// Builds the algorithm `name` from its parameter table for the
        /// federation `env` and hands it to `visitor`.
        pub fn dispatch<V: Visitor>(
            name: &str,
            table: &toml::Table,
            env: &Env,
            visitor: V,
        ) -> Result<V::Output, AlgoError> {
            $(
                if <$ty as Algorithm>::NAMES.iter().any(|i| i.name == name) {
                    let (params, resolved) =
                        parse::<<$ty as Algorithm>::Params>(name, table, env.clients())?;
                    let algorithm = <$ty as Algorithm>::new(name, params, env)?;
                    return Ok(visitor.visit(algorithm, resolved));
                }
            )*
            Err(unknown(name))
        }
    };
}

registry!(
    local::Local,
    fedavg::FedAvg,
    pfedgraph::PFedGraph,
    feddwa::FedDwa,
    fedaghn::FedAghn,
    sfl::Sfl,
    dpfl::Dpfl,
    ditto::Ditto,
    apfl::Apfl,
    fedala::FedAla,
    fedrep::FedRep,
    partial::PartialAvg,
    fedbabu::FedBabu,
    fedpac::FedPac,
    fedcp::FedCp,
    fedrod::FedRod,
    fedproto::FedProto,
    knnper::KnnPer,
    fedphp::FedPhp,
    perfedavg::PerFedAvg,
    pfedme::PFedMe,
    scaffold::Scaffold,
    feddyn::FedDyn,
    fednova::FedNova,
    moon::Moon,
    fedamp::FedAmp,
    fedamp::HeurFedAmp,
    cfl::Cfl,
    ifca::Ifca,
    fedem::FedEm,
    fedfomo::FedFomo,
    l2c::L2c,
    apple::Apple,
    pfedhn::PFedHn,
    pfedla::PFedLa,
);

fn unknown(name: &str) -> AlgoError {
    AlgoError::UnknownAlgorithm {
        name: name.to_string(),
        known: catalogue()
            .iter()
            .map(|c| c.name)
            .collect::<Vec<_>>()
            .join(", "),
    }
}
