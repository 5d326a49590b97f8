//! `fedweave._fedweave`: the Rust half of the `fedweave` Python package.
//!
//! It is deliberately thin (the polars / tokenizers shape): every function
//! calls the library the `fedweave` binary calls, with the same messages,
//! and returns plain Python values; `fedweave/__init__.py` turns them into
//! `Run` objects, pandas frames and numpy arrays. Runs release the GIL and
//! run on their own thread; the calling thread wakes every 100 ms to let
//! Python deliver Ctrl-C, which stops the run at its next safe point with
//! its checkpoint written (as SIGINT does to the binary) and then raises
//! `KeyboardInterrupt` naming the directory to resume.

mod servers;

use fedweave_algos::graph_rule::{self, Rule, RuleInput, Weights};
use fedweave_sim::export::{TorchData, to_state_dict};
use fedweave_sim::models::{ModelCard, Which, read_checked};
use fedweave_sim::runtime::Derived;
use fedweave_sim::{ExperimentConfig, RoundRecord, RunError};
use pyo3::create_exception;
use pyo3::exceptions::{PyKeyboardInterrupt, PyRuntimeError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Duration;

create_exception!(
    _fedweave,
    FedweaveError,
    PyRuntimeError,
    "A fedweave error: a bad config, missing data, a run that failed. The message is the command line's."
);

/// Any displayable error as a `FedweaveError` with its message.
pub(crate) fn err(e: impl std::fmt::Display) -> PyErr {
    FedweaveError::new_err(e.to_string())
}

/// One finished round as the progress callback gets it: (round, mean
/// validation accuracy, mean validation MAE, the round's seconds).
type RoundInfo = (usize, Option<f64>, Option<f64>, f64);

/// Where a run's rounds are reported: the Python callback `on_round(round,
/// val_acc, val_mae, seconds)`, called on the calling thread (with the GIL)
/// as rounds finish, or one line per round on stderr, or nothing.
enum Progress {
    Callback(Py<PyAny>),
    Lines,
    Quiet,
}

impl Progress {
    fn new(on_round: Option<Py<PyAny>>, quiet: bool) -> Self {
        match (on_round, quiet) {
            (_, true) => Self::Quiet,
            (Some(f), false) => Self::Callback(f),
            (None, false) => Self::Lines,
        }
    }
}

/// Runs `job` on its own thread with the GIL released, polling Python's
/// signal handlers meanwhile: Ctrl-C asks the run to stop after its round
/// (`fedweave_sim::request_stop`) and the job is awaited, so its
/// checkpoint is written before this returns. `job` gets the sender of its
/// rounds; with a `Progress::Callback` they are handed to it here, between
/// waits (an exception in it stops the run after its round, then is raised).
fn drive<T: Send + 'static>(
    py: Python<'_>,
    progress: &Progress,
    job: impl FnOnce(mpsc::Sender<RoundInfo>) -> T + Send + 'static,
) -> PyResult<T> {
    fedweave_sim::clear_stop();
    let (tx, rx) = mpsc::channel();
    let (round_tx, round_rx) = mpsc::channel::<RoundInfo>();
    std::thread::spawn(move || {
        // A graph rule that fails stops its run by panicking out of the
        // round (the protocol has no error path there): its message
        // becomes the Python exception. The receiver outlives the job
        // unless Python itself is exiting.
        let _ = tx.send(std::panic::catch_unwind(AssertUnwindSafe(|| job(round_tx))));
    });
    let mut stopping = false;
    let mut failed: Option<PyErr> = None;
    let mut rx = Some(rx);
    let report = |py: Python<'_>, failed: &mut Option<PyErr>, stopping: &mut bool| {
        for (round, acc, mae, seconds) in round_rx.try_iter() {
            match progress {
                Progress::Callback(f) if failed.is_none() => {
                    if let Err(e) = f.call1(py, (round, acc, mae, seconds)) {
                        // Ctrl-C delivered while the callback ran is Ctrl-C:
                        // the run stops and says how to resume.
                        if !e.is_instance_of::<PyKeyboardInterrupt>(py) {
                            *failed = Some(e);
                        }
                        if !*stopping {
                            fedweave_sim::request_stop();
                            *stopping = true;
                            eprintln!(
                                "stopping after the current round (its checkpoint is written)"
                            );
                        }
                    }
                }
                Progress::Lines => {
                    let acc = match (acc, mae) {
                        (Some(a), _) => format!("val acc {a:.4}"),
                        (None, Some(m)) => format!("val MAE {m:.4}"),
                        _ => String::new(),
                    };
                    eprintln!("round {round} · {acc} · {seconds:.1} s");
                }
                _ => {}
            }
        }
    };
    loop {
        // The receiver is not `Sync`: it moves into the GIL-free closure and back.
        let (got, back) = py.detach(move || {
            let rx = rx.take().expect("the receiver is put back after each wait");
            (rx.recv_timeout(Duration::from_millis(100)), rx)
        });
        rx = Some(back);
        report(py, &mut failed, &mut stopping);
        match got {
            Ok(Ok(value)) => {
                return match failed {
                    Some(e) => Err(e),
                    None => Ok(value),
                };
            }
            Ok(Err(panic)) => {
                let message = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "the run stopped on an internal error".into());
                return Err(err(message));
            }
            Err(RecvTimeoutError::Timeout) => {
                if !stopping && py.check_signals().is_err() {
                    fedweave_sim::request_stop();
                    stopping = true;
                    eprintln!("stopping after the current round (its checkpoint is written)");
                }
            }
            Err(RecvTimeoutError::Disconnected) => {
                return Err(err("the run's thread ended without a result"));
            }
        }
    }
}

