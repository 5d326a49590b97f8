//! `fedweave`: personalized federated learning with collaboration graphs.

/// mimalloc, which hands a freed model-sized block to the next allocation
/// instead of returning it to the kernel: with glibc's malloc every model
/// copy of a round (uploads, mixes, downloads, kept models: ~1 MB each) was
/// a fresh mapping, zeroed page by page by the kernel — a quarter to half of
/// FedAvg's round at N = 500 (docs/results.md "The allocator").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Tunes mimalloc for a round's many model-sized blocks: freed memory is
/// kept for reuse, not returned to the kernel, while the process runs (each
/// round reuses the last round's blocks, and a returned block pays its page
/// faults again; mimalloc v3 counts a purge delay from the first free of an
/// arena's batch, not the last, so a 10 s delay still returned blocks freed
/// a moment before: 36,000–48,000 page faults per pFedGraph round at
/// N = 500, ~5,000 without purging; docs/results.md "Freed memory kept"),
/// and arenas are reserved 64 MiB at a time without eager commit (1 GiB
/// eagerly committed arenas cost FedAvg's first round at N = 500 1.3 s).
///
/// The options are named by their index in the `mi_option_e` of the
/// mimalloc `mimalloc` =0.1.52 builds (v3; the crate's constants stop
/// before them). Each is set only where its `MIMALLOC_*` variable is unset
/// and it still holds that version's default, so another version's
/// numbering leaves the allocator untuned rather than mis-set.
fn tune_allocator() {
    // (index, variable, v3's default, fedweave's value)
    const OPTIONS: [(libmimalloc_sys::mi_option_t, &str, i64, i64); 3] = [
        (15, "MIMALLOC_PURGE_DELAY", 1_000, -1),
        (4, "MIMALLOC_ARENA_EAGER_COMMIT", 2, 0),
        (23, "MIMALLOC_ARENA_RESERVE", 1 << 20, 64 << 10),
    ];
    for (option, variable, default, value) in OPTIONS {
        // SAFETY: reads and sets one option of the process's allocator,
        // which mimalloc allows at any time.
        unsafe {
            if std::env::var_os(variable).is_none()
                && libmimalloc_sys::mi_option_get(option) as i64 == default
            {
                libmimalloc_sys::mi_option_set(option, value as _);
            }
        }
    }
}

mod bench;
mod init;
mod models;

use anyhow::Context;
use clap::{Parser, Subcommand};
use fedweave_sim::{
    ExperimentConfig, RoundRecord, RunError, Summary, resume_experiment, run_experiment,
};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(
    name = "fedweave",
    version,
    about = "Personalized federated learning with collaboration graphs"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// No progress display (warnings and errors still show).
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    quiet: bool,
    /// More log lines: -v for each round's events, -vv for debugging.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
}

