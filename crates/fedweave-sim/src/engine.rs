//! Runs an experiment: set up once, then round after round
//! ([`crate::round`]), writing each round's record and checkpoint, then the
//! summary and the report. A run stopped at any point (even by `kill -9`)
//! resumes from its last checkpoint with the same results as an
//! uninterrupted one.

use crate::checkpoint::{self, Identity};
use crate::config::{ConfigError, ExperimentConfig, key_err};
use crate::models::{self, ModelCard};
use crate::protocol::{Facts, Trackers, summarize};
use crate::round::{RunState, run_round};
use crate::setup::Setup;
use fedweave_algos::{Algorithm, Topology, Visitor};
use fedweave_records::{RoundRecord, Summary, tensorboard};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::io::Write;
use std::path::{Path, PathBuf};
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
    /// A stop was asked for ([`crate::interrupt`]): the run stopped after
    /// round `round` with its checkpoint written.
    #[error("interrupted after round {round} — fedweave resume {} continues", .dir.display())]
    Interrupted {
        /// The last round done (and checkpointed).
        round: usize,
        /// The run directory.
        dir: PathBuf,
    },
    /// `resume` of a directory that holds no run.
    #[error(
        "{} is not a run directory (it has no config.toml with rounds.jsonl or a checkpoint); start a run with `fedweave run CONFIG --out {}`",
        .dir.display(), .dir.display()
    )]
    NotARun {
        /// The directory.
        dir: PathBuf,
    },
    /// `resume` of a run that has done every round asked for.
    #[error(
        "{} is already finished ({rounds} rounds); `fedweave resume {} --rounds N` with N > {rounds} extends it",
        .dir.display(), .dir.display()
    )]
    Finished {
        /// The run directory.
        dir: PathBuf,
        /// Rounds it has done.
        rounds: usize,
    },
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
///
/// # Errors
/// [`RunError::NotARun`] for a directory that holds no run (see
/// [`is_run_dir`]), [`RunError::Finished`] for a run that has already done
/// those rounds, and whatever a run can fail with.
pub fn resume_experiment(
    dir: &Path,
    rounds: Option<usize>,
    on_round: &mut dyn FnMut(&RoundRecord),
) -> Result<Summary, RunError> {
    if !is_run_dir(dir) {
        return Err(RunError::NotARun {
            dir: dir.to_path_buf(),
        });
    }
    let mut cfg = ExperimentConfig::from_file(&dir.join("config.toml"), &[])?;
    if let Some(r) = rounds {
        cfg.rounds = r;
        cfg.validate()?;
    }
    if let Some(done) = finished_rounds(dir)
        && done == cfg.rounds
    {
        return Err(RunError::Finished {
            dir: dir.to_path_buf(),
            rounds: done,
        });
    }
    start(&cfg, dir, true, on_round)
}

/// Whether `dir` holds a run that [`resume_experiment`] can continue: its
/// `config.toml` and `rounds.jsonl` or a checkpoint (a `config.toml` alone
/// may be anyone's config file).
pub fn is_run_dir(dir: &Path) -> bool {
    dir.join("config.toml").is_file()
        && (dir.join("rounds.jsonl").is_file() || checkpoint::path(dir).is_file())
}