/// The run callback that sends each round to [`drive`].
fn sender(tx: mpsc::Sender<RoundInfo>) -> impl FnMut(&RoundRecord) {
    move |r: &RoundRecord| {
        let _ = tx.send((r.round, r.mean_val_acc, r.mean_val_mae, r.seconds));
    }
}

/// A run's error as Python sees it: an interrupted run is a
/// `KeyboardInterrupt` saying how to continue.
fn run_err(e: RunError) -> PyErr {
    match e {
        RunError::Interrupted { round, dir } => PyKeyboardInterrupt::new_err(format!(
            "run stopped after round {round} with its checkpoint written; fedweave.resume({:?}) continues it",
            dir.display().to_string()
        )),
        other => err(other),
    }
}

/// A graph rule written in Python: `adapter(models, p, d, sizes, round,
/// participants, layers, state)` (made by `fedweave._rule_adapter` from the
/// user's `fn(uploads, sizes, round, state) -> W`) returns `(W, shape,
/// state)`, W as little-endian `f64` bytes of shape `[p, p]` (one W) or
/// `[L, p, p]` (one per layer group).
struct PyRule {
    adapter: Py<PyAny>,
}

impl Rule for PyRule {
    fn weights(&self, input: &RuleInput, state: &str) -> Result<(Weights, String), String> {
        Python::attach(|py| {
            let d = input.models.first().map_or(0, |m| m.len());
            let mut raw = Vec::with_capacity(4 * d * input.models.len());
            for m in input.models {
                raw.extend(m.iter().flat_map(|x| x.to_le_bytes()));
            }
            let layers: Vec<(String, usize, usize)> = input
                .layers
                .iter()
                .map(|(n, r)| (n.clone(), r.start, r.end))
                .collect();
            let args = (
                PyBytes::new(py, &raw),
                input.models.len(),
                d,
                input.sizes.to_vec(),
                input.round,
                input.participants.to_vec(),
                layers,
                state,
            );
            let (w, shape, state) = self
                .adapter
                .call1(py, args)?
                .extract::<(Vec<u8>, Vec<usize>, String)>(py)?;
            Ok::<_, PyErr>((servers::weights_of(&w, &shape)?, state))
        })
        .map_err(|e| e.to_string())
    }
}

/// Installs `rule` (a Python adapter) for the run `job` drives, removing it
/// after.
fn with_rule<T>(rule: Option<Py<PyAny>>, job: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    graph_rule::install(rule.map(|adapter| Arc::new(PyRule { adapter }) as Arc<dyn Rule>));
    let out = job();
    graph_rule::install(None);
    out
}

/// The experiment of `text` (read from `path` when given, which also
/// anchors its relative paths) with `overrides` applied.
fn load_config(
    text: &str,
    path: Option<&Path>,
    overrides: &[String],
) -> PyResult<ExperimentConfig> {
    match path {
        Some(p) => ExperimentConfig::from_file(p, overrides),
        None => ExperimentConfig::from_toml_str(text, overrides),
    }
    .map_err(err)
}

/// Runs an experiment; returns its directory. `text` is the config's TOML
/// (`path` the file it came from, for messages and relative paths), with
/// `overrides` (`dotted.key=value`) applied.
#[pyfunction]
#[pyo3(signature = (text, path=None, out=None, overrides=Vec::new(), overwrite=false, quiet=false, rule=None, on_round=None))]
#[allow(clippy::too_many_arguments)]
fn run(
    py: Python<'_>,
    text: String,
    path: Option<PathBuf>,
    out: Option<PathBuf>,
    overrides: Vec<String>,
    overwrite: bool,
    quiet: bool,
    rule: Option<Py<PyAny>>,
    on_round: Option<Py<PyAny>>,
) -> PyResult<String> {
    let cfg = load_config(&text, path.as_deref(), &overrides)?;
    let out = out.unwrap_or_else(|| fedweave_sim::default_out_dir(&cfg));
    fedweave_sim::claim_out_dir(&out, overwrite).map_err(err)?;
    let dir = out.clone();
    let progress = Progress::new(on_round, quiet);
    with_rule(rule, || {
        drive(py, &progress, move |tx| {
            fedweave_sim::run_experiment(&cfg, &dir, &mut sender(tx))
        })?
        .map_err(run_err)
    })?;
    Ok(out.display().to_string())
}

