#!/usr/bin/env bash
# pFedGraph's Table 1 Fashion-MNIST column at the paper's budget (50 rounds × 200
# iterations; experiments/full/): every partition and method for seed 1, then seed 2,
# then seed 3, one run at a time, so whatever finishes fills whole columns. Finished
# runs are skipped and a stopped one resumes from its checkpoint, so the script can be
# stopped and rerun at will. Collect the tables with
#   fedweave sweep experiments/full/pfedgraph_t1_PART.toml --collect --out runs/full/pfedgraph_t1_PART
# Usage: scripts/pfedgraph_full.sh [FEDWEAVE_BINARY]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-target/release/fedweave}
methods=4
for seed in 0 1 2; do
  for part in extreme severe modest homo; do
    for m in $(seq 0 $((methods - 1))); do
      "$bin" sweep "experiments/full/pfedgraph_t1_$part.toml" --only $((m * 3 + seed)) \
        --out "runs/full/pfedgraph_t1_$part"
    done
  done
done
