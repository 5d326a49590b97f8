//! Running a plan: skip finished runs, run the rest `jobs` at a time.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use fedweave_sim::{RunError, Summary, run_experiment};
use indicatif::{ProgressBar, ProgressStyle};

use crate::error::{SweepError, io};
use crate::grid::{Plan, PlannedRun};

/// File each run directory gets from the sweep: the fingerprint of the
/// resolved configuration, the setting and the seed.
pub const MARKER_FILE: &str = "sweep-run.json";
/// The engine's summary; its presence marks a finished run.
pub const SUMMARY_FILE: &str = "summary.json";

/// Where a planned run stands on disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunState {
    /// Never started.
    New,
    /// Finished with the same configuration: skipped.
    Done,
    /// A directory without a summary (interrupted), or whose configuration
    /// changed since: run again.
    Stale,
}

/// The state of `run` under `out`.
pub fn run_state(out: &Path, run: &PlannedRun) -> RunState {
    let dir = out.join(&run.name);
    if !dir.exists() {
        return RunState::New;
    }
    let marker = std::fs::read_to_string(dir.join(MARKER_FILE))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok());
    let same = marker
        .as_ref()
        .and_then(|m| m.get("fingerprint"))
        .and_then(|f| f.as_str())
        == Some(run.fingerprint.as_str());
    if same && dir.join(SUMMARY_FILE).is_file() {
        RunState::Done
    } else {
        RunState::Stale
    }
}

/// How to run.
#[derive(Clone, Debug)]
pub struct ExecOptions {
    /// Experiments at once.
    pub jobs: usize,
    /// Cores to divide between them (default: all).
    pub cores: Option<usize>,
    /// Show a progress bar (`None`: when stderr is a terminal); otherwise
    /// one line per finished run on stderr.
    pub bar: Option<bool>,
    /// Print nothing.
    pub quiet: bool,
}

impl Default for ExecOptions {
    fn default() -> Self {
        ExecOptions {
            jobs: 1,
            cores: None,
            bar: None,
            quiet: false,
        }
    }
}

/// What happened.
#[derive(Clone, Debug, Default)]
pub struct ExecOutcome {
    /// Runs that were run now.
    pub ran: Vec<String>,
    /// Runs skipped because they had finished before.
    pub skipped: Vec<String>,
    /// Runs that failed, with the error.
    pub failed: Vec<(String, String)>,
    /// Runs stopped by an interrupt ([`fedweave_sim::interrupt`]) at a
    /// checkpoint: the next sweep resumes them.
    pub interrupted: Vec<String>,
    /// Runs not started because of an interrupt.
    pub not_started: usize,
    /// Wall-clock seconds of the whole execution.
    pub seconds: f64,
}

/// Threads for each run when `jobs` run at once on `cores` cores.
pub fn threads_per_run(cores: usize, jobs: usize) -> usize {
    (cores / jobs.max(1)).max(1)
}

/// How one run ended: done, stopped by an interrupt (`Err(None)`), or
/// failed with this error.
type Ended = Result<(), Option<String>>;