/// Continues the run in `dir` from its last checkpoint, to `rounds` rounds
/// if given.
#[pyfunction]
#[pyo3(signature = (dir, rounds=None, quiet=false, rule=None, on_round=None))]
fn resume(
    py: Python<'_>,
    dir: PathBuf,
    rounds: Option<usize>,
    quiet: bool,
    rule: Option<Py<PyAny>>,
    on_round: Option<Py<PyAny>>,
) -> PyResult<String> {
    if !fedweave_sim::is_run_dir(&dir) {
        return Err(run_err(RunError::NotARun { dir }));
    }
    let at = dir.clone();
    let progress = Progress::new(on_round, quiet);
    with_rule(rule, || {
        drive(py, &progress, move |tx| {
            fedweave_sim::resume_experiment(&at, rounds, &mut sender(tx))
        })?
        .map_err(run_err)
    })?;
    Ok(dir.display().to_string())
}

/// Serves the networked run of the config (as `fedweave serve`) on
/// `listen` in this process, with `rule` as its graph rule (a `graph-rule`
/// run: the rule runs here, where the server runs; clients are `fedweave
/// client` / `worker` processes); returns the run's directory.
#[pyfunction]
#[pyo3(signature = (text, listen, path=None, out=None, overrides=Vec::new(), resume=false, tokens=None, quiet=false, rule=None, on_round=None))]
#[allow(clippy::too_many_arguments)]
fn serve(
    py: Python<'_>,
    text: String,
    listen: &str,
    path: Option<PathBuf>,
    out: Option<PathBuf>,
    overrides: Vec<String>,
    resume: bool,
    tokens: Option<PathBuf>,
    quiet: bool,
    rule: Option<Py<PyAny>>,
    on_round: Option<Py<PyAny>>,
) -> PyResult<String> {
    let cfg = load_config(&text, path.as_deref(), &overrides)?;
    let listen: std::net::SocketAddr = listen.parse().map_err(|e| {
        err(format!(
            "listen: {listen:?} is not an address like 127.0.0.1:7070 ({e})"
        ))
    })?;
    let out = out.unwrap_or_else(|| fedweave_sim::default_out_dir(&cfg));
    let mut opts = fedweave_net::server::ServeOptions::new(cfg, listen, out.clone());
    opts.resume = resume;
    opts.tokens = tokens;
    let progress = Progress::new(on_round, quiet);
    with_rule(rule, || {
        drive(py, &progress, move |tx| {
            fedweave_net::server::serve(
                opts,
                |addr| eprintln!("listening on {addr}"),
                &mut sender(tx),
            )
        })?
        .map_err(err)
    })?;
    Ok(out.display().to_string())
}

/// Runs the sweep `grid` into `out` (`None`: next to the grid file) with
/// `jobs` runs at once, `rule` as the graph rule of its `graph-rule` runs;
/// returns the sweep's directory.
#[pyfunction]
#[pyo3(signature = (grid, out=None, jobs=1, quiet=false, rule=None))]
fn sweep(
    py: Python<'_>,
    grid: PathBuf,
    out: Option<PathBuf>,
    jobs: usize,
    quiet: bool,
    rule: Option<Py<PyAny>>,
) -> PyResult<String> {
    if jobs == 0 {
        return Err(err("jobs must be at least 1"));
    }
    let out = out.unwrap_or_else(|| fedweave_sweep::default_out(&grid));
    let opts = fedweave_sweep::ExecOptions {
        jobs,
        quiet,
        ..fedweave_sweep::ExecOptions::default()
    };
    let at = out.clone();
    with_rule(rule, || {
        drive(py, &Progress::Quiet, move |_| {
            fedweave_sweep::sweep(&grid, &at, &opts).map(|_| ())
        })?
        .map_err(err)
    })?;
    Ok(out.display().to_string())
}

