//! `fedweave bench`: how fast this machine trains the image models (one
//! client at a time over a thread pool, and K clients batched) and how long
//! the graph methods' server step takes at N clients. A table for people,
//! JSON Lines (`--json`, one object per measurement) for scripts.

use anyhow::Context;
use fedweave_algos::server_bench::{self, METHODS};
use fedweave_core::pairwise::Kernels;
use fedweave_nn::throughput::{self, CLASSES, SyntheticData, Workload};
use fedweave_nn::{Backend, BurnOffload, ModelKind, ModelSpec};
use serde::Deserialize;
use serde::de::IntoDeserializer;
use std::sync::Arc;

/// The models measured when `--model` is not given: the image models the
/// seed papers train.
const DEFAULT_MODELS: [&str; 6] = ["mlp", "cnn", "cnn-bn", "cnn-dwa", "resnet8", "resnet9"];

/// `fedweave bench`'s options.
#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// A model to train (repeat for several; default: mlp, cnn, cnn-bn,
    /// cnn-dwa, resnet8, resnet9). Images of the seeds' datasets: 1×28×28
    /// for mlp/cnn/cnn-bn, 3×32×32 for the others.
    #[arg(long = "model", value_name = "M")]
    models: Vec<String>,
    /// Threads training clients one at a time (default: every core).
    #[arg(long)]
    threads: Option<usize>,
    /// Samples per training step.
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// Clients per measurement (repeat for several). At K > 1 both K
    /// clients one at a time and K clients batched in one set of kernels
    /// are measured.
    #[arg(long = "k", value_name = "K", default_values_t = [1])]
    ks: Vec<usize>,
    /// Which of the two ways to train K clients to measure: `both`,
    /// `one-by-one` or `batched` (at K = 1 only one by one exists). One
    /// mode alone keeps a profiler's trace to that mode's kernels.
    #[arg(long, value_enum, default_value_t = Modes::Both)]
    mode: Modes,
    /// Seconds each measurement aims to take.
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// Where training and the server's products run: cpu, cuda or wgpu (a
    /// GPU needs a binary built with that feature).
    #[arg(long, default_value = "cpu")]
    backend: String,
    /// Also time the server step of fedavg, pfedgraph, feddwa and fedaghn
    /// at N clients of the first model's size (repeat for several N).
    #[arg(long = "server", value_name = "N")]
    server: Vec<usize>,
    /// Only the server step (with --server).
    #[arg(long)]
    no_train: bool,
    /// JSON Lines for scripts: one object per measurement, with `model`,
    /// `threads`, `batch`, `k` and `steps_per_s` (a server step counts as
    /// one step; its `k` is N).
    #[arg(long)]
    json: bool,
}

/// The training modes `--mode` selects.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Modes {
    /// K clients one at a time over the thread pool, and K batched.
    Both,
    /// K clients one at a time over the thread pool.
    OneByOne,
    /// K clients in one set of kernels (K > 1).
    Batched,
}

/// One measurement, as printed.
#[derive(serde::Serialize)]
struct Measurement {
    /// `train` or `server`.
    measure: &'static str,
    model: String,
    /// `one-by-one` or `batched` (training), the method (server).
    mode: String,
    backend: &'static str,
    threads: usize,
    /// Samples per step (training); absent for a server step.
    batch: Option<usize>,
    k: usize,
    /// Parameters of the model.
    d: usize,
    seconds: f64,
    steps_per_s: f64,
    /// Training samples per second (training only).
    samples_per_s: Option<f64>,
    /// Server step time over FedAvg's at the same N and d (server only).
    vs_fedavg: Option<f64>,
}

/// Parses a model name as the config does.
fn model_kind(name: &str) -> anyhow::Result<ModelKind> {
    let de: serde::de::value::StrDeserializer<serde::de::value::Error> = name.into_deserializer();
    ModelKind::deserialize(de).map_err(|_| {
        anyhow::anyhow!(fedweave_sim::suggest::unknown_name(
            "model",
            name,
            ModelKind::names()
        ))
    })
}

