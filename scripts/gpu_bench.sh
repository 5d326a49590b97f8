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
#   --parts  comma-separated subset of: train, server, runs, torch (default: all)
#
# What it measures, each part under its own time limit so one stuck part costs only itself:
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
#   5. PyTorch's steps/s of the same models on the same GPU (when `torch` imports).
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
parts=train,server,runs,torch
while [ $# -gt 0 ]; do
    case "$1" in
    --bin) bin=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --quick) secs=1; shift ;;
    --parts) parts=$2; shift 2 ;;
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
for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
    [ -f "$data/$f" ] || [ -f "$data/$f.gz" ] || die "Fashion-MNIST's $f(.gz) is not in $data"
done

gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)
cores=$(nproc)
echo "GPU: $gpu; $cores host cores" | tee -a "$log"

# wanted GROUP: whether --parts asked for this group of measurements.
wanted() { [[ ",$parts," == *",$1,"* ]]; }

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
    --model resnet8 --k 1 --k 10 --k 100 --seconds $secs --json > '$out/train_cuda.jsonl'"
part bench-train-b16 60 bash -c "'$bin' bench --backend cuda --model cnn --batch 16 --k 100 \
    --seconds $secs --json > '$out/train_cuda_b16.jsonl'"
fi

# 2. Server steps at N = 500 and 1000, d = 582k: on the GPU and on every host core.
if wanted server; then
part bench-server-cuda 100 bash -c "'$bin' bench --backend cuda --model cnn-bn --server 500 --server 1000 \
    --no-train --json > '$out/server_cuda.jsonl'"
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
if wanted runs; then
run severe-cuda 80 examples/fmnist_pfedgraph.toml "${severe[@]}" --set device.backend='"cuda"'
run severe-cuda-batched 80 examples/fmnist_pfedgraph.toml "${severe[@]}" --set device.backend='"cuda"' \
    --set device.batch_clients=10
run severe-cpu 50 examples/fmnist_pfedgraph.toml "${severe[@]}" --set rounds=1
pfllib=(--set algorithm.name='"fedavg"' --set model.kind='"cnn-bn"' --set partition.kind='"dirichlet"'
    --set partition.beta=0.1 --set train.local_iterations=0 --set train.local_epochs=2
    --set train.batch_size=10 --set train.lr=0.005 --set train.momentum=0.0 --set train.weight_decay=0.0)
run pfllib-fedavg-cuda 100 examples/fmnist_pfedgraph.toml "${pfllib[@]}" --set device.backend='"cuda"'
run pfllib-fedavg-cuda-batched 100 examples/fmnist_pfedgraph.toml "${pfllib[@]}" \
    --set device.backend='"cuda"' --set device.batch_clients=10
fi

# 5. PyTorch on the same GPU.
if wanted torch && python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
    part torch-64 50 bash -c "python3 scripts/torch_cpu_throughput.py --device cuda --batch 64 > '$out/torch_cuda_b64.md'"
    part torch-10 50 bash -c "python3 scripts/torch_cpu_throughput.py --device cuda --batch 10 > '$out/torch_cuda_b10.md'"
fi

# The table.
python3 - "$out" "$gpu" "$cores" <<'EOF' | tee "$out/results.md"
import json, pathlib, sys
out, gpu, cores = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]
def lines(name):
    p = out / name
    return [json.loads(l) for l in p.read_text().splitlines() if l.strip()] if p.exists() else []
print(f"GPU: {gpu}; host: {cores} cores\n")
rows = lines("train_cuda.jsonl") + lines("train_cuda_b16.jsonl")
if rows:
    print("| model | batch | K | one-by-one client-steps/s | batched client-steps/s | batched samples/s |")
    print("|---|---:|---:|---:|---:|---:|")
    keyed = {}
    for r in rows:
        keyed.setdefault((r["model"], r["batch"], r["k"]), {})[r["mode"]] = r
    for (model, batch, k), m in keyed.items():
        one = m.get("one-by-one", {}).get("steps_per_s")
        bat = m.get("batched", {})
        f = lambda v, p=1: "—" if v is None else f"{v:,.{p}f}"
        print(f"| {model} | {batch} | {k} | {f(one)} | {f(bat.get('steps_per_s'))} | {f(bat.get('samples_per_s'), 0)} |")
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
for name in ("torch_cuda_b64.md", "torch_cuda_b10.md"):
    p = out / name
    if p.exists():
        print(p.read_text())
EOF