#[derive(Subcommand)]
enum Command {
    /// Run one experiment from a TOML config.
    Run {
        /// The experiment config.
        config: PathBuf,
        /// Output directory (default: a fresh directory under runs/).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Replace the run already in --out (otherwise refused).
        #[arg(long)]
        overwrite: bool,
        /// Override a config key by its dotted path, e.g. `--set rounds=5`.
        #[arg(long = "set", value_name = "KEY=VALUE")]
        set: Vec<String>,
    },
    /// Continue a run from its last checkpoint (DIR/checkpoint/).
    Resume {
        /// The run directory.
        dir: PathBuf,
        /// Run up to this many rounds (more than configured extends the run).
        #[arg(long)]
        rounds: Option<usize>,
    },
    /// List algorithms, datasets, partitions, models, attacks and aggregators.
    List {
        /// One JSON object (name → description lists) for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Print a commented configuration that runs (digits with fedavg by
    /// default); `fedweave init > exp.toml`.
    Init {
        /// The algorithm (see `fedweave list`).
        #[arg(long, default_value = "fedavg")]
        algorithm: String,
        /// The dataset (see `fedweave list`).
        #[arg(long, default_value = "digits")]
        dataset: String,
        /// Write it to this file instead of printing it (an existing file
        /// is refused).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Print the resolved configuration (every default filled in, the
    /// algorithm's parameters too) without running anything.
    Config {
        /// The experiment config.
        config: PathBuf,
        /// Override a config key by its dotted path.
        #[arg(long = "set", value_name = "KEY=VALUE")]
        set: Vec<String>,
    },
    /// Measure this machine: training steps/s per model (one client at a
    /// time and K batched) and the graph methods' server step at N clients.
    Bench(bench::BenchArgs),
    /// Print a shell completion script: `fedweave completions bash >
    /// ~/.local/share/bash-completion/completions/fedweave`.
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
    /// Write clients' kept models (best-validation or last) as PyTorch
    /// state_dicts in safetensors files, one per client, with model.json.
    Export(models::ExportArgs),
    /// Classify samples (.npy or .csv) with a client's kept model: one
    /// class per line.
    Predict(models::PredictArgs),
    /// Rebuild DIR/report.html from a run directory.
    Report {
        /// The run directory.
        dir: PathBuf,
    },
    /// Run a grid of experiments over seeds; rerunning skips finished runs.
    Sweep(fedweave_sweep::SweepArgs),
    /// Tables and a comparison page from existing run directories.
    Compare(fedweave_sweep::CompareArgs),
    /// Write TensorBoard event files (DIR/tensorboard/) for finished runs;
    /// a sweep directory exports every run under it.
    Tensorboard {
        /// Run directories, or folders holding them.
        dirs: Vec<PathBuf>,
    },
    /// Serve a networked run: clients train on their own machines.
    Serve {
        /// The experiment config (the clients use the same file).
        config: PathBuf,
        /// Address to listen on, e.g. 0.0.0.0:7070.
        #[arg(long)]
        listen: std::net::SocketAddr,
        /// Output directory (default: a fresh directory under runs/).
        #[arg(long)]
        out: Option<PathBuf>,
        /// TLS certificate (PEM), e.g. from `fedweave certs`.
        #[arg(long, requires = "tls_key")]
        tls_cert: Option<PathBuf>,
        /// TLS private key (PEM).
        #[arg(long, requires = "tls_cert")]
        tls_key: Option<PathBuf>,
        /// File of `id token` lines: clients must present their token (a
        /// token may be stored as `sha256:HEX`).
        #[arg(long)]
        tokens: Option<PathBuf>,
        /// CA certificate (PEM) clients' certificates must chain to: mutual
        /// TLS, each client presenting one for its id (`certs --clients N`).
        #[arg(long, requires = "tls_cert")]
        client_ca: Option<PathBuf>,
        /// Allow a non-loopback address without TLS or client credentials.
        #[arg(long)]
        insecure: bool,
        /// Continue the run in --out from its last checkpoint.
        #[arg(long, requires = "out")]
        resume: bool,
        /// Seconds of silence after which a client's id may be claimed again.
        #[arg(long, default_value_t = 30.0)]
        session_timeout: f64,
        /// Seconds one request (an upload included) may take.
        #[arg(long, default_value_t = 120.0)]
        request_timeout: f64,
        /// Most samples a client whose data the server cannot derive (csv)
        /// may claim in one split.
        #[arg(long, default_value_t = fedweave_sim::runtime::DEFAULT_MAX_CLIENT_SAMPLES)]
        max_client_samples: usize,
        /// Override a config key by its dotted path.
        #[arg(long = "set", value_name = "KEY=VALUE")]
        set: Vec<String>,
    },
    /// Run one client of a networked run on its own data.
    Client {
        /// The experiment config (the same as the server's).
        config: PathBuf,
        /// The server, e.g. http://host:7070 (https:// with TLS).
        #[arg(long)]
        connect: String,
        /// This client's id.
        #[arg(long)]
        id: usize,
        #[command(flatten)]
        common: ClientArgs,
    },
    /// Host many clients of a networked run in one process.
    Worker {
        /// The experiment config (the same as the server's).
        config: PathBuf,
        /// The server, e.g. http://host:7070 (https:// with TLS).
        #[arg(long)]
        connect: String,
        /// The client ids hosted: A..B (B excluded).
        #[arg(long)]
        ids: String,
        #[command(flatten)]
        common: ClientArgs,
    },
    /// Run one peer of a peer-to-peer method (DPFL): no server.
    Peer {
        /// The experiment config (every peer runs the same file).
        config: PathBuf,
        /// This peer's client id.
        #[arg(long)]
        id: usize,
        /// Address to listen on, e.g. 0.0.0.0:7071.
        #[arg(long)]
        listen: std::net::SocketAddr,
        /// File of `id url` lines: where every peer listens.
        #[arg(long)]
        peers: PathBuf,
        /// Where peer-I.json goes (default: runs/peers).
        #[arg(long, default_value = "runs/peers")]
        out: PathBuf,
        /// TLS certificate (PEM) this peer presents.
        #[arg(long, requires = "tls_key")]
        tls_cert: Option<PathBuf>,
        /// TLS private key (PEM).
        #[arg(long, requires = "tls_cert")]
        tls_key: Option<PathBuf>,
        /// CA certificate (PEM) the other peers are verified with.
        #[arg(long)]
        ca: Option<PathBuf>,
        /// CA certificate (PEM) fetching peers' certificates must chain to
        /// (mutual TLS; `certs --peers N`, each peer's --tls-cert).
        #[arg(long, requires = "tls_cert")]
        client_ca: Option<PathBuf>,
        /// File of `id token` lines: the peers allowed to fetch from this
        /// one (a token may be stored as `sha256:HEX`).
        #[arg(long)]
        tokens: Option<PathBuf>,
        /// This peer's token, presented when it fetches.
        #[arg(long)]
        token: Option<String>,
        /// Allow a non-loopback address without TLS or peer credentials.
        #[arg(long)]
        insecure: bool,
        /// Override a config key by its dotted path.
        #[arg(long = "set", value_name = "KEY=VALUE")]
        set: Vec<String>,
    },
    /// Write a CA and a server/peer certificate for TLS (private keys
    /// mode 0600), and client or peer certificates for mutual TLS.
    Certs {
        /// Output directory.
        #[arg(long)]
        out: PathBuf,
        /// Host names and IP addresses the certificate is valid for.
        #[arg(long, num_args = 1..)]
        hosts: Vec<String>,
        /// Also write client-I.pem/.key for clients 0..N (serve --client-ca).
        #[arg(long, default_value_t = 0)]
        clients: usize,
        /// Also write peer-I.pem/.key for peers 0..N (peer --client-ca).
        #[arg(long, default_value_t = 0)]
        peers: usize,
    },
}

/// Options shared by `client` and `worker`.
#[derive(clap::Args)]
struct ClientArgs {
    /// The token the server expects for this client (or these clients).
    #[arg(long)]
    token: Option<String>,
    /// CA certificate (PEM) to verify the server's TLS certificate
    /// (needs an https:// URL).
    #[arg(long)]
    ca: Option<PathBuf>,
    /// Client certificate (PEM) for a server with --client-ca; `{id}` in
    /// the path stands for each hosted id.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// Its private key (PEM); `{id}` as for --tls-cert.
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Directory where each client checkpoints its own state.
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// Seconds to keep retrying an unreachable server.
    #[arg(long, default_value_t = 120.0)]
    retry_for: f64,
    /// Override a config key by its dotted path.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
}

impl ClientArgs {
    fn options(
        self,
        config: &std::path::Path,
        connect: String,
        ids: Vec<usize>,
    ) -> anyhow::Result<fedweave_net::client::ClientOptions> {
        let cfg = ExperimentConfig::from_file(config, &self.set)?;
        let mut o = fedweave_net::client::ClientOptions::new(cfg, connect, ids);
        o.token = self.token;
        o.ca = self.ca;
        o.identity = self.tls_cert.zip(self.tls_key);
        o.state_dir = self.state_dir;
        o.retry_for = seconds(self.retry_for)?;
        Ok(o)
    }
}

fn seconds(s: f64) -> anyhow::Result<std::time::Duration> {
    std::time::Duration::try_from_secs_f64(s)
        .map_err(|_| anyhow::anyhow!("not a number of seconds: {s}"))
}

/// `A..B` → A, A+1, ..., B−1.
fn parse_ids(text: &str) -> anyhow::Result<Vec<usize>> {
    let (a, b) = text
        .split_once("..")
        .ok_or_else(|| anyhow::anyhow!("--ids must look like A..B, got `{text}`"))?;
    let (a, b): (usize, usize) = (a.trim().parse()?, b.trim().parse()?);
    anyhow::ensure!(a < b, "--ids {text}: empty range");
    Ok((a..b).collect())
}

fn main() -> ExitCode {
    tune_allocator();
    let cli = Cli::parse();
    let level = match (cli.quiet, cli.verbose) {
        (true, _) => "error",
        (false, 0) => "warn",
        (false, 1) => "info",
        _ => "debug",
    };
    QUIET.store(cli.quiet, Ordering::SeqCst);
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| level.into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none())
        .init();
    match real_main(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if interrupted(&e) => {
            eprintln!("{}", error_text(&e));
            ExitCode::from(130)
        }
        Err(e) => {
            eprintln!("error: {}", error_text(&e));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes, each said once (an error whose message already
/// quotes its cause does not get the cause repeated).
fn error_text(e: &anyhow::Error) -> String {
    if let Some(stop) = e.chain().find_map(|c| match c.downcast_ref::<RunError>() {
        Some(r @ RunError::Interrupted { .. }) => Some(r.to_string()),
        _ => None,
    }) {
        return stop;
    }
    let mut text = e.to_string();
    for cause in e.chain().skip(1) {
        let c = cause.to_string();
        if !text.contains(&c) {
            text.push_str(": ");
            text.push_str(&c);
        }
    }
    text
}

/// Whether `e` is a run or sweep stopped by SIGINT/SIGTERM.
fn interrupted(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        matches!(c.downcast_ref(), Some(RunError::Interrupted { .. }))
            || matches!(
                c.downcast_ref(),
                Some(fedweave_sweep::SweepError::Interrupted { .. })
            )
    })
}

/// SIGINT and SIGTERM ask the runs of this process to stop after their
/// current round ([`fedweave_sim::interrupt`]); a second one exits at once.
fn stop_on_signals() -> anyhow::Result<()> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let flag = fedweave_sim::stop_flag();
    for sig in [SIGINT, SIGTERM] {
        // Registered first, so it sees the flag before this signal sets it.
        signal_hook::flag::register_conditional_shutdown(sig, 130, Arc::clone(&flag))?;
        signal_hook::flag::register(sig, Arc::clone(&flag))?;
    }
    std::thread::spawn(move || {
        while !flag.load(Ordering::SeqCst) {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        eprintln!("stopping after the current round (press Ctrl-C again to quit at once)");
    });
    Ok(())
}

fn real_main(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Run {
            config,
            out,
            overwrite,
            set,
        } => {
            let cfg = ExperimentConfig::from_file(&config, &set)?;
            let out = out.unwrap_or_else(|| fedweave_sim::default_out_dir(&cfg));
            fedweave_sim::claim_out_dir(&out, overwrite).map_err(anyhow::Error::msg)?;
            warn_config(&cfg);
            stop_on_signals()?;
            let summary = with_progress(cfg.rounds, |on_round| {
                run_experiment(&cfg, &out, on_round)
                    .with_context(|| format!("run of {} failed", config.display()))
            })?;
            print_summary(&summary, &out);
            Ok(())
        }
        Command::Resume { dir, rounds } => {
            if !fedweave_sim::is_run_dir(&dir) {
                return Err(RunError::NotARun { dir }.into());
            }
            let total = match rounds {
                Some(r) => r,
                None => ExperimentConfig::from_file(&dir.join("config.toml"), &[])?.rounds,
            };
            stop_on_signals()?;
            let summary = with_progress(total, |on_round| {
                resume_experiment(&dir, rounds, on_round).map_err(|e| match e {
                    e @ RunError::Finished { .. } => anyhow::Error::from(e),
                    e => anyhow::Error::from(e)
                        .context(format!("resume of {} failed", dir.display())),
                })
            })?;
            print_summary(&summary, &dir);
            Ok(())
        }
        Command::List { json } => {
            if json {
                println!("{}", list_json());
            } else {
                list();
            }
            Ok(())
        }
        Command::Init {
            algorithm,
            dataset,
            out,
        } => {
            let text = init::template(&algorithm, &dataset);
            // The template must name known things and parse: the same
            // checks as `run`, with "did you mean" for a typo.
            ExperimentConfig::from_toml_str(&text, &[])?;
            match out {
                None => print!("{text}"),
                Some(path) => {
                    anyhow::ensure!(
                        !path.exists(),
                        "{} exists; choose another file",
                        path.display()
                    );
                    std::fs::write(&path, &text)
                        .with_context(|| format!("cannot write {}", path.display()))?;
                    eprintln!(
                        "wrote {} — `fedweave run {}` runs it",
                        path.display(),
                        path.display()
                    );
                }
            }
            Ok(())
        }
        Command::Config { config, set } => {
            let mut cfg = ExperimentConfig::from_file(&config, &set)?;
            let name = cfg.algorithm_name().to_string();
            let mut resolved =
                fedweave_algos::check_params(&name, &cfg.algorithm_params(), cfg.clients)?;
            resolved.insert("name".into(), name.into());
            cfg.algorithm = resolved;
            print!("{}", cfg.to_toml());
            Ok(())
        }
        Command::Bench(args) => bench::run(args),
        Command::Completions { shell } => {
            use clap::CommandFactory;
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "fedweave",
                &mut std::io::stdout(),
            );
            Ok(())
        }
        Command::Export(args) => models::run_export(args),
        Command::Predict(args) => models::run_predict(args),
        Command::Report { dir } => {
            let path = fedweave_report::write_report(&dir)?;
            println!("{}", path.display());
            Ok(())
        }
        Command::Sweep(args) => {
            stop_on_signals()?;
            Ok(fedweave_sweep::run_sweep_command(
                &args,
                QUIET.load(Ordering::SeqCst),
            )?)
        }
        Command::Compare(args) => Ok(fedweave_sweep::run_compare_command(&args)?),
        Command::Tensorboard { dirs } => {
            let mut runs = Vec::new();
            for d in &dirs {
                find_runs(d, &mut runs)?;
            }
            anyhow::ensure!(
                !runs.is_empty(),
                "no run directory (one holding summary.json) under {}",
                dirs.iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            for run in runs {
                println!("{}", export_tensorboard(&run)?.display());
            }
            Ok(())
        }
        Command::Serve {
            config,
            listen,
            out,
            tls_cert,
            tls_key,
            tokens,
            client_ca,
            insecure,
            resume,
            session_timeout,
            request_timeout,
            max_client_samples,
            set,
        } => {
            let cfg = ExperimentConfig::from_file(&config, &set)?;
            let out = out.unwrap_or_else(|| fedweave_sim::default_out_dir(&cfg));
            let rounds = cfg.rounds;
            let mut opts = fedweave_net::server::ServeOptions::new(cfg, listen, out.clone());
            opts.tls = tls_cert.zip(tls_key);
            opts.tokens = tokens;
            opts.client_ca = client_ca;
            opts.insecure = insecure;
            opts.resume = resume;
            opts.session_timeout = seconds(session_timeout)?;
            opts.request_timeout = seconds(request_timeout)?;
            opts.max_client_samples = max_client_samples;
            let summary = with_progress(rounds, |on_round| {
                fedweave_net::server::serve(opts, |addr| eprintln!("listening on {addr}"), on_round)
                    .context("serve failed")
            })?;
            print_summary(&summary, &out);
            Ok(())
        }
        Command::Client {
            config,
            connect,
            id,
            common,
        } => Ok(fedweave_net::client::run_clients(common.options(
            &config,
            connect,
            vec![id],
        )?)?),
        Command::Worker {
            config,
            connect,
            ids,
            common,
        } => Ok(fedweave_net::client::run_clients(common.options(
            &config,
            connect,
            parse_ids(&ids)?,
        )?)?),
        Command::Peer {
            config,
            id,
            listen,
            peers,
            out,
            tls_cert,
            tls_key,
            ca,
            client_ca,
            tokens,
            token,
            insecure,
            set,
        } => {
            let mut opts = fedweave_net::peer::PeerOptions::new(
                ExperimentConfig::from_file(&config, &set)?,
                id,
                listen,
                fedweave_net::peer::read_peers(&peers)?,
                out.clone(),
            );
            opts.tls = tls_cert.zip(tls_key);
            opts.ca = ca;
            opts.client_ca = client_ca;
            opts.tokens = tokens;
            opts.token = token;
            opts.insecure = insecure;
            let report =
                fedweave_net::peer::run_peer(opts, |a| eprintln!("peer {id} listening on {a}"))?;
            println!(
                "peer {id} ({}): test acc {:.2}% at its best validation round {}; {}",
                report.algorithm,
                100.0 * report.best_test_acc,
                report.best_round,
                out.join(format!("peer-{id}.json")).display()
            );
            Ok(())
        }
        Command::Certs {
            out,
            hosts,
            clients,
            peers,
        } => {
            let files = fedweave_net::certs::generate(&out, &hosts, clients, peers)?;
            println!(
                "CA {} (clients: --ca), certificate {} and key {} (server: --tls-cert/--tls-key)",
                files.ca.display(),
                files.cert.display(),
                files.key.display()
            );
            if clients > 0 {
                println!(
                    "client certificates {}/client-I.pem with client-I.key, I in 0..{clients} (client: --tls-cert/--tls-key; server: --client-ca {})",
                    out.display(),
                    files.ca.display()
                );
            }
            if peers > 0 {
                println!(
                    "peer certificates {}/peer-I.pem with peer-I.key, I in 0..{peers} (peer: --tls-cert/--tls-key --ca/--client-ca {})",
                    out.display(),
                    files.ca.display()
                );
            }
            Ok(())
        }
    }
}

/// Run directories at or under `dir`, in name order.
fn find_runs(dir: &std::path::Path, runs: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    if dir.join("summary.json").is_file() {
        runs.push(dir.to_path_buf());
        return Ok(());
    }
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot read {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    entries.sort();
    for e in entries {
        find_runs(&e, runs)?;
    }
    Ok(())
}

/// Writes one finished run's event file. The rounds carry durations but
/// no clock times, so round r is stamped at the time `rounds.jsonl` was
/// last written minus the seconds of the rounds after r.
fn export_tensorboard(dir: &std::path::Path) -> anyhow::Result<PathBuf> {
    let run = fedweave_report::RunFiles::read(dir)?;
    let written = std::fs::metadata(dir.join("rounds.jsonl"))
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0.0, |d| d.as_secs_f64());
    let total: f64 = run.rounds.iter().map(|r| r.seconds).sum();
    let path = fedweave_records::tensorboard::write_run(dir, &run.rounds, written - total)?;
    Ok(path)
}

/// Set by `--quiet`: no progress display (warnings and errors still show).
static QUIET: AtomicBool = AtomicBool::new(false);

/// How long a round may run without a word on a non-terminal stderr: 10 s,
/// or `FEDWEAVE_PROGRESS_SECONDS`.
fn in_round_every() -> Duration {
    std::env::var("FEDWEAVE_PROGRESS_SECONDS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .unwrap_or(Duration::from_secs(10))
}

/// Runs `job` with a progress bar on a terminal (one line per round
/// otherwise) over `rounds` rounds: each round's accuracy, elapsed time and
/// ETA, and inside a round the clients that have finished training (on a
/// terminal live, otherwise a line every 10 s of a long round).
fn with_progress(
    rounds: usize,
    job: impl FnOnce(&mut dyn FnMut(&RoundRecord)) -> anyhow::Result<Summary>,
) -> anyhow::Result<Summary> {
    let quiet = QUIET.load(Ordering::SeqCst);
    let started = Instant::now();
    let bar = (!quiet && std::io::stderr().is_terminal()).then(|| {
        let bar = ProgressBar::new(rounds as u64);
        bar.set_style(
            ProgressStyle::with_template(
                "{spinner} round {pos}/{len} [{bar:30}] {msg} {prefix} ({elapsed}, ETA {eta})",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        bar.enable_steady_tick(Duration::from_millis(200));
        bar
    });
    // The round under way: when the last one ended, and which it was.
    let last = Arc::new(std::sync::Mutex::new((Instant::now(), 0usize)));
    let done = Arc::new(AtomicBool::new(false));
    let ticker = (!quiet).then(|| {
        let (bar, last, done) = (bar.clone(), Arc::clone(&last), Arc::clone(&done));
        let every = in_round_every();
        std::thread::spawn(move || {
            let mut said = Instant::now();
            while !done.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(50));
                let p = fedweave_sim::progress::current();
                let (since, prev) = *last.lock().unwrap_or_else(|e| e.into_inner());
                let inside = p.round == prev + 1 && p.participants > 0;
                match &bar {
                    Some(b) if inside => {
                        b.set_prefix(format!("· clients {}/{}", p.trained, p.participants));
                    }
                    Some(b) => b.set_prefix(""),
                    None if inside && since.elapsed() >= every && said.elapsed() >= every => {
                        said = Instant::now();
                        eprintln!(
                            "round {:>4}/{rounds}  {}/{} clients trained, {} into the round",
                            p.round,
                            p.trained,
                            p.participants,
                            fedweave_report::fmt::human_seconds(since.elapsed().as_secs_f64())
                        );
                    }
                    None => {}
                }
            }
        })
    });
    let mut all_rejected = Vec::new();
    let mut first: Option<(usize, Instant)> = None;
    let mut on_round = |r: &RoundRecord| {
        *last.lock().unwrap_or_else(|e| e.into_inner()) = (Instant::now(), r.round);
        if !r.participants.is_empty() && r.rejected.len() >= r.participants.len() {
            all_rejected.push(r.round);
            let line = format!(
                "WARNING: round {}: every upload was rejected (non-finite or malformed updates; is the learning rate too high?) — no client learned from the others",
                r.round
            );
            match &bar {
                Some(b) => b.println(line),
                None => eprintln!("{line}"),
            }
        }
        if quiet {
            return;
        }
        let msg = match (r.mean_val_acc, r.mean_test_acc) {
            (Some(v), Some(t)) => format!("val acc {v:.4}  test acc {t:.4}"),
            _ => format!(
                "val MAE {:.4}  test MAE {:.4}",
                r.mean_val_mae.unwrap_or(f64::NAN),
                r.mean_test_mae.unwrap_or(f64::NAN)
            ),
        };
        // The ETA from the rounds of this session (a resumed run starts
        // counting at its checkpoint).
        let (first_round, t0) = *first.get_or_insert((r.round - 1, started));
        let per_round = t0.elapsed().as_secs_f64() / (r.round - first_round).max(1) as f64;
        let eta = per_round * rounds.saturating_sub(r.round) as f64;
        match &bar {
            Some(b) => {
                if b.position() == 0 && r.round > 1 {
                    b.reset_eta();
                }
                b.set_position(r.round as u64);
                b.set_message(msg);
            }
            None => eprintln!(
                "round {:>4}/{rounds}  {msg}  {} elapsed  ETA {}",
                r.round,
                fedweave_report::fmt::human_seconds(started.elapsed().as_secs_f64()),
                fedweave_report::fmt::human_seconds(eta)
            ),
        }
    };
    let result = job(&mut on_round);
    done.store(true, Ordering::SeqCst);
    if let Some(t) = ticker {
        let _ = t.join();
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    if !all_rejected.is_empty() {
        eprintln!(
            "WARNING: every upload was rejected in {} round(s) (round {}); these results mean little",
            all_rejected.len(),
            list_rounds(&all_rejected)
        );
    }
    result
}

/// `1, 2, 3, …` for at most ten rounds.
fn list_rounds(rounds: &[usize]) -> String {
    let mut text: Vec<String> = rounds.iter().take(10).map(ToString::to_string).collect();
    if rounds.len() > 10 {
        text.push("…".into());
    }
    text.join(", ")
}

/// Loud warnings for configurations that run but mean little.
fn warn_config(cfg: &ExperimentConfig) {
    if cfg.clients == 1 {
        eprintln!(
            "WARNING: clients = 1: a federation of one client has no one to learn from; the results are those of local training"
        );
    }
}

fn print_summary(summary: &Summary, out: &std::path::Path) {
    let pct = |x: Option<f64>| x.map_or("n/a".to_string(), |v| format!("{:.2}%", 100.0 * v));
    if let Some(mae) = summary.mean_test_mae {
        let unit = fedweave_report::fmt::error_unit(&summary.dataset)
            .map_or(String::new(), |u| format!(" {u}"));
        let num = |x: Option<f64>| x.map_or("n/a".to_string(), |v| format!("{v:.4}{unit}"));
        let mape = summary
            .mean_test_mape
            .map_or("n/a".to_string(), |v| format!("{v:.4}%"));
        println!(
            "{} on {} ({} clients, {} rounds): mean test MAE {} / RMSE {} / MAPE {} (best-validation), last round MAE {}, {:.1}s",
            summary.algorithm,
            summary.dataset,
            summary.clients,
            summary.rounds,
            num(Some(mae)),
            num(summary.mean_test_rmse),
            mape,
            num(summary.last_round_mean_test_mae),
            summary.wall_seconds
        );
    } else {
        println!(
            "{} on {} ({}, {} clients, {} rounds): mean test acc {} (best-validation), last round {}, max over rounds {}, {:.1}s",
            summary.algorithm,
            summary.dataset,
            summary.partition,
            summary.clients,
            summary.rounds,
            pct(summary.mean_test_acc),
            pct(summary.last_round_mean_test_acc),
            pct(summary.max_round_mean_test_acc),
            summary.wall_seconds
        );
    }
    println!("outputs in {}", out.display());
}

/// `fedweave list --json`: `{"algorithms": [{"name", "summary",
/// "reference"}], "datasets": [{"name", "description"}], ...}`.
fn list_json() -> String {
    let named = |items: &[(&str, &str)]| -> serde_json::Value {
        items
            .iter()
            .map(|(n, d)| serde_json::json!({ "name": n, "description": d }))
            .collect()
    };
    let algorithms: Vec<serde_json::Value> = fedweave_algos::catalogue()
        .iter()
        .map(|a| {
            serde_json::json!({ "name": a.name, "summary": a.summary, "reference": a.reference })
        })
        .collect();
    let datasets: Vec<serde_json::Value> = fedweave_data::datasets()
        .iter()
        .map(|d| {
            serde_json::json!({
                "name": d.name,
                "description": d.help,
                "path": d.path.holds(),
                "natural_clients": d.natural_clients,
            })
        })
        .collect();
    // The model registry, with whether each trains batched
    // (`device.batch_clients`) and takes `[model] embed_dim`.
    let models: Vec<serde_json::Value> = fedweave_nn::ModelKind::catalogue()
        .iter()
        .map(|m| {
            serde_json::json!({ "name": m.name, "description": m.summary,
                "batched": m.batched, "embed_dim": m.embedding })
        })
        .collect();
    let v = serde_json::json!({
        "algorithms": algorithms,
        "datasets": datasets,
        "partitions": named(fedweave_data::partition_kinds()),
        "models": models,
        "attacks": named(fedweave_algos::attack::AttackKind::catalogue()),
        "aggregators": named(fedweave_algos::robust::AggregatorKind::catalogue()),
    });
    serde_json::to_string_pretty(&v).unwrap_or_default()
}

fn list() {
    println!("algorithms:");
    for a in fedweave_algos::catalogue() {
        println!("  {:<12} {}  [{}]", a.name, a.summary, a.reference);
    }
    println!("datasets:");
    for d in fedweave_data::datasets() {
        println!("  {:<12} {}", d.name, d.help);
    }
    println!("partitions:");
    for (name, what) in fedweave_data::partition_kinds() {
        println!("  {name:<12} {what}");
    }
    println!("models ([model] kind; `sequential` builds your own from [model] layers):");
    for m in fedweave_nn::ModelKind::catalogue() {
        println!("  {:<12} {}", m.name, m.summary);
    }
    println!("attacks:");
    for (name, what) in fedweave_algos::attack::AttackKind::catalogue() {
        println!("  {name:<12} {what}");
    }
    println!("aggregators ([aggregator] kind, for server methods):");
    for (name, what) in fedweave_algos::robust::AggregatorKind::catalogue() {
        println!("  {name:<12} {what}");
    }
}
