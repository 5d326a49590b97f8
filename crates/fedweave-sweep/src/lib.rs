//! fedweave-sweep: experiments as a job.
//!
//! A grid file names a base configuration, seeds, and the keys to vary
//! (Cartesian `[grid]`, explicit `[[case]]`s, fixed `[set]` overrides).
//! [`sweep`] checks every configuration first, runs what has not finished
//! yet (`--jobs` at a time, the cores divided between them), and writes
//! `results.csv`, `table.md`, `table.tex` and `index.html` next to the run
//! directories. [`compare`] builds the same outputs from existing runs.
//!
//! A run is finished when its directory holds `summary.json` and a
//! `sweep-run.json` whose fingerprint equals that of the run's resolved
//! configuration; anything else is run again (see
//! `exec::start_or_resume`, the single place where checkpoint resume will
//! go).
#![warn(missing_docs)]

pub mod cluster;
mod error;
pub mod exec;
pub mod grid;
mod page;
pub mod results;

use std::path::{Path, PathBuf};

pub use cluster::Emit;
pub use error::SweepError;
pub use exec::{ExecOptions, ExecOutcome, RunState, execute, run_state};
pub use grid::{Grid, Plan, PlannedRun, fingerprint};
pub use results::{Collection, Table, mean_std, write_outputs};

/// `fedweave sweep GRID.toml [--out DIR] [--jobs J]`.
#[derive(clap::Args, Debug, Clone)]
pub struct SweepArgs {
    /// The grid file (base config, seeds, [grid], [set], [[case]]).
    pub grid: PathBuf,
    /// Output directory (default: runs/<grid file stem>). Starting the same
    /// sweep again skips the runs that finished.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Experiments to run at once; the cores are divided between them.
    #[arg(long, default_value_t = 1)]
    pub jobs: usize,
    /// Check the grid and list the runs with their index K (and which
    /// would be skipped) without running anything.
    #[arg(long)]
    pub dry_run: bool,
    /// Write a cluster job file into the output directory instead of
    /// running: a Slurm array job (`slurm`, DIR/sweep.slurm) or a
    /// Kubernetes indexed Job (`k8s`, DIR/sweep-job.yaml); task K runs grid
    /// point K.
    #[arg(long, value_enum, conflicts_with_all = ["only", "collect", "dry_run"])]
    pub emit: Option<Emit>,
    /// Run grid point K only (0-based, the order `--dry-run` lists), as a
    /// cluster task does; the tables wait for `--collect`.
    #[arg(long, value_name = "K", conflicts_with_all = ["collect", "dry_run"])]
    pub only: Option<usize>,
    /// Run nothing: build results.csv, the tables and the page from the
    /// runs already in the output directory (when the cluster tasks are
    /// done); an error lists the grid points still missing.
    #[arg(long, conflicts_with = "dry_run")]
    pub collect: bool,
    /// Override a key for every run on top of the grid's `[set]`, e.g.
    /// `--set rounds=50` for a grid written at reduced scale (use another
    /// `--out`: changed runs are not skipped).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
}

/// `fedweave compare RUN_DIR... [--out DIR]`.
#[derive(clap::Args, Debug, Clone)]
pub struct CompareArgs {
    /// Finished run directories (each with summary.json and config.toml).
    #[arg(required = true)]
    pub dirs: Vec<PathBuf>,
    /// Where to write results.csv, table.md, table.tex and index.html.
    #[arg(long, default_value = "compare")]
    pub out: PathBuf,
}

/// What a sweep did.
#[derive(Debug, Clone)]
pub struct SweepReport {
    /// The output directory.
    pub out: PathBuf,
    /// The plan.
    pub plan: Plan,
    /// What ran and what was skipped.
    pub outcome: ExecOutcome,
    /// Files written (tables and page).
    pub written: Vec<PathBuf>,
}

/// The default output directory of a grid file: `runs/<stem>`.
pub fn default_out(grid: &Path) -> PathBuf {
    let stem = grid
        .file_stem()
        .map_or_else(|| "sweep".into(), |s| s.to_string_lossy().into_owned());
    PathBuf::from("runs").join(stem)
}

/// Reads the grid, checks every run, runs the unfinished ones and writes the
/// tables and the page (also when some runs failed; the error then lists
/// them).
///
/// # Errors
/// A malformed grid or configuration (before anything runs), I/O errors, or
/// [`SweepError::RunsFailed`].
pub fn sweep(grid_path: &Path, out: &Path, opts: &ExecOptions) -> Result<SweepReport, SweepError> {
    sweep_grid(&Grid::read(grid_path)?, out, opts)
}

/// [`sweep`] of a grid already read (and possibly overridden).
///
/// # Errors
/// As [`sweep`].
pub fn sweep_grid(grid: &Grid, out: &Path, opts: &ExecOptions) -> Result<SweepReport, SweepError> {
    let plan = grid.plan()?;
    let outcome = execute(&plan, out, opts)?;
    let collection = Collection::from_plan(&plan, out)?;
    let written = write_outputs(&collection, out)?;
    if !outcome.interrupted.is_empty() || outcome.not_started > 0 {
        return Err(SweepError::Interrupted {
            total: plan.runs.len(),
            finished: collection.runs.len(),
            stopped: outcome.interrupted.len(),
            not_started: outcome.not_started,
        });
    }
    if !outcome.failed.is_empty() {
        return Err(SweepError::RunsFailed {
            total: plan.runs.len(),
            failed: outcome.failed.clone(),
        });
    }
    Ok(SweepReport {
        out: out.to_path_buf(),
        plan,
        outcome,
        written,
    })
}