/// The rounds of a finished run (one with `summary.json`).
fn finished_rounds(dir: &Path) -> Option<usize> {
    let text = std::fs::read_to_string(dir.join("summary.json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v.get("rounds")?.as_u64().map(|r| r as usize)
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
    if cfg.device.batch_clients > 0 && cfg.device.backend == fedweave_nn::Backend::Cpu {
        tracing::warn!(
            "device.batch_clients = {} on the CPU backend: batched kernels are slower than one \
             client at a time on a CPU (0.56–0.83× at K = 10, docs/results.md); the key is meant \
             for GPUs",
            cfg.device.batch_clients
        );
    }
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
        let cfg = resolve_config(&setup.cfg, &algo, resolved)?;
        let partition = serde_json::to_string(&setup.report).unwrap_or_default();
        let mut dir = RunDir::open(out_dir, &cfg, algo.name(), Some(&partition))?;
        dir.set_started(started);
        let facts = Facts {
            cfg,
            ..setup.facts()
        };
        let cfg = &facts.cfg;
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(setup.threads())
            .build()
            .map_err(|e| RunError::Threads(e.to_string()))?;

        let env = setup.env();
        let exact = algo.scores_personalized();
        let card = ModelCard::new(
            &setup.spec,
            cfg,
            &facts.dataset,
            algo.name(),
            exact,
            !facts.regression,
            &setup.input,
        );
        card.write(out_dir)?;
        let restored = if resume { dir.restore()? } else { None };
        let (mut state, mut records) = restored.unwrap_or_else(|| {
            let state = RunState {
                round: 0,
                server: algo.init_server(&env),
                clients: (0..cfg.clients)
                    .map(|i| algo.init_client(&env, i))
                    .collect(),
                trackers: Trackers::new(cfg.clients),
            };
            (state, Vec::new())
        });
        dir.start_records(&records, state.round)?;
        while state.round < cfg.rounds {
            let (record, kept) = run_round(&algo, setup, &facts, &mut state, &pool);
            // The round's models before its checkpoint: a run resumed from
            // an earlier checkpoint rewrites them as it replays the round.
            models::keep(out_dir, kept, state.round, algo.name(), exact)?;
            dir.commit(&record, &state)?;
            on_round(&record);
            records.push(record);
            if crate::interrupt::stop_requested() && state.round < cfg.rounds {
                dir.checkpoint_now(&state)?;
                return Err(RunError::Interrupted {
                    round: state.round,
                    dir: out_dir.to_path_buf(),
                });
            }
        }
        dir.finish(&facts, algo.name(), &state.trackers, &records, started)
    }
}

/// The configuration a run directory records: `cfg` with the algorithm's
/// resolved parameters; refuses a robust aggregator for a method with no
/// server.
pub fn resolve_config<A: Algorithm>(
    cfg: &ExperimentConfig,
    algo: &A,
    resolved: toml::Table,
) -> Result<ExperimentConfig, RunError> {
    let mut cfg = cfg.clone();
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
    Ok(cfg)
}

/// A run directory being written, the same for every runtime:
/// `config.toml` (and `partition.json` when the runtime knows it),
/// `rounds.jsonl` one line per round, the checkpoint, then `summary.json`
/// and `report.html`.
pub struct RunDir {
    dir: PathBuf,
    algorithm: String,
    fingerprint: String,
    checkpoint_every: usize,
    rounds: usize,
    rounds_file: Option<std::fs::File>,
    /// Whether to keep a TensorBoard event file beside `rounds.jsonl`.
    tensorboard: bool,
    events: Option<tensorboard::EventWriter>,
    /// When this session of the run started.
    started: Instant,
    /// Wall-clock seconds of the sessions before this one (from the
    /// checkpoint restored).
    prior_wall: f64,
}

impl RunDir {
    /// Creates `dir` if needed and writes the resolved `cfg` (and the
    /// partition report) into it.
    pub fn open(
        dir: &Path,
        cfg: &ExperimentConfig,
        algorithm: &str,
        partition: Option<&str>,
    ) -> Result<Self, RunError> {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let this = Self {
            dir: dir.to_path_buf(),
            algorithm: algorithm.to_string(),
            fingerprint: cfg.fingerprint(),
            checkpoint_every: cfg.checkpoint_every,
            rounds: cfg.rounds,
            rounds_file: None,
            tensorboard: cfg.tensorboard,
            events: None,
            started: Instant::now(),
            prior_wall: 0.0,
        };
        this.write("config.toml", &cfg.to_toml())?;
        if let Some(p) = partition {
            this.write("partition.json", p)?;
        }
        Ok(this)
    }

    /// When this session of the run started (default: when the directory
    /// was opened); wall time is counted from there.
    pub fn set_started(&mut self, started: Instant) {
        self.started = started;
    }

    /// Wall-clock seconds of the run so far, earlier sessions included.
    fn wall_seconds(&self) -> f64 {
        self.prior_wall + self.started.elapsed().as_secs_f64()
    }

    fn write(&self, name: &str, text: &str) -> Result<(), RunError> {
        let p = self.dir.join(name);
        std::fs::write(&p, text).map_err(io(&p))
    }

    fn identity(&self) -> Identity<'_> {
        Identity {
            algorithm: &self.algorithm,
            config: &self.fingerprint,
        }
    }

    /// The last checkpoint's state and the records of its rounds; `None`
    /// when the run has no checkpoint yet. A checkpoint past the configured
    /// end is an error that says how to extend the run.
    #[allow(clippy::type_complexity)]
    pub fn restore<S: DeserializeOwned, C: DeserializeOwned>(
        &mut self,
    ) -> Result<Option<(RunState<S, C>, Vec<RoundRecord>)>, RunError> {
        let Some((state, wall)) = checkpoint::load::<S, C>(&self.dir, &self.identity())? else {
            return Ok(None);
        };
        if state.round > self.rounds {
            return Err(RunError::Checkpoint {
                path: checkpoint::path(&self.dir).display().to_string(),
                message: format!(
                    "the run already has {} rounds; resume with --rounds N for N ≥ {}",
                    state.round, state.round
                ),
            });
        }
        let records = read_records(&self.dir, state.round)?;
        self.prior_wall = wall;
        Ok(Some((state, records)))
    }

    /// Rewrites `rounds.jsonl` to hold exactly `records` (the checkpointed
    /// rounds 1..=`round`), then appends from there.
    pub fn start_records(&mut self, records: &[RoundRecord], round: usize) -> Result<(), RunError> {
        debug_assert_eq!(records.len(), round);
        let mut lines = String::new();
        for r in records {
            lines.push_str(&serde_json::to_string(r).unwrap_or_default());
            lines.push('\n');
        }
        self.write("rounds.jsonl", &lines)?;
        let p = self.dir.join("rounds.jsonl");
        let file = std::fs::OpenOptions::new()
            .append(true)
            .open(&p)
            .map_err(io(&p))?;
        self.rounds_file = Some(file);
        // The event file is rewritten from the kept records too, so a
        // resumed run has one file holding every round once.
        if self.tensorboard {
            let path = self.dir.join(tensorboard::EVENT_FILE);
            let mut w = tensorboard::EventWriter::create(&path, unix_now())?;
            for r in records {
                w.round(r, unix_now())?;
            }
            self.events = Some(w);
        }
        Ok(())
    }

    /// Appends a finished round's record and checkpoints `state` when due
    /// (every `checkpoint_every` rounds and at the last one).
    pub fn commit<S: Serialize, C: Serialize>(
        &mut self,
        record: &RoundRecord,
        state: &RunState<S, C>,
    ) -> Result<(), RunError> {
        let p = self.dir.join("rounds.jsonl");
        let Some(file) = self.rounds_file.as_mut() else {
            return Err(RunError::Io {
                path: p.display().to_string(),
                source: std::io::Error::other("rounds.jsonl not started"),
            });
        };
        if let Some(w) = self.events.as_mut() {
            w.round(record, unix_now())?;
        }
        let line = serde_json::to_string(record).unwrap_or_default();
        writeln!(file, "{line}").map_err(io(&p))?;
        file.flush().map_err(io(&p))?;
        if checkpoint_due(self.checkpoint_every, self.rounds, state.round) {
            checkpoint::save(&self.dir, &self.identity(), state, self.wall_seconds())?;
        }
        Ok(())
    }

    /// Checkpoints `state` now unless [`RunDir::commit`] just did (a run
    /// stopping between its regular checkpoints).
    pub fn checkpoint_now<S: Serialize, C: Serialize>(
        &self,
        state: &RunState<S, C>,
    ) -> Result<(), RunError> {
        if checkpoint_due(self.checkpoint_every, self.rounds, state.round) {
            return Ok(());
        }
        checkpoint::save(&self.dir, &self.identity(), state, self.wall_seconds())
    }

    /// Writes `summary.json` and `report.html` and returns the summary. Its
    /// `wall_seconds` adds the time since `started` to that of the sessions
    /// before a resume.
    pub fn finish(
        &self,
        facts: &Facts,
        algorithm: &str,
        trackers: &Trackers,
        records: &[RoundRecord],
        started: Instant,
    ) -> Result<Summary, RunError> {
        let elapsed = self.prior_wall + started.elapsed().as_secs_f64();
        let summary = summarize(facts, algorithm, trackers, records, elapsed);
        self.write(
            "summary.json",
            &serde_json::to_string_pretty(&summary).unwrap_or_default(),
        )?;
        if let Err(e) = fedweave_report::write_report(&self.dir) {
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

/// Whether round `round` of a `rounds`-round run is checkpointed: every
/// `every` rounds and the last (never when `every` is 0). Clients of a
/// network run keep their states at the same rounds.
pub fn checkpoint_due(every: usize, rounds: usize, round: usize) -> bool {
    every > 0 && (round.is_multiple_of(every) || round == rounds)
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

/// Files a run writes into its directory (`--overwrite` removes them).
const RUN_FILES: [&str; 8] = [
    "config.toml",
    "rounds.jsonl",
    "summary.json",
    "report.html",
    "partition.json",
    "checkpoint",
    "tensorboard",
    "models",
];

/// Refuses to write a run into `out` when it already holds one, unless
/// `overwrite`, which removes that run's files first.
pub fn claim_out_dir(out: &std::path::Path, overwrite: bool) -> Result<(), String> {
    let present: Vec<&str> = RUN_FILES
        .iter()
        .copied()
        .filter(|f| out.join(f).exists())
        .collect();
    if present.is_empty() {
        return Ok(());
    }
    if !overwrite {
        if present == ["config.toml"] {
            return Err(format!(
                "{} holds a config.toml that is not a run's; the run would replace it with its resolved config: choose another --out, or --overwrite",
                out.display()
            ));
        }
        return Err(format!(
            "{} already holds a run ({}): `fedweave resume {}` continues it, --overwrite replaces it, or choose another --out",
            out.display(),
            present.join(", "),
            out.display()
        ));
    }
    for f in present {
        let p = out.join(f);
        let removed = if p.is_dir() {
            std::fs::remove_dir_all(&p)
        } else {
            std::fs::remove_file(&p)
        };
        removed.map_err(|e| format!("cannot remove {}: {e}", p.display()))?;
    }
    Ok(())
}