fn backend_of(name: &str) -> anyhow::Result<Backend> {
    let de: serde::de::value::StrDeserializer<serde::de::value::Error> = name.into_deserializer();
    Backend::deserialize(de).map_err(|_| {
        anyhow::anyhow!(fedweave_sim::suggest::unknown_name(
            "backend",
            name,
            &["cpu", "cuda", "wgpu"]
        ))
    })
}

/// Runs `fedweave bench`.
pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.batch > 0, "--batch must be at least 1");
    anyhow::ensure!(args.ks.iter().all(|&k| k > 0), "--k must be at least 1");
    anyhow::ensure!(
        args.seconds.is_finite() && args.seconds > 0.0,
        "--seconds must be a positive number, got {}",
        args.seconds
    );
    anyhow::ensure!(
        args.server.iter().all(|&n| n >= 2),
        "--server N needs at least 2 clients"
    );
    anyhow::ensure!(
        !args.no_train || !args.server.is_empty(),
        "--no-train leaves nothing to measure without --server N"
    );
    let names: Vec<String> = if args.models.is_empty() {
        DEFAULT_MODELS.iter().map(|s| s.to_string()).collect()
    } else {
        args.models.clone()
    };
    let mut specs = Vec::new();
    let backend = backend_of(&args.backend)?;
    let device = backend.device()?;
    for name in &names {
        let kind = model_kind(name)?;
        let shape = throughput::bench_input(kind).ok_or_else(|| {
            anyhow::anyhow!("`fedweave bench` measures image classifiers; `{name}` is not one")
        })?;
        let spec = ModelSpec::new(kind, &shape, CLASSES)?.on(device.clone());
        specs.push((name.clone(), spec));
    }
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    anyhow::ensure!(threads > 0, "--threads must be at least 1");
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .context("cannot start the thread pool")?;
    let mut out = Printer::new(args.json);
    if !args.no_train {
        for (name, spec) in &specs {
            for &k in &args.ks {
                train(&mut out, name, spec, backend, &pool, threads, k, &args)?;
            }
        }
    }
    for &n in &args.server {
        let (name, spec) = &specs[0];
        pool.install(|| server(&mut out, name, spec, backend, threads, n))?;
    }
    Ok(())
}

/// Times K clients of one model: one by one over the pool, and batched when
/// K > 1 (K = 1 batched is the same work as one client).
#[allow(clippy::too_many_arguments)]
fn train(
    out: &mut Printer,
    name: &str,
    spec: &ModelSpec,
    backend: Backend,
    pool: &rayon::ThreadPool,
    threads: usize,
    k: usize,
    args: &BenchArgs,
) -> anyhow::Result<()> {
    let data = SyntheticData::new(spec.input_len(), k.min(10), 0);
    // A two-step probe of one client sizes the run to about --seconds.
    let probe = Workload {
        spec,
        data: &data,
        k: 1,
        batch: args.batch,
    }
    .time_one_by_one(2, pool);
    let steps = throughput::steps_for(args.seconds * threads.min(k) as f64, probe.seconds, 2, k);
    let work = Workload {
        spec,
        data: &data,
        k,
        batch: args.batch,
    };
    let d = spec.layout().len();
    let row = |mode: &str, threads: usize, t: throughput::Timed| Measurement {
        measure: "train",
        model: name.to_string(),
        mode: mode.to_string(),
        backend: backend.name(),
        threads,
        batch: Some(args.batch),
        k,
        d,
        seconds: t.seconds,
        steps_per_s: t.steps_per_s(),
        samples_per_s: Some(t.steps_per_s() * args.batch as f64),
        vs_fedavg: None,
    };
    if args.mode != Modes::Batched || k == 1 {
        out.print(row(
            "one-by-one",
            threads,
            work.time_one_by_one(steps, pool),
        ));
    }
    if k > 1 && args.mode != Modes::OneByOne {
        // A batched step is not K one-client steps: a probe of the batched
        // pass itself (long enough to be replayed from a graph on a GPU)
        // sizes its run.
        let steps = work
            .time_batched(BATCHED_PROBE_STEPS)
            .map(|p| throughput::steps_for(args.seconds, p.seconds, BATCHED_PROBE_STEPS, 1));
        match steps.and_then(|steps| work.time_batched(steps)) {
            // The batched pass runs its kernels on the calling thread.
            Ok(t) => out.print(row("batched", 1, t)),
            Err(e) => out.note(&format!("{name}, K = {k}: no batched pass ({e})")),
        }
    }
    Ok(())
}

