#!/usr/bin/env bash
# pFedGraph's Table 1 Fashion-MNIST column at the paper's budget (50 rounds × 200
# iterations; experiments/full/): every partition and method for seed 1, then seed 2,
# then seed 3, one run at a time, so whatever finishes fills whole columns. Finished
# runs are skipped and a stopped one resumes from its checkpoint, so the script can be
# stopped and rerun at will. Collect the tables with
#   fedweave sweep experiments/full/pfedgraph_t1_PART.toml --collect --out runs/full/pfedgraph_t1_PART
# Usage: scripts/pfedgraph_full.sh [FEDWEAVE_BINARY] [VARIANT]
# VARIANT "_3072" runs the grids pfedgraph_t1_PART_3072.toml (the paper's 3,072 samples per
# client) for the partitions that have one.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-target/release/fedweave}
variant=${2:-}
methods=4
for seed in 0 1 2; do
  for part in extreme severe modest homo; do
    grid="experiments/full/pfedgraph_t1_$part$variant.toml"
    [[ -f $grid ]] || continue
    for m in $(seq 0 $((methods - 1))); do
      "$bin" sweep "$grid" --only $((m * 3 + seed)) --out "runs/full/pfedgraph_t1_$part$variant"
    done
  done
done
