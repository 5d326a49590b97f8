#!/usr/bin/env bash
# Every GPU measurement of docs/results.md in one go, written as one markdown table
# (and the raw JSON Lines / summaries beside it). Run it on the machine with the GPU:
#
#   scripts/gpu_bench.sh [--bin target/cuda/release/fedweave] [--data DIR] [--out DIR] [--quick]
#
#   --bin    the CUDA binary (scripts/build_cuda.sh builds it)
#   --data   a folder holding Fashion-MNIST's four IDX files (default: Debian's
#            /usr/share/datasets/fashion-mnist)
#   --out    where the results go (default: gpu-results)
#   --quick  shorter measurements (1 s instead of 3 s each)
#   --parts  comma-separated subset of: check, train, server, server-cpu, runs,
#            runs-one-by-one, torch, profile (default: all; runs-one-by-one is PFLlib's
#            setting without batching, the longest part)
#   --tag    a suffix for the training files (train_cuda-TAG.jsonl): two binaries, one folder
#
# What it measures, each part under its own time limit so one stuck part costs only itself:
#   0. A check that the GPU trains what the CPU trains: the same short pFedGraph run with
#      `cnn-bn` (convolutions, batch norm, momentum SGD: every GPU-only kernel path) on the
#      CPU backend, on CUDA one client at a time and on CUDA with `batch_clients = 10`;
#      each client's test accuracy must agree within 1 point (float rounding only).
#   1. `fedweave bench --backend cuda`: client-steps/s of mlp, cnn, cnn-bn and resnet8 at
#      K = 1, 10 and 100, one client at a time and K batched.
#   2. the server step of fedavg/pfedgraph/feddwa/fedaghn at N = 500 and 1000 for cnn-bn
#      (d = 582,218): products on the GPU, and on every host core.
#   3. pFedGraph's Severe setting (Fashion-MNIST, 10 clients, 2 classes each, SimpleCNN,
#      200 local iterations of batch 64) seconds per round, with and without
#      `batch_clients = 10`; the same on the CPU backend for comparison.
#   4. FedAvg as PFLlib runs it by default (10 clients, cnn-bn = PFLlib's 582k FedAvgCNN
#      with batch norm, 2 local epochs of batch 10, lr 0.005): seconds per round, against
#      PFLlib's 7.0 s on an H100 (issue 25).
#   5. PyTorch's steps/s of the same models on the same GPU (when `torch` imports), one
#      model at a time and K models stacked with torch.func (scripts/torch_many_models.py).
#   6. Where a step's time goes (when Nsight Compute's `ncu` is there): the device's busy
#      time per step of `cnn-bn` (one model, batch 64) and of 100 batched `cnn`s (batch 16),
#      against the wall time per step (scripts/ncu_steps.py).
# Needs: the NVIDIA driver (libcuda), and for the LLVM build `libdevice.10.bc` under
# $CUDA_PATH/nvvm/libdevice (default CUDA_PATH: /usr/local/cuda; PyPI's
# nvidia-cuda-nvcc-cu12 wheel has it too).
set -uo pipefail
cd "$(dirname "$0")/.."

bin=target/cuda/release/fedweave
data=/usr/share/datasets/fashion-mnist
out=gpu-results
secs=3
rounds=3
parts=check,train,server,server-cpu,runs,runs-one-by-one,torch,profile
tag=""
while [ $# -gt 0 ]; do
    case "$1" in
    --bin) bin=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --quick) secs=1; shift ;;
    --parts) parts=$2; shift 2 ;;
    --tag) tag=-$2; shift 2 ;;
    *) echo "gpu_bench.sh: unknown argument \`$1\`" >&2; exit 2 ;;
    esac
done
mkdir -p "$out"
log="$out/log.txt"
: >"$log"

die() { echo "gpu_bench.sh: $*" | tee -a "$log" >&2; exit 1; }
[ -x "$bin" ] || die "no binary at $bin (build it with scripts/build_cuda.sh)"
command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 ||
    die "no NVIDIA GPU or driver here (nvidia-smi -L failed)"
ldconfig -p | grep -q 'libcuda\.so' || die "the driver's libcuda.so is not on the loader path"
export CUDA_PATH=${CUDA_PATH:-/usr/local/cuda}
[ -f "$CUDA_PATH/nvvm/libdevice/libdevice.10.bc" ] ||
    die "no libdevice.10.bc under \$CUDA_PATH/nvvm/libdevice (CUDA_PATH=$CUDA_PATH): install a CUDA toolkit or pip install nvidia-cuda-nvcc-cu12 and set CUDA_PATH to its nvidia/cuda_nvcc folder"
# wanted GROUP: whether --parts asked for this group of measurements.
wanted() { [[ ",$parts," == *",$1,"* ]]; }
if wanted check || wanted runs || wanted runs-one-by-one; then
    for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
        [ -f "$data/$f" ] || [ -f "$data/$f.gz" ] || die "Fashion-MNIST's $f(.gz) is not in $data"
    done
fi

gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)
cores=$(nproc)
echo "GPU: $gpu; $cores host cores" | tee -a "$log"


# part NAME SECONDS COMMAND...: runs one part under a time limit, logging how it ended.
part() {
    local name=$1 limit=$2
    shift 2
    local start=$SECONDS
    timeout "$limit" "$@" >>"$log" 2>&1
    local rc=$?
    echo "[$name] exit $rc after $((SECONDS - start)) s" | tee -a "$log"
}

# 1. Training throughput, and issue 25's "100 small models at once" figure (cnn, batch 16).
if wanted train; then
part bench-train 150 bash -c "'$bin' bench --backend cuda --model mlp --model cnn --model cnn-bn \
    --model resnet8 --k 1 --k 10 --k 100 --seconds $secs --json > '$out/train_cuda$tag.jsonl'"
part bench-train-b16 60 bash -c "'$bin' bench --backend cuda --model cnn --batch 16 --k 100 \
    --mode batched --seconds $secs --json > '$out/train_cuda_b16$tag.jsonl'"
# A fixed cost per step shows as steps/s that do not fall with the batch.
part bench-batch-scaling 60 bash -c "for b in 16 256 1024; do '$bin' bench --backend cuda \
    --model cnn --threads 1 --batch \$b --seconds $secs --json; done > '$out/train_cuda_scaling$tag.jsonl'"
fi

# 2. Server steps at N = 500 and 1000, d = 582k: on the GPU and on every host core.
if wanted server; then
part bench-server-cuda 100 bash -c "'$bin' bench --backend cuda --model cnn-bn --server 500 --server 1000 \
    --no-train --json > '$out/server_cuda.jsonl'"
fi
if wanted server-cpu; then
part bench-server-cpu 80 bash -c "'$bin' bench --backend cpu --model cnn-bn --server 500 \
    --no-train --json > '$out/server_cpu.jsonl'"
fi

# 3. pFedGraph Severe per round, and 4. PFLlib's FedAvg setting.
run() {
    local name=$1 limit=$2 config=$3
    shift 3
    part "$name" "$limit" "$bin" run "$config" --out "$out/runs/$name" --overwrite -q \
        --set rounds="$rounds" --set data.path="\"$data\"" "$@"
}
severe=(--set partition.kind='"pathological"' --set partition.classes_per_client=2
    --set eval.when='"before_and_after"')
pfllib=(--set algorithm.name='"fedavg"' --set model.kind='"cnn-bn"' --set partition.kind='"dirichlet"'
    --set partition.beta=0.1 --set train.local_iterations=0 --set train.local_epochs=2
    --set train.batch_size=10 --set train.lr=0.005 --set train.momentum=0.0 --set train.weight_decay=0.0)
if wanted check; then
    check=(--set model.kind='"cnn-bn"' --set rounds=2 --set train.local_iterations=20
        --set eval.select='"last"')
    run check-cpu 60 examples/fmnist_pfedgraph.toml "${check[@]}"
    run check-cuda 60 examples/fmnist_pfedgraph.toml "${check[@]}" --set device.backend='"cuda"'
    run check-cuda-batched 60 examples/fmnist_pfedgraph.toml "${check[@]}" \
        --set device.backend='"cuda"' --set device.batch_clients=10
    python3 - "$out/runs" <<'PY' | tee -a "$log" "$out/check.md"
import json, pathlib, sys
runs = pathlib.Path(sys.argv[1])
acc = {}
for name in ("check-cpu", "check-cuda", "check-cuda-batched"):
    p = runs / name / "summary.json"
    acc[name] = json.loads(p.read_text())["per_client_test_acc"] if p.exists() else None
cpu = acc["check-cpu"]
for name in ("check-cuda", "check-cuda-batched"):
    gpu = acc[name]
    if cpu is None or gpu is None:
        print(f"check {name}: FAILED (a run did not finish)")
        continue
    worst = max(abs(a - b) for a, b in zip(cpu, gpu))
    verdict = "ok" if worst <= 0.01 else "FAILED"
    print(f"check {name}: {verdict}: per-client test accuracy within {worst:.4f} of the CPU's "
          f"(mean {sum(gpu) / len(gpu):.4f} vs {sum(cpu) / len(cpu):.4f})")
PY
fi
if wanted runs; then
run severe-cuda 80 examples/fmnist_pfedgraph.toml "${severe[@]}" --set device.backend='"cuda"'
run severe-cuda-batched 80 examples/fmnist_pfedgraph.toml "${severe[@]}" --set device.backend='"cuda"' \
    --set device.batch_clients=10
run severe-cpu 50 examples/fmnist_pfedgraph.toml "${severe[@]}" --set rounds=1
run pfllib-fedavg-cuda-batched 100 examples/fmnist_pfedgraph.toml "${pfllib[@]}" \
    --set device.backend='"cuda"' --set device.batch_clients=10
fi
if wanted runs-one-by-one; then
run pfllib-fedavg-cuda 100 examples/fmnist_pfedgraph.toml "${pfllib[@]}" --set device.backend='"cuda"'
fi