/// Builds the tables and the page from existing run directories.
///
/// # Errors
/// A directory without `summary.json` or `config.toml`, or I/O errors.
pub fn compare(dirs: &[PathBuf], out: &Path) -> Result<Vec<PathBuf>, SweepError> {
    let c = Collection::from_dirs(dirs)?;
    write_outputs(&c, out)
}

/// The `sweep` subcommand; `quiet` shows no progress.
///
/// # Errors
/// See [`sweep`].
pub fn run_sweep_command(args: &SweepArgs, quiet: bool) -> Result<(), SweepError> {
    let out = args.out.clone().unwrap_or_else(|| default_out(&args.grid));
    let mut grid = Grid::read(&args.grid)?;
    grid.override_set(&args.set)?;
    if args.dry_run {
        let plan = grid.plan()?;
        for (k, r) in plan.runs.iter().enumerate() {
            let state = match run_state(&out, r) {
                RunState::Done => "finished (skip)",
                RunState::Stale => "stale (resume)",
                RunState::New => "new",
            };
            println!("{k:>4}  {state:<16} {}", r.name);
        }
        println!("{} runs, all configurations valid", plan.runs.len());
        return Ok(());
    }
    if let Some(emit) = args.emit {
        return emit_job(&grid, args, &out, emit);
    }
    if let Some(k) = args.only {
        return run_only(&grid, &out, k, quiet);
    }
    if args.collect {
        return collect(&grid, &out);
    }
    let opts = ExecOptions {
        jobs: args.jobs.max(1),
        quiet,
        ..ExecOptions::default()
    };
    let rep = sweep_grid(&grid, &out, &opts)?;
    println!(
        "{} runs: {} run now, {} skipped (finished before), {:.1}s",
        rep.plan.runs.len(),
        rep.outcome.ran.len(),
        rep.outcome.skipped.len(),
        rep.outcome.seconds
    );
    for p in &rep.written {
        println!("{}", p.display());
    }
    Ok(())
}

/// `--emit`: writes the job file into `out`.
fn emit_job(grid: &Grid, args: &SweepArgs, out: &Path, emit: Emit) -> Result<(), SweepError> {
    let plan = grid.plan()?;
    std::fs::create_dir_all(out).map_err(error::io(out))?;
    let text = match emit {
        // Tasks start in other directories: absolute paths.
        Emit::Slurm => {
            let abs = |p: &Path| std::path::absolute(p).map_err(error::io(p));
            cluster::slurm_script(&plan, &abs(&args.grid)?, &abs(out)?, &args.set)
        }
        // Pods see the shared volume at /work: paths relative to it.
        Emit::K8s => cluster::k8s_manifest(&plan, &args.grid, out, &args.set),
    };
    let path = out.join(emit.file_name());
    std::fs::write(&path, text).map_err(error::io(&path))?;
    println!(
        "{} ({} tasks, task K = grid point K); when they are done: fedweave sweep {} --collect --out {}",
        path.display(),
        plan.runs.len(),
        args.grid.display(),
        out.display()
    );
    Ok(())
}

/// `--only K`: runs grid point K (resuming it if it was stopped).
fn run_only(grid: &Grid, out: &Path, k: usize, quiet: bool) -> Result<(), SweepError> {
    let mut plan = grid.plan()?;
    let n = plan.runs.len();
    if k >= n {
        return Err(SweepError::Input {
            path: out.to_path_buf(),
            message: format!(
                "--only {k}: the grid has {n} runs (K in 0..={})",
                n.saturating_sub(1)
            ),
        });
    }
    plan.runs = vec![plan.runs.swap_remove(k)];
    let opts = ExecOptions {
        quiet,
        ..ExecOptions::default()
    };
    let outcome = execute(&plan, out, &opts)?;
    let name = &plan.runs[0].name;
    if let Some((_, e)) = outcome.failed.first() {
        return Err(SweepError::RunsFailed {
            total: 1,
            failed: vec![(name.clone(), e.clone())],
        });
    }
    if !outcome.interrupted.is_empty() || outcome.not_started > 0 {
        return Err(SweepError::Interrupted {
            total: 1,
            finished: 0,
            stopped: outcome.interrupted.len(),
            not_started: outcome.not_started,
        });
    }
    let what = if outcome.skipped.is_empty() {
        "done"
    } else {
        "finished before (skipped)"
    };
    println!("grid point {k}: {} {what}", out.join(name).display());
    Ok(())
}

/// `--collect`: the tables and the page from the runs in `out`.
fn collect(grid: &Grid, out: &Path) -> Result<(), SweepError> {
    let plan = grid.plan()?;
    let collection = Collection::from_plan(&plan, out)?;
    let written = write_outputs(&collection, out)?;
    let missing: Vec<String> = plan
        .runs
        .iter()
        .enumerate()
        .filter(|(_, r)| run_state(out, r) != RunState::Done)
        .map(|(k, r)| format!("{k} ({})", r.name))
        .collect();
    for p in &written {
        println!("{}", p.display());
    }
    if missing.is_empty() {
        println!("collected all {} runs", plan.runs.len());
        Ok(())
    } else {
        Err(SweepError::Incomplete {
            total: plan.runs.len(),
            missing,
        })
    }
}

/// The `compare` subcommand.
///
/// # Errors
/// See [`compare`].
pub fn run_compare_command(args: &CompareArgs) -> Result<(), SweepError> {
    for p in compare(&args.dirs, &args.out)? {
        println!("{}", p.display());
    }
    Ok(())
}
