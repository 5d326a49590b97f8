//! The one list of algorithms. `fedweave list`, config validation, the
//! README table and the engine's dispatch all read it; adding a method is
//! its own file (declared in `lib.rs`) plus one line in the `registry!`
//! invocation below. The names live only in each type's
//! [`Algorithm::NAMES`]. A line marked `[split]` is a
//! [`Splittable`](crate::personal::Splittable) method: with `[algorithm] personal = ...` the registry builds it inside
//! [`Personal`].

use crate::contract::{Algorithm, Env, Info};
use crate::params::{AlgoError, parse};
use crate::personal::{self, Personal};

/// The branch of `check_params`/`dispatch` for a table that asks for a
/// personal part: the wrapped type for a `[split]` line, an error otherwise.
macro_rules! with_personal {
    (split; $t:ty, $name:expr, $body:ident) => {
        $body!(Personal<$t>)
    };
    (; $t:ty, $name:expr, $body:ident) => {
        return Err(not_splittable($name))
    };
}

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
    ($($m:ident :: $t:ident $([$split:ident])?),* $(,)?) => {
        /// The module of every registered type, in list order.
        #[cfg(test)]
        const MODULES: &[&str] = &[$(stringify!($m)),*];

        /// Every algorithm's names, summaries and references, in list order.
        pub fn catalogue() -> Vec<Info> {
            let mut all = Vec::new();
            $(all.extend_from_slice(<crate::$m::$t as Algorithm>::NAMES);)*
            all
        }

        /// The names that take `[algorithm] personal` ([`Splittable`]
        /// methods), in list order.
        pub fn splittable() -> Vec<&'static str> {
            let mut all = Vec::new();
            $($(
                let _ = stringify!($split);
                all.extend(<crate::$m::$t as Algorithm>::NAMES.iter().map(|i| i.name));
            )?)*
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
                if <crate::$m::$t as Algorithm>::NAMES.iter().any(|i| i.name == name) {
                    macro_rules! check {
                        ($ty:ty) => {
                            return parse::<<$ty as Algorithm>::Params>(name, table, clients).map(|p| p.1)
                        };
                    }
                    if table.contains_key(personal::KEY) {
                        with_personal!($($split)?; crate::$m::$t, name, check);
                    }
                    check!(crate::$m::$t);
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
                if let Some(info) = <crate::$m::$t as Algorithm>::NAMES.iter().find(|i| i.name == name) {
                    macro_rules! build {
                        ($ty:ty) => {{
                            let (params, resolved) =
                                parse::<<$ty as Algorithm>::Params>(name, table, env.clients())?;
                            let algorithm = <$ty as Algorithm>::new(info.name, params, env)?;
                            return Ok(visitor.visit(algorithm, resolved));
                        }};
                    }
                    if table.contains_key(personal::KEY) {
                        with_personal!($($split)?; crate::$m::$t, name, build);
                    }
                    build!(crate::$m::$t);
                }
            )*
            Err(unknown(name))
        }
    };
}

registry!(
    local::Local,
    fedavg::FedAvg[split],
    fedavgm::FedAvgM[split],
    fedatt::FedAtt[split],
    pfedgraph::PFedGraph[split],
    feddwa::FedDwa[split],
    fedaghn::FedAghn[split],
    sfl::Sfl[split],
    dpfl::Dpfl,
    graph_rule::GraphRule,
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
    fedamp::FedAmp[split],
    fedamp::HeurFedAmp[split],
    cfl::Cfl,
    ifca::Ifca,
    fedem::FedEm,
    fedfomo::FedFomo,
    l2c::L2c,
    apple::Apple,
    pfedhn::PFedHn,
    pfedla::PFedLa,
);

