//! Sweeps on a cluster: a Slurm array job or a Kubernetes indexed Job in
//! which task K runs grid point K (`fedweave sweep GRID --only K`) into a
//! shared output directory, then `fedweave sweep GRID --collect` builds the
//! tables and the page there.

use std::path::Path;

use crate::grid::Plan;

/// Which scheduler's job file `--emit` writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Emit {
    /// A Slurm array job script (`sbatch DIR/sweep.slurm`).
    Slurm,
    /// A Kubernetes indexed Job manifest (`kubectl apply -f DIR/sweep-job.yaml`).
    K8s,
}

impl Emit {
    /// The file written into the sweep's output directory.
    pub fn file_name(self) -> &'static str {
        match self {
            Emit::Slurm => "sweep.slurm",
            Emit::K8s => "sweep-job.yaml",
        }
    }
}

/// `text` as one single-quoted shell word.
fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// `text` as a double-quoted YAML string.
fn yaml_quote(text: &str) -> String {
    serde_json::to_string(text).unwrap_or_else(|_| "\"\"".into())
}

/// A Kubernetes object name from `text`: lower-case letters, digits and
/// `-`, at most 50 characters.
fn k8s_name(text: &str) -> String {
    let mut s: String = text
        .to_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    s.truncate(50);
    let s = s.trim_matches('-');
    if s.is_empty() {
        "sweep".into()
    } else {
        s.to_string()
    }
}

/// `# K  run-name` lines: which task runs which grid point.
fn index_lines(plan: &Plan) -> String {
    plan.runs
        .iter()
        .enumerate()
        .map(|(k, r)| format!("#   {k:>4}  {}\n", r.name))
        .collect()
}

/// The Slurm array job for `plan`: `grid` and `out` as the tasks see them
/// (absolute paths on the shared file system), `set` the `--set` overrides.
/// The binary is `$FEDWEAVE` when set, else `fedweave` on the `PATH`.
pub fn slurm_script(plan: &Plan, grid: &Path, out: &Path, set: &[String]) -> String {
    let n = plan.runs.len();
    let stem = grid
        .file_stem()
        .map_or_else(|| "sweep".into(), |s| s.to_string_lossy().into_owned());
    let sets: String = set
        .iter()
        .map(|s| format!(" --set {}", shell_quote(s)))
        .collect();
    let (g, o) = (grid.display().to_string(), out.display().to_string());
    format!(
        r#"#!/bin/bash
# fedweave sweep {g}: {n} runs, one Slurm array task per grid point.
#   submit:         sbatch {o}/sweep.slurm
#   when all done:  fedweave sweep {g} --collect --out {o}
# Task K runs grid point K (`fedweave sweep GRID --only K`) into {o}; a task
# that is requeued or run again resumes its run from the checkpoint.
# Adapt time, memory, CPUs and partition to your cluster.
#SBATCH --job-name=fedweave-{stem}
#SBATCH --array=0-{last}
#SBATCH --cpus-per-task=4
#SBATCH --mem=8G
#SBATCH --time=04:00:00
#SBATCH --output={o}/slurm-%A_%a.out
#SBATCH --signal=B:TERM@120

set -euo pipefail
FEDWEAVE="${{FEDWEAVE:-fedweave}}"
K="${{SLURM_ARRAY_TASK_ID:?run this script with sbatch (or set SLURM_ARRAY_TASK_ID)}}"
# exec: Slurm's TERM (--signal, scancel, time limit) reaches fedweave, which
# stops after the round under way with its checkpoint written.
exec "$FEDWEAVE" sweep {gq} --out {oq} --only "$K"{sets}

# grid points (K  run directory):
{index}"#,
        last = n.saturating_sub(1),
        gq = shell_quote(&g),
        oq = shell_quote(&o),
        index = index_lines(plan),
    )
}

/// The Kubernetes indexed Job for `plan`: `completions` = the grid size,
/// pod K runs grid point K with `grid` and `out` relative to the shared
/// volume mounted at `/work` (a PersistentVolumeClaim `fedweave-work`
/// holding the grid file, its base config and the output directory).
pub fn k8s_manifest(plan: &Plan, grid: &Path, out: &Path, set: &[String]) -> String {
    let n = plan.runs.len();
    let stem = grid
        .file_stem()
        .map_or_else(|| "sweep".into(), |s| s.to_string_lossy().into_owned());
    let sets: String = set
        .iter()
        .map(|s| format!(" --set {}", shell_quote(s)))
        .collect();
    let command = format!(
        "exec fedweave sweep {} --out {} --only \"$JOB_COMPLETION_INDEX\"{sets}",
        shell_quote(&grid.display().to_string()),
        shell_quote(&out.display().to_string()),
    );
    format!(
        r#"# fedweave sweep {g}: {n} runs as a Kubernetes indexed Job; pod K runs
# grid point K into {o} on the shared volume (PVC fedweave-work at /work,
# holding the grid file and its base config at the same relative paths).
#   build the image:  docker build -t fedweave:latest .   (the repository's Dockerfile)
#   submit:           kubectl apply -f {o}/sweep-job.yaml
#   when all done:    fedweave sweep {g} --collect --out {o}   (on the volume's contents)
# grid points (K  run directory):
{index}apiVersion: batch/v1
kind: Job
metadata:
  name: {name}
  labels:
    app: fedweave
spec:
  completionMode: Indexed
  completions: {n}
  parallelism: {par}
  backoffLimit: {backoff}
  template:
    metadata:
      labels:
        app: fedweave
    spec:
      restartPolicy: Never
      containers:
        - name: fedweave
          image: fedweave:latest
          workingDir: /work
          command: ["sh", "-c", {cmd}]
          resources:
            requests:
              cpu: "4"
              memory: 8Gi
          volumeMounts:
            - name: work
              mountPath: /work
      volumes:
        - name: work
          persistentVolumeClaim:
            claimName: fedweave-work
"#,
        g = grid.display(),
        o = out.display(),
        index = index_lines(plan),
        name = k8s_name(&format!("fedweave-{stem}")),
        par = n.clamp(1, 16),
        backoff = n.max(1) * 2,
        cmd = yaml_quote(&command),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_survives_odd_names() {
        assert_eq!(shell_quote("a b'c"), r"'a b'\''c'");
        assert_eq!(yaml_quote("say \"hi\""), r#""say \"hi\"""#);
        assert_eq!(k8s_name("fedweave-My Grid_2"), "fedweave-my-grid-2");
        assert_eq!(k8s_name("__"), "sweep");
    }
}
