#!/usr/bin/env bash
# Whole rounds of the graph methods against FedAvg's at N clients (issue 25's
# setting: Fashion-MNIST, Dirichlet 0.5, min_samples 20, the 199k-parameter
# mlp, 1 local iteration of batch 16): median seconds per round over rounds
# 2..R (round 1 pays the first allocations) and the ratio to FedAvg's.
# Usage: scripts/round_ratio.sh [BINARY] [N] [ROUNDS] [MODEL]
set -euo pipefail
bin=$(realpath "${1:-target/release/fedweave}")
n=${2:-500} rounds=${3:-6} model=${4:-mlp}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for m in fedavg pfedgraph feddwa fedaghn; do
  cat > "$work/$m.toml" <<TOML
seed = 1
clients = $n
rounds = $rounds
checkpoint_every = 0

[data]
dataset = "fashion-mnist"

[partition]
kind = "dirichlet"
beta = 0.5
min_samples = 20

[model]
kind = "$model"

[train]
local_iterations = 1
batch_size = 16
lr = 0.01

[algorithm]
name = "$m"
TOML
  "$bin" run "$work/$m.toml" --out "$work/run_$m" --quiet > /dev/null
  rm -rf "$work/run_$m/models"
done
python3 - "$work" <<'PY'
import json, statistics, sys
work = sys.argv[1]
base = None
print("| method | seconds per round (median of rounds 2..) | × FedAvg | mean test acc |")
print("|---|---:|---:|---:|")
for m in ["fedavg", "pfedgraph", "feddwa", "fedaghn"]:
    s = [json.loads(l)["seconds"] for l in open(f"{work}/run_{m}/rounds.jsonl")]
    med = statistics.median(s[1:])
    base = base or med
    acc = json.load(open(f"{work}/run_{m}/summary.json"))["mean_test_acc"]
    print(f"| {m} | {med:.3f} | {med / base:.2f} | {100 * acc:.2f} |")
PY