fn not_splittable(name: &str) -> AlgoError {
    AlgoError::BadParameter {
        algorithm: name.to_string(),
        message: format!(
            "algorithm.{} does not apply to `{name}` (it takes a personal part with: {})",
            personal::KEY,
            splittable().join(", ")
        ),
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::Tiny;
    use crate::{Message, Topology};

    /// One honest round of an algorithm on the tiny federation; its
    /// downloads must pass the clients' check, and each one with a NaN
    /// planted in its first non-empty vector must not.
    struct HonestDownloads<'a> {
        tiny: &'a Tiny,
    }

    impl Visitor for HonestDownloads<'_> {
        type Output = usize;

        fn visit<A: Algorithm>(self, algo: A, _: toml::Table) -> usize {
            let env = self.tiny.env();
            let n = env.clients();
            let mut server = algo.init_server(&env);
            let mut clients: Vec<A::Client> = (0..n).map(|i| algo.init_client(&env, i)).collect();
            let uploads: Vec<(usize, A::Up)> = clients
                .iter_mut()
                .enumerate()
                .map(|(i, c)| (i, algo.local_round(&env, &mut self.tiny.cx(i, 1), c).up))
                .collect();
            if algo.topology() == Topology::PeerToPeer {
                return 0;
            }
            let outcome = algo.aggregate(&env, &mut server, 1, &uploads);
            let mut poisoned = 0;
            for (i, down) in outcome.downloads {
                let name = algo.name();
                assert_eq!(algo.check_download(&env, &down), Ok(()), "{name} → {i}");
                let mut bad = down.clone();
                if let Some(v) = bad.vectors_mut().into_iter().find(|v| !v.is_empty()) {
                    v[0] = f32::NAN;
                    assert!(algo.check_download(&env, &bad).is_err(), "{name}: NaN");
                    poisoned += 1;
                }
            }
            poisoned
        }
    }

    #[test]
    fn the_crate_docs_name_every_registered_module() {
        let docs: String = include_str!("lib.rs")
            .lines()
            .take_while(|l| l.starts_with("//!"))
            .collect();
        for m in MODULES {
            assert!(docs.contains(&format!("[`{m}`]")), "lib.rs docs lack {m}");
        }
    }

    #[test]
    fn keys_that_do_not_apply_to_the_chosen_name_are_rejected() {
        let mu: toml::Table = toml::from_str("mu = 0.1").unwrap();
        for name in ["fedavg", "fedavg-ft"] {
            let err = check_params(name, &mu, 4).unwrap_err().to_string();
            assert!(err.contains("algorithm.mu does not apply"), "{err}");
            let resolved = check_params(name, &toml::Table::new(), 4).unwrap();
            assert!(!resolved.contains_key("mu"), "{name}: {resolved:?}");
        }
        for name in ["fedprox", "fedprox-ft"] {
            let resolved = check_params(name, &mu, 4).unwrap();
            assert_eq!(resolved["mu"].as_float(), Some(0.1));
        }
    }

    #[test]
    fn every_name_builds_the_type_it_is_listed_under() {
        let tiny = Tiny::new();
        struct Name;
        impl Visitor for Name {
            type Output = &'static str;
            fn visit<A: Algorithm>(self, algo: A, _: toml::Table) -> &'static str {
                algo.name()
            }
        }
        let mut built = 0;
        for info in catalogue() {
            if let Ok(name) = dispatch(info.name, &toml::Table::new(), &tiny.env(), Name) {
                assert_eq!(name, info.name);
                built += 1;
            }
        }
        assert!(built >= 30, "{built}");
    }

    /// Every algorithm that builds on the tiny federation runs a round on
    /// a `sequential` model (with dropout in its body) as on the mlp.
    #[test]
    fn every_algorithm_runs_a_round_on_a_sequential_model() {
        let (mlp, seq) = (Tiny::new(), Tiny::sequential());
        let runs = |tiny: &Tiny| -> Vec<&'static str> {
            catalogue()
                .iter()
                .filter(|info| {
                    let visitor = HonestDownloads { tiny };
                    dispatch(info.name, &toml::Table::new(), &tiny.env(), visitor).is_ok()
                })
                .map(|info| info.name)
                .collect()
        };
        assert_eq!(runs(&seq), runs(&mlp));
    }

    #[test]
    fn honest_downloads_pass_the_clients_check_and_poisoned_ones_do_not() {
        let tiny = Tiny::new();
        let mut checked = Vec::new();
        for info in catalogue() {
            let visitor = HonestDownloads { tiny: &tiny };
            // Methods that need what the tiny federation lacks (a relation
            // graph) are left to the engine's tests.
            if let Ok(poisoned) = dispatch(info.name, &toml::Table::new(), &tiny.env(), visitor)
                && poisoned > 0
            {
                checked.push(info.name);
            }
        }
        assert!(checked.len() >= 30, "only {checked:?}");
    }
}