/// One exported tensor: name, shape, dtype (`float32` / `int64`) and its
/// little-endian bytes.
type Tensor = (String, Vec<usize>, &'static str, Py<PyBytes>);

/// The kept models of the run in `dir` (`which` = `best` or `last`): for
/// every client that has one, its tensors under the names and shapes of
/// `fedweave export` (PyTorch's `state_dict`).
#[pyfunction]
#[pyo3(signature = (dir, which="best"))]
fn models(py: Python<'_>, dir: PathBuf, which: &str) -> PyResult<Vec<(usize, Vec<Tensor>)>> {
    let which = match which {
        "best" => Which::Best,
        "last" => Which::Last,
        other => {
            return Err(err(format!(
                "which must be \"best\" or \"last\", not {other:?}"
            )));
        }
    };
    let spec = ModelCard::read(&dir).map_err(err)?.spec().map_err(err)?;
    let clients = fedweave_sim::export::run_clients(&dir).map_err(err)?;
    let mut out = Vec::new();
    for i in 0..clients {
        if !fedweave_sim::models::model_path(&dir, which, i).is_file() {
            continue;
        }
        let kept = read_checked(&dir, which, i).map_err(err)?;
        let tensors = to_state_dict(&spec, &kept.model)
            .into_iter()
            .map(|t| {
                let (dtype, bytes): (&'static str, Vec<u8>) = match &t.data {
                    TorchData::F32(v) => {
                        ("float32", v.iter().flat_map(|x| x.to_le_bytes()).collect())
                    }
                    TorchData::I64(v) => {
                        ("int64", v.iter().flat_map(|x| x.to_le_bytes()).collect())
                    }
                };
                (t.name, t.shape, dtype, PyBytes::new(py, &bytes).unbind())
            })
            .collect();
        out.push((i, tensors));
    }
    Ok(out)
}

/// One client: benign, training, validation and test sizes, training
/// label counts.
type ClientRow = (bool, usize, usize, usize, Vec<usize>);

/// Per client of the run in `dir`: whether it is benign, its training,
/// validation and test sizes, and its training label counts (empty for
/// forecasting). Derived from the run's config as the run derived it.
#[pyfunction]
fn clients(py: Python<'_>, dir: PathBuf) -> PyResult<Vec<ClientRow>> {
    let cfg = ExperimentConfig::from_file(&dir.join("config.toml"), &[]).map_err(err)?;
    let rows = drive(py, &Progress::Quiet, move |_| -> Result<_, RunError> {
        let fed = Derived::load(&cfg)?;
        let env = fed.env();
        Ok((0..env.clients())
            .map(|i| {
                let data = fed.data(i);
                (
                    fed.is_benign(i),
                    data.train.len(),
                    data.val.len(),
                    fed.test_data(i).len(),
                    env.label_counts.get(i).cloned().unwrap_or_default(),
                )
            })
            .collect())
    })?;
    rows.map_err(run_err)
}

/// The model every client of the config starts from (θ_init of pFedGraph's
/// similarity), flat in the layout's order, as little-endian `f32` bytes.
#[pyfunction]
#[pyo3(signature = (text, path=None, overrides=Vec::new()))]
fn initial_model(
    py: Python<'_>,
    text: String,
    path: Option<PathBuf>,
    overrides: Vec<String>,
) -> PyResult<Py<PyBytes>> {
    let cfg = load_config(&text, path.as_deref(), &overrides)?;
    let init = drive(py, &Progress::Quiet, move |_| {
        Derived::load(&cfg).map(|fed| fed.env().init.to_vec())
    })?
    .map_err(run_err)?;
    let raw: Vec<u8> = init.iter().flat_map(|x| x.to_le_bytes()).collect();
    Ok(PyBytes::new(py, &raw).unbind())
}

/// The algorithms fedweave knows: (name, summary, reference).
#[pyfunction]
fn algorithms() -> Vec<(&'static str, &'static str, &'static str)> {
    fedweave_algos::catalogue()
        .iter()
        .map(|i| (i.name, i.summary, i.reference))
        .collect()
}

/// Whether `dir` holds a run.
#[pyfunction]
fn is_run_dir(dir: PathBuf) -> bool {
    fedweave_sim::is_run_dir(Path::new(&dir))
}

/// The extension module.
#[pymodule]
fn _fedweave(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("FedweaveError", m.py().get_type::<FedweaveError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(run, m)?)?;
    m.add_function(wrap_pyfunction!(resume, m)?)?;
    m.add_function(wrap_pyfunction!(sweep, m)?)?;
    m.add_function(wrap_pyfunction!(serve, m)?)?;
    m.add_function(wrap_pyfunction!(models, m)?)?;
    m.add_function(wrap_pyfunction!(clients, m)?)?;
    m.add_function(wrap_pyfunction!(algorithms, m)?)?;
    m.add_function(wrap_pyfunction!(initial_model, m)?)?;
    m.add_function(wrap_pyfunction!(is_run_dir, m)?)?;
    m.add_function(wrap_pyfunction!(servers::pfedgraph_step, m)?)?;
    m.add_function(wrap_pyfunction!(servers::feddwa_step, m)?)?;
    m.add_function(wrap_pyfunction!(servers::rule_mix, m)?)?;
    m.add_class::<servers::AghnServer>()?;
    Ok(())
}