/// Steps of the probe that sizes a batched run.
const BATCHED_PROBE_STEPS: usize = 10;

/// Times each method's server step at N clients of `spec`'s size.
fn server(
    out: &mut Printer,
    name: &str,
    spec: &ModelSpec,
    backend: Backend,
    threads: usize,
    n: usize,
) -> anyhow::Result<()> {
    let kernels = match backend {
        Backend::Cpu => Kernels::cpu().clone(),
        other => Kernels::offloaded(Arc::new(BurnOffload::new(other)?), 0.0),
    };
    let fed = server_bench::Federation::new(spec, n);
    let env = fed.env(spec, &kernels);
    let init = &fed.init;
    // Big cases once: at N·d ≥ 10⁸ a round is seconds and the warm-up alone
    // is a faithful figure's worth of work.
    let repeats = if n * init.len() >= 100_000_000 { 1 } else { 3 };
    let mut fedavg = None;
    for method in METHODS {
        let t = server_bench::time_method(method, &env, repeats).expect("METHODS are all timed");
        if method == "fedavg" {
            fedavg = Some(t.seconds);
        }
        out.print(Measurement {
            measure: "server",
            model: name.to_string(),
            mode: method.to_string(),
            backend: backend.name(),
            threads,
            batch: None,
            k: n,
            d: init.len(),
            seconds: t.seconds,
            steps_per_s: 1.0 / t.seconds,
            samples_per_s: None,
            vs_fedavg: fedavg.map(|f| t.seconds / f),
        });
    }
    Ok(())
}

/// Prints measurements as they finish: a markdown table or JSON Lines.
struct Printer {
    json: bool,
    header: Option<&'static str>,
}

impl Printer {
    fn new(json: bool) -> Self {
        Self { json, header: None }
    }

    fn print(&mut self, m: Measurement) {
        if self.json {
            println!(
                "{}",
                serde_json::to_string(&m).expect("a measurement serialises")
            );
            return;
        }
        if self.header != Some(m.measure) {
            self.header = Some(m.measure);
            if m.measure == "train" {
                println!(
                    "\n| model | backend | mode | threads | batch | K | client-steps/s | samples/s |"
                );
                println!("|---|---|---|---:|---:|---:|---:|---:|");
            } else {
                println!(
                    "\n| server step | model | d | backend | threads | N | seconds | × fedavg |"
                );
                println!("|---|---|---:|---|---:|---:|---:|---:|");
            }
        }
        if m.measure == "train" {
            println!(
                "| {} | {} | {} | {} | {} | {} | {:.1} | {:.0} |",
                m.model,
                m.backend,
                m.mode,
                m.threads,
                m.batch.unwrap_or(0),
                m.k,
                m.steps_per_s,
                m.samples_per_s.unwrap_or(0.0)
            );
        } else {
            println!(
                "| {} | {} | {} | {} | {} | {} | {:.3} | {:.2} |",
                m.mode,
                m.model,
                m.d,
                m.backend,
                m.threads,
                m.k,
                m.seconds,
                m.vs_fedavg.unwrap_or(f64::NAN)
            );
        }
    }

    fn note(&self, text: &str) {
        eprintln!("note: {text}");
    }
}
