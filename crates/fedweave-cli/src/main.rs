//! `fedweave`: personalized federated learning with collaboration graphs.

use anyhow::Context;
use clap::{Parser, Subcommand};
use fedweave_sim::{ExperimentConfig, RoundRecord, Summary, resume_experiment, run_experiment};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

#[derive(Parser)]
#[command(
    name = "fedweave",
    version,
    about = "Personalized federated learning with collaboration graphs"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
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
    List,
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
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match real_main(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn real_main(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Run { config, out, set } => {
            let cfg = ExperimentConfig::from_file(&config, &set)?;
            let out = out.unwrap_or_else(|| default_out_dir(&cfg));
            let summary = with_progress(cfg.rounds, |on_round| {
                run_experiment(&cfg, &out, on_round)
                    .with_context(|| format!("run of {} failed", config.display()))
            })?;
            print_summary(&summary, &out);
            Ok(())
        }
        Command::Resume { dir, rounds } => {
            let total = match rounds {
                Some(r) => r,
                None => ExperimentConfig::from_file(&dir.join("config.toml"), &[])?.rounds,
            };
            let summary = with_progress(total, |on_round| {
                resume_experiment(&dir, rounds, on_round)
                    .with_context(|| format!("resume of {} failed", dir.display()))
            })?;
            print_summary(&summary, &dir);
            Ok(())
        }
        Command::List => {
            list();
            Ok(())
        }
        Command::Report { dir } => {
            let path = fedweave_report::write_report(&dir)?;
            println!("{}", path.display());
            Ok(())
        }
        Command::Sweep(args) => Ok(fedweave_sweep::run_sweep_command(&args)?),
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

/// Runs `job` with a progress bar on a terminal (one line per round
/// otherwise) over `rounds` rounds.
fn with_progress(
    rounds: usize,
    job: impl FnOnce(&mut dyn FnMut(&RoundRecord)) -> anyhow::Result<Summary>,
) -> anyhow::Result<Summary> {
    let started = Instant::now();
    let bar = std::io::stderr().is_terminal().then(|| {
        let bar = ProgressBar::new(rounds as u64);
        bar.set_style(
            ProgressStyle::with_template(
                "{spinner} round {pos}/{len} [{bar:30}] {msg} ({elapsed})",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        bar
    });
    let mut on_round = |r: &RoundRecord| {
        let msg = match (r.mean_val_acc, r.mean_test_acc) {
            (Some(v), Some(t)) => format!("val acc {v:.4}  test acc {t:.4}"),
            _ => format!(
                "val MAE {:.4}  test MAE {:.4}",
                r.mean_val_mae.unwrap_or(f64::NAN),
                r.mean_test_mae.unwrap_or(f64::NAN)
            ),
        };
        match &bar {
            Some(b) => {
                b.set_position(r.round as u64);
                b.set_message(msg);
            }
            None => eprintln!(
                "round {:>4}/{rounds}  {msg}  {:.1}s elapsed",
                r.round,
                started.elapsed().as_secs_f64()
            ),
        }
    };
    let summary = job(&mut on_round)?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    Ok(summary)
}

fn print_summary(summary: &Summary, out: &std::path::Path) {
    let pct = |x: Option<f64>| x.map_or("n/a".to_string(), |v| format!("{:.2}%", 100.0 * v));
    if let Some(mae) = summary.mean_test_mae {
        let num = |x: Option<f64>| x.map_or("n/a".to_string(), |v| format!("{v:.4}"));
        println!(
            "{} on {} ({} clients, {} rounds): mean test MAE {} / RMSE {} / MAPE {}% (best-validation), last round MAE {}, {:.1}s",
            summary.algorithm,
            summary.dataset,
            summary.clients,
            summary.rounds,
            num(Some(mae)),
            num(summary.mean_test_rmse),
            num(summary.mean_test_mape),
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

fn default_out_dir(cfg: &ExperimentConfig) -> PathBuf {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    PathBuf::from("runs").join(format!(
        "{}-{}-{stamp}",
        cfg.algorithm_name(),
        cfg.data.dataset
    ))
}

fn list() {
    println!("algorithms:");
    for a in fedweave_algos::catalogue() {
        println!("  {:<12} {}  [{}]", a.name, a.summary, a.reference);
    }
    println!("datasets:");
    for (name, what) in fedweave_data::dataset_names() {
        println!("  {name:<12} {what}");
    }
    println!("partitions:");
    for (name, what) in fedweave_data::partition_kinds() {
        println!("  {name:<12} {what}");
    }
    println!("models:");
    for (name, what) in fedweave_nn::ModelKind::catalogue() {
        println!("  {name:<12} {what}");
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
