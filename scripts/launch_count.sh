#!/usr/bin/env bash
# Kernel launches per training step (K clients batched, or one model), by kernel, from
# cubecl's own launch log:
# a device-free figure for the GPU path (a batched step of small models is bound by its
# launches, docs/results.md "GPU, session 44"). It runs `fedweave bench --mode batched`
# with CUDA graphs off (a recording would hide the launches) and cubecl's profiling log
# on, then splits the log into steps at the update kernels that end each step.
# On a machine without a GPU use a `--features wgpu` build and Mesa's lavapipe
# (Debian `mesa-vulkan-drivers`); the counts are the backend's, the timings are not.
#   scripts/launch_count.sh BIN [MODEL] [K] [BATCH] [BACKEND] [MODE]
#   e.g. scripts/launch_count.sh target/wgpu/debug/fedweave cnn-bn 10 10 wgpu
# MODE: batched (default; K > 1) or one-by-one (one model's step; use K = 1).
set -euo pipefail
bin=$(realpath "$1")
model=${2:-cnn-bn} k=${3:-10} batch=${4:-10} backend=${5:-wgpu} mode=${6:-batched}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
FEDWEAVE_CUDA_GRAPHS=0 CUBECL_DEBUG_LOG="$work/cubecl.log" CUBECL_DEBUG_OPTION=profile \
    "$bin" bench --backend "$backend" --model "$model" --k "$k" --batch "$batch" \
    --mode "$mode" --seconds 0.001 > "$work/bench.txt" 2> "$work/stderr.txt" || {
    cat "$work/stderr.txt" >&2
    exit 1
}
python3 - "$work/cubecl.log" "$model" "$k" "$batch" "$backend" "$mode" <<'PY'
import collections, re, statistics, sys
log, model, k, batch, backend, mode = sys.argv[1:]
# The profiling log's lines: "| <duration> | <Kernel>_<hash>", or with the operation
# after the kernel family: "| <duration> | <Kernel> | <Op>_<hash>".
line = re.compile(r"^\| [0-9.]+ ?(?:ns|µs|us|ms|s) +\| (.+?) *$")
hashed = re.compile(r"_[0-9a-f]{8}$")
def name(field):
    # The family, and the operation where it says one (AddOp, MulOp, ...).
    parts = [hashed.sub("", part.strip()) for part in field.split("|")][:2]
    return " / ".join(p for p in parts if p.endswith("Op") or p is parts[0])

names = [name(m.group(1)) for m in map(line.match, open(log, encoding="utf-8")) if m]
# A step ends with its update: a few tensors a launch (the grouped kernel, which
# writes resting clients' rows back), or one launch per tensor (one model with
# frozen ranges).
update = {"SgdMomentumRowsKernel", "SgdMomentumKernel"}
ends, run = [], 0
for i, name in enumerate(names):
    run = run + 1 if name in update else 0
    if run and (i + 1 == len(names) or names[i + 1] not in update):
        ends.append(i)
if len(ends) < 3:
    sys.exit(f"found {len(ends)} steps in {len(names)} launches: no update kernel?")
lengths = [b - a for a, b in zip(ends, ends[1:])]
step = statistics.median(lengths)
last = names[ends[-2] + 1 : ends[-1] + 1]
print(f"### Launches per {mode} step: `{model}`, K = {k}, batch {batch}, {backend}\n")
print(f"{step:.0f} launches per step (median of {len(lengths)} steps; "
      f"{len(names)} launches in the run)\n")
print("| kernel | launches in one step |\n|---|---:|")
for name, n in collections.Counter(last).most_common():
    print(f"| {name} | {n} |")
PY