/// Runs every planned run that is not finished, `jobs` at a time.
pub fn execute(plan: &Plan, out: &Path, opts: &ExecOptions) -> Result<ExecOutcome, SweepError> {
    let started = Instant::now();
    std::fs::create_dir_all(out).map_err(io(out))?;
    let mut outcome = ExecOutcome::default();
    let mut todo: Vec<(&PlannedRun, RunState)> = Vec::new();
    for r in &plan.runs {
        match run_state(out, r) {
            RunState::Done => outcome.skipped.push(r.name.clone()),
            s => todo.push((r, s)),
        }
    }
    let jobs = opts.jobs.max(1).min(todo.len().max(1));
    let cores = opts
        .cores
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let threads = threads_per_run(cores, jobs);
    if !opts.quiet {
        eprintln!(
            "sweep: {} runs, {} finished earlier (skipped), {} to run; {jobs} at a time, {threads} thread(s) each → {}",
            plan.runs.len(),
            outcome.skipped.len(),
            todo.len(),
            out.display()
        );
    }
    let use_bar = !opts.quiet && opts.bar.unwrap_or_else(|| std::io::stderr().is_terminal());
    let bar = use_bar.then(|| {
        let b = ProgressBar::new(todo.len() as u64);
        b.set_style(
            ProgressStyle::with_template(
                "{spinner} runs {pos}/{len} [{bar:30}] {msg} ({elapsed}, ETA {eta})",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        b.enable_steady_tick(std::time::Duration::from_millis(250));
        b
    });
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let results: Mutex<Vec<(usize, Ended)>> = Mutex::new(Vec::new());
    let total = todo.len();
    std::thread::scope(|scope| {
        for _ in 0..jobs {
            scope.spawn(|| {
                loop {
                    if fedweave_sim::stop_requested() {
                        break;
                    }
                    let k = next.fetch_add(1, Ordering::SeqCst);
                    let Some(&(run, state)) = todo.get(k) else {
                        break;
                    };
                    let mut cfg = run.config.clone();
                    cfg.threads = Some(threads);
                    let t0 = Instant::now();
                    let res = start_or_resume(run, &cfg, &out.join(&run.name), state);
                    let n = done.fetch_add(1, Ordering::SeqCst) + 1;
                    let what = match &res {
                        Ok(s) => headline(s),
                        Err(OneRunError::Run(RunError::Interrupted { round, .. })) => {
                            format!("stopped after round {round} (checkpoint written)")
                        }
                        Err(e) => format!("FAILED: {e}"),
                    };
                    let line = format!("{}: {what} ({:.1}s)", run.name, t0.elapsed().as_secs_f64());
                    match &bar {
                        Some(b) => {
                            b.inc(1);
                            b.set_message(line.clone());
                            if res.is_err() {
                                b.println(line);
                            }
                        }
                        None if !opts.quiet => {
                            let el = started.elapsed().as_secs_f64();
                            let eta = el / n as f64 * (total - n) as f64;
                            eprintln!(
                                "[{n}/{total}] {line}  elapsed {}  ETA {}",
                                fedweave_report::fmt::human_seconds(el),
                                fedweave_report::fmt::human_seconds(eta)
                            );
                        }
                        None => {}
                    }
                    let res = match res {
                        Ok(_) => Ok(()),
                        Err(OneRunError::Run(RunError::Interrupted { .. })) => Err(None),
                        Err(e) => Err(Some(e.to_string())),
                    };
                    results
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push((k, res));
                }
            });
        }
    });
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let mut results = results.into_inner().unwrap_or_else(|e| e.into_inner());
    results.sort_by_key(|(k, _)| *k);
    outcome.not_started = todo.len() - results.len();
    for (k, r) in results {
        let name = todo[k].0.name.clone();
        match r {
            Ok(()) => outcome.ran.push(name),
            Err(None) => outcome.interrupted.push(name),
            Err(Some(e)) => outcome.failed.push((name, e)),
        }
    }
    outcome.seconds = started.elapsed().as_secs_f64();
    Ok(outcome)
}

fn headline(s: &Summary) -> String {
    match (s.mean_test_acc, s.mean_test_mae) {
        (Some(a), _) => format!("mean test acc {:.2}%", 100.0 * a),
        (None, Some(m)) => format!("mean test MAE {m:.4}"),
        _ => "done".into(),
    }
}

/// Errors of one run.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OneRunError {
    #[error("{}: {source}", .path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Run(#[from] RunError),
}

/// THE place where an unfinished run is (re)started.
///
/// A [`RunState::Stale`] directory whose marker carries this run's
/// fingerprint was interrupted: it resumes from its checkpoint (bit-identical
/// to an uninterrupted run). One whose configuration changed, or that cannot
/// be resumed, is wiped and started from scratch; one stopped again by an
/// interrupt keeps its checkpoint.
fn start_or_resume(
    run: &PlannedRun,
    cfg: &fedweave_sim::ExperimentConfig,
    dir: &Path,
    state: RunState,
) -> Result<Summary, OneRunError> {
    let ioe = |path: &Path| {
        let path = path.to_path_buf();
        move |source| OneRunError::Io { path, source }
    };
    if state == RunState::Stale && dir.exists() {
        let marker = std::fs::read_to_string(dir.join(MARKER_FILE)).ok();
        let same = marker
            .and_then(|m| serde_json::from_str::<serde_json::Value>(&m).ok())
            .is_some_and(|m| m["fingerprint"] == serde_json::json!(run.fingerprint));
        if same && dir.join("config.toml").exists() {
            match fedweave_sim::resume_experiment(dir, None, &mut |_| {}) {
                Ok(summary) => return Ok(summary),
                Err(e @ RunError::Interrupted { .. }) => return Err(e.into()),
                Err(_) => {}
            }
        }
        std::fs::remove_dir_all(dir).map_err(ioe(dir))?;
    }
    std::fs::create_dir_all(dir).map_err(ioe(dir))?;
    let marker = serde_json::json!({
        "fingerprint": run.fingerprint,
        "name": run.name,
        "seed": run.seed,
        "setting": run
            .setting
            .iter()
            .map(|(k, v)| serde_json::json!([k, v.to_string()]))
            .collect::<Vec<_>>(),
    });
    let p = dir.join(MARKER_FILE);
    std::fs::write(&p, format!("{marker:#}\n")).map_err(ioe(&p))?;
    Ok(run_experiment(cfg, dir, &mut |_| {})?)
}