# 5. PyTorch on the same GPU.
if wanted torch && python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
    part torch-64 50 bash -c "python3 scripts/torch_cpu_throughput.py --device cuda --batch 64 > '$out/torch_cuda_b64.md'"
    part torch-10 50 bash -c "python3 scripts/torch_cpu_throughput.py --device cuda --batch 10 > '$out/torch_cuda_b10.md'"
    part torch-many 80 bash -c "python3 scripts/torch_many_models.py --device cuda --batch 16 > '$out/torch_many_b16.md'"
fi

# 6. Device time per step under Nsight Compute, against the wall time measured above.
# profile NAME STEPS_PER_S BENCH-ARGS...: ncu over 900 launches (about three steps of
# cnn-bn, five batched steps of cnn) after the first 600 (the probe and the warm-up).
profile() {
    local name=$1 rate=$2
    shift 2
    part "ncu-$name" 150 ncu --metrics gpu__time_duration.sum --clock-control none --cache-control none \
        --launch-skip 600 --launch-count 900 \
        --csv --log-file "$out/ncu_$name$tag.csv" "$bin" bench --backend cuda --seconds 10 "$@"
    python3 scripts/ncu_steps.py "$out/ncu_$name$tag.csv" --title "$name$tag" \
        ${rate:+--wall-steps-per-s "$rate"} >> "$out/profile$tag.md" 2>>"$log"
}
# rate MODEL K MODE FILE: the steps/s the training part measured (batched: per batched step).
rate() {
    python3 - "$@" <<'PY'
import json, sys
model, k, mode, path = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
try:
    for line in open(path):
        r = json.loads(line)
        if r["model"] == model and r["k"] == k and r["mode"] == mode:
            print(r["steps_per_s"] / (k if mode == "batched" else 1))
            break
except OSError:
    pass
PY
}
if wanted profile && command -v ncu >/dev/null; then
    : >"$out/profile$tag.md"
    profile cnn-bn "$(rate cnn-bn 1 one-by-one "$out/train_cuda$tag.jsonl")" \
        --model cnn-bn --k 1 --threads 1 --batch 64
    profile cnn-k100 "$(rate cnn 100 batched "$out/train_cuda_b16$tag.jsonl")" \
        --model cnn --k 100 --mode batched --batch 16
fi

# The table.
python3 - "$out" "$gpu" "$cores" <<'EOF' | tee "$out/results.md"
import json, pathlib, sys
out, gpu, cores = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]
def lines(name):
    p = out / name
    rows = [json.loads(l) for l in p.read_text().splitlines() if l.strip()] if p.exists() else []
    return [dict(r, _file=name) for r in rows]
print(f"GPU: {gpu}; host: {cores} cores\n")
rows = [r for p in sorted(out.glob("train_cuda*.jsonl")) for r in lines(p.name)]
if rows:
    print("| file | model | batch | K | one-by-one client-steps/s | batched client-steps/s | batched samples/s |")
    print("|---|---|---:|---:|---:|---:|---:|")
    keyed = {}
    for r in rows:
        keyed.setdefault((r["_file"], r["model"], r["batch"], r["k"]), {})[r["mode"]] = r
    for (src, model, batch, k), m in keyed.items():
        one = m.get("one-by-one", {}).get("steps_per_s")
        bat = m.get("batched", {})
        f = lambda v, p=1: "—" if v is None else f"{v:,.{p}f}"
        print(f"| {src} | {model} | {batch} | {k} | {f(one)} | {f(bat.get('steps_per_s'))} | {f(bat.get('samples_per_s'), 0)} |")
    print()
rows = lines("server_cuda.jsonl") + lines("server_cpu.jsonl")
if rows:
    print("| server step | N | d | kernels | seconds | × fedavg |")
    print("|---|---:|---:|---|---:|---:|")
    for r in rows:
        where = "GPU" if r["backend"] == "cuda" else f"{r['threads']} host cores"
        print(f"| {r['mode']} | {r['k']} | {r['d']:,} | {where} | {r['seconds']:.3f} | {r['vs_fedavg']:.2f} |")
    print()
runs = sorted((out / "runs").glob("*/summary.json")) if (out / "runs").exists() else []
if runs:
    print("| run | rounds | s/round (median) | wall s | mean test acc |")
    print("|---|---:|---:|---:|---:|")
    for p in runs:
        s = json.loads(p.read_text())
        print(f"| {p.parent.name} | {s.get('rounds')} | {s.get('seconds_per_round_median', float('nan')):.2f} | "
              f"{s.get('wall_seconds', float('nan')):.1f} | {s.get('mean_test_acc', float('nan')):.4f} |")
    print()
for name in ("check.md", "torch_cuda_b64.md", "torch_cuda_b10.md", "torch_many_b16.md") + tuple(
        p.name for p in sorted(out.glob("profile*.md"))):
    p = out / name
    if p.exists():
        print(p.read_text())
EOF
