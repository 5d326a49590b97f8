//! Runs an experiment: set up once, then round after round
//! ([`crate::round`]), writing each round's record and checkpoint, then the
//! summary and the report. A run stopped at any point (even by `kill -9`)
//! resumes from its last checkpoint with the same results as an
//! uninterrupted one.

use crate::checkpoint::{self, Identity};
use crate::config::{ConfigError, ExperimentConfig, key_err};
use crate::protocol::{Trackers, summarize};
use crate::round::{RunState, run_round};
use crate::setup::Setup;
use fedweave_algos::{Algorithm, Topology, Visitor};
use fedweave_records::{RoundRecord, Summary, tensorboard};
use std::io::Write;
use std::path::Path;
use std::time::Instant;

/// Errors that stop a run before or while it runs.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Dataset or partition problem.
    #[error(transparent)]
    Data(#[from] fedweave_data::DataError),
    /// Model cannot take the dataset's inputs.
    #[error(transparent)]
    Model(#[from] fedweave_nn::NnError),
    /// Bad algorithm name or parameter.
    #[error(transparent)]
    Algorithm(#[from] fedweave_algos::AlgoError),
    /// The configuration of a run directory cannot be read.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Writing or reading an output file failed.
    #[error("cannot write {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// A checkpoint is missing, corrupt or belongs to another run.
    #[error("checkpoint {path}: {message}")]
    Checkpoint {
        /// The file.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// The TensorBoard event file could not be written.
    #[error(transparent)]
    Events(#[from] fedweave_records::tensorboard::EventFileError),
    /// The thread pool could not be built.
    #[error("cannot start worker threads: {0}")]
    Threads(String),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> RunError + '_ {
    move |source| RunError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Runs one experiment, writing its outputs into `out_dir` (created if
/// needed): `config.toml`, `partition.json`, `rounds.jsonl`, the
/// checkpoint, `summary.json` and `report.html`. `on_round` sees every
/// round's record as soon as it is done.
pub fn run_experiment(
    cfg: &ExperimentConfig,
    out_dir: &Path,
    on_round: &mut dyn FnMut(&RoundRecord),
) -> Result<Summary, RunError> {
    start(cfg, out_dir, false, on_round)
}

/// Continues the run in `dir` from its last checkpoint (from the start if
/// it stopped before its first one), up to `rounds` rounds if given (more
/// than it was configured for extends it), else to its configured end.
pub fn resume_experiment(
    dir: &Path,
    rounds: Option<usize>,
    on_round: &mut dyn FnMut(&RoundRecord),
) -> Result<Summary, RunError> {
    let mut cfg = ExperimentConfig::from_file(&dir.join("config.toml"), &[])?;
    if let Some(r) = rounds {
        cfg.rounds = r;
        cfg.validate()?;
    }
    start(&cfg, dir, true, on_round)
}

fn start(
    cfg: &ExperimentConfig,
    out_dir: &Path,
    resume: bool,
    on_round: &mut dyn FnMut(&RoundRecord),
) -> Result<Summary, RunError> {
    let started = Instant::now();
    std::fs::create_dir_all(out_dir).map_err(io(out_dir))?;
    let setup = Setup::load(cfg)?;
    let runner = Runner {
        setup: &setup,
        out_dir,
        resume,
        on_round,
        started,
    };
    fedweave_algos::dispatch(
        cfg.algorithm_name(),
        &cfg.algorithm_params(),
        &setup.env(),
        runner,
    )?
}

/// The generic part of a run, instantiated for each algorithm type.
struct Runner<'a> {
    setup: &'a Setup,
    out_dir: &'a Path,
    resume: bool,
    on_round: &'a mut dyn FnMut(&RoundRecord),
    started: Instant,
}

impl Visitor for Runner<'_> {
    type Output = Result<Summary, RunError>;

    fn visit<A: Algorithm>(self, algo: A, resolved: toml::Table) -> Self::Output {
        let Runner {
            setup,
            out_dir,
            resume,
            on_round,
            started,
        } = self;
        let mut cfg = setup.cfg.clone();
        if algo.topology() == Topology::PeerToPeer && !cfg.aggregator.is_mean() {
            return Err(RunError::Config(key_err(
                "aggregator.kind",
                format!(
                    "`{}` has no server to aggregate; robust aggregators need a server method",
                    algo.name()
                ),
            )));
        }
        cfg.algorithm = resolved;
        cfg.algorithm
            .insert("name".into(), toml::Value::String(algo.name().to_string()));
        let write = |name: &str, text: &str| -> Result<(), RunError> {
            let p = out_dir.join(name);
            std::fs::write(&p, text).map_err(io(&p))
        };
        write("config.toml", &cfg.to_toml())?;
        write(
            "partition.json",
            &serde_json::to_string(&setup.report).unwrap_or_default(),
        )?;
        let fingerprint = cfg.fingerprint();
        let identity = Identity {
            algorithm: algo.name(),
            config: &fingerprint,
        };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(setup.threads())
            .build()
            .map_err(|e| RunError::Threads(e.to_string()))?;

        let env = setup.env();
        let fresh = || RunState {
            round: 0,
            server: algo.init_server(&env),
            clients: (0..cfg.clients)
                .map(|i| algo.init_client(&env, i))
                .collect(),
            trackers: Trackers::new(cfg.clients),
        };
        let (mut state, mut records) = match resume {
            true => match checkpoint::load(out_dir, &identity)? {
                Some(state) => {
                    let records = read_records(out_dir, state.round)?;
                    (state, records)
                }
                None => (fresh(), Vec::new()),
            },
            false => (fresh(), Vec::new()),
        };
        if state.round > cfg.rounds {
            return Err(RunError::Checkpoint {
                path: checkpoint::path(out_dir).display().to_string(),
                message: format!(
                    "the run already has {} rounds; resume with --rounds N for N ≥ {}",
                    state.round, state.round
                ),
            });
        }
        // rounds.jsonl holds exactly the checkpointed rounds, then grows.
        let rounds_path = out_dir.join("rounds.jsonl");
        let mut lines = String::new();
        for r in &records {
            lines.push_str(&serde_json::to_string(r).unwrap_or_default());
            lines.push('\n');
        }
        write("rounds.jsonl", &lines)?;
        let mut rounds_file = std::fs::OpenOptions::new()
            .append(true)
            .open(&rounds_path)
            .map_err(io(&rounds_path))?;

        // The event file is rewritten from the kept records, so a resumed
        // run has one file holding every round once.
        let mut events = match cfg.tensorboard {
            true => {
                let path = out_dir.join(tensorboard::EVENT_FILE);
                let mut w = tensorboard::EventWriter::create(&path, unix_now())?;
                for r in &records {
                    w.round(r, unix_now())?;
                }
                Some(w)
            }
            false => None,
        };

        while state.round < cfg.rounds {
            let record = run_round(&algo, setup, &mut state, &pool);
            if let Some(w) = events.as_mut() {
                w.round(&record, unix_now())?;
            }
            let line = serde_json::to_string(&record).unwrap_or_default();
            writeln!(rounds_file, "{line}").map_err(io(&rounds_path))?;
            rounds_file.flush().map_err(io(&rounds_path))?;
            let every = cfg.checkpoint_every;
            if every > 0 && (state.round % every == 0 || state.round == cfg.rounds) {
                checkpoint::save(out_dir, &identity, &state)?;
            }
            on_round(&record);
            records.push(record);
        }

        let summary = summarize(
            setup,
            algo.name(),
            &state.trackers,
            &records,
            started.elapsed().as_secs_f64(),
        );
        write(
            "summary.json",
            &serde_json::to_string_pretty(&summary).unwrap_or_default(),
        )?;
        if let Err(e) = fedweave_report::write_report(out_dir) {
            tracing::warn!("report.html not written: {e}");
        }
        Ok(summary)
    }
}

/// Seconds since the Unix epoch, TensorBoard's time axis.
fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The records of rounds 1..=`round` from `rounds.jsonl`; lines after them
/// (a round finished after the checkpoint, or a line torn by a crash) are
/// dropped.
fn read_records(dir: &Path, round: usize) -> Result<Vec<RoundRecord>, RunError> {
    let p = dir.join("rounds.jsonl");
    let text = std::fs::read_to_string(&p).map_err(io(&p))?;
    let records: Vec<RoundRecord> = text
        .lines()
        .take(round)
        .map_while(|l| serde_json::from_str(l).ok())
        .collect();
    if records.len() != round || records.iter().enumerate().any(|(k, r)| r.round != k + 1) {
        return Err(RunError::Checkpoint {
            path: p.display().to_string(),
            message: format!(
                "the checkpoint is at round {round} but rounds.jsonl does not hold rounds 1..={round}"
            ),
        });
    }
    Ok(records)
}
