#!/usr/bin/env bash
# A/B of the batched trainer's GPU variants in one device call: each variant is a set of
# environment variables (FEDWEAVE_GROUPED_CONV, FEDWEAVE_BATCHED_BN, FEDWEAVE_BATCHED_LOSS,
# FEDWEAVE_GROUPED_DX, FEDWEAVE_CUDA_GRAPHS, ...). For every variant, alternated over --reps rounds:
#   - `fedweave bench` batched client-steps/s of `cnn-bn` (K = 10, batch 10: PFLlib's step)
#     and `cnn` (K = 100, batch 16: issue 25's "100 small models");
#   - PFLlib's FedAvg setting (10 clients, Dirichlet 0.1, `cnn-bn`, 2 local epochs of
#     batch 10, `batch_clients = 10`) for --rounds rounds: seconds per round, the training
#     phase per round, and whether each round was replayed from a CUDA graph or its
#     recording failed (the debug log's own lines).
#   - with --profile, where the `cnn-bn` step's device time goes (Nsight Compute over 900
#     launches with the graphs off, so that each kernel is seen): the top kernels by time.
# It writes few files, so that a device call's $OUT brings them all back (at most 8):
# OUT/summary.md (the tables), OUT/bench.jsonl, OUT/rounds.log (the runs' logs).
#
#   scripts/gpu_variants.sh --bin BIN --data DIR --out DIR [--reps 2] [--rounds 3]
#       [--backend cuda] [--seconds 2] [--profile] NAME=ENV[,ENV...] ...
#
# e.g. scripts/gpu_variants.sh --bin /tmp/fedweave --data /tmp/fm --out "$OUT" \
#        composed=FEDWEAVE_BATCHED_BN=product,FEDWEAVE_BATCHED_LOSS=composed default= \
#        dx=FEDWEAVE_GROUPED_DX=columns
# (`default=` is the binary's own choice). --backend cpu --seconds 0.2 --rounds 1 is a dry
# run on a machine without a GPU.
set -uo pipefail
cd "$(dirname "$0")/.."

bin="" data=/usr/share/datasets/fashion-mnist out=gpu-variants reps=2 rounds=3 backend=cuda secs=2
profile=0
variants=()
while [ $# -gt 0 ]; do
    case "$1" in
    --bin) bin=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --backend) backend=$2; shift 2 ;;
    --seconds) secs=$2; shift 2 ;;
    --profile) profile=1; shift ;;
    *=*) variants+=("$1"); shift ;;
    *) echo "gpu_variants.sh: unknown argument \`$1\` (expected an option or NAME=ENV,...)" >&2; exit 2 ;;
    esac
done
[ -x "$bin" ] || { echo "gpu_variants.sh: no binary at \`$bin\` (--bin)" >&2; exit 2; }
[ ${#variants[@]} -gt 0 ] || { echo "gpu_variants.sh: name at least one variant (NAME=ENV,...)" >&2; exit 2; }
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
: >"$out/bench.jsonl"
: >"$out/rounds.log"

# env_of VARIANT: the variant's variables, one word each.
env_of() { local spec=${1#*=}; echo "${spec//,/ }"; }
name_of() { echo "${1%%=*}"; }

# 1. Bench, alternated: every variant once per rep.
for rep in $(seq "$reps"); do
    for v in "${variants[@]}"; do
        for shape in "cnn-bn 10 10" "cnn 100 16"; do
            read -r model k batch <<<"$shape"
            # shellcheck disable=SC2046 # the variables are words on purpose
            line=$(timeout 120 env $(env_of "$v") "$bin" bench --backend "$backend" --model "$model" \
                --k "$k" --batch "$batch" --mode batched --seconds "$secs" --json 2>>"$out/rounds.log")
            echo "$line" | python3 -c '
import json, sys
for l in sys.stdin:
    if l.strip():
        r = json.loads(l); r["variant"] = sys.argv[1]; r["rep"] = int(sys.argv[2]); print(json.dumps(r))
' "$(name_of "$v")" "$rep" >>"$out/bench.jsonl"
        done
    done
done

# 2. PFLlib's FedAvg rounds, once per variant.
for v in "${variants[@]}"; do
    name=$(name_of "$v")
    echo "== $name: $(env_of "$v")" >>"$out/rounds.log"
    # shellcheck disable=SC2046
    timeout 300 env $(env_of "$v") RUST_LOG=fedweave=debug "$bin" run examples/fmnist_pfedgraph.toml \
        --out "$work/$name" --overwrite -q --set rounds="$rounds" --set data.path="\"$data\"" \
        --set algorithm.name='"fedavg"' --set model.kind='"cnn-bn"' --set partition.kind='"dirichlet"' \
        --set partition.beta=0.1 --set train.local_iterations=0 --set train.local_epochs=2 \
        --set train.batch_size=10 --set train.lr=0.005 --set train.momentum=0.0 \
        --set train.weight_decay=0.0 --set device.backend="\"$backend\"" --set device.batch_clients=10 \
        2>&1 | grep -E "round phases|replayed|could not be captured|Caused|error|mean test acc" \
        >>"$out/rounds.log"
    cp "$work/$name/rounds.jsonl" "$work/$name.rounds.jsonl" 2>/dev/null
done

# 3. Where the step's device time goes, per variant.
if [ "$profile" = 1 ] && command -v ncu >/dev/null; then
    for v in "${variants[@]}"; do
        # shellcheck disable=SC2046
        timeout 150 env $(env_of "$v") FEDWEAVE_CUDA_GRAPHS=0 ncu --metrics gpu__time_duration.sum \
            --clock-control none --cache-control none --launch-skip 600 --launch-count 900 --csv \
            --log-file "$work/ncu-$(name_of "$v").csv" "$bin" bench --backend "$backend" --seconds 10 \
            --model cnn-bn --k 10 --batch 10 --mode batched >/dev/null 2>>"$out/rounds.log"
    done
fi

# 4. The tables.
python3 - "$out" "$work" "${variants[@]}" <<'EOF' | tee "$out/summary.md"
import json, pathlib, re, statistics, sys
out, work = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
names = [v.split("=", 1)[0] for v in sys.argv[3:]]
envs = {v.split("=", 1)[0]: v.split("=", 1)[1] or "(the binary's defaults)" for v in sys.argv[3:]}
bench = [json.loads(l) for l in (out / "bench.jsonl").read_text().splitlines() if l.strip()]
print("| variant | environment | cnn-bn K=10 b10 client-steps/s | cnn K=100 b16 client-steps/s |")
print("|---|---|---:|---:|")
for n in names:
    cell = []
    for model in ("cnn-bn", "cnn"):
        xs = [r["steps_per_s"] for r in bench if r["variant"] == n and r["model"] == model]
        cell.append(" / ".join(f"{x:,.0f}" for x in xs) or "—")
    print(f"| {n} | `{envs[n]}` | {cell[0]} | {cell[1]} |")
print()
log = (out / "rounds.log").read_text().split("\n== ")
print("| variant | s/round (each round) | training s (each round) | rounds replayed | recordings failed | mean test acc |")
print("|---|---|---|---:|---:|---:|")
for n in names:
    part = next((p for p in log if p.lstrip("= ").startswith(n + ":")), "")
    train = re.findall(r"train_s=([0-9.]+)", part)
    replayed = len(re.findall(r"replayed from one CUDA graph", part))
    failed = len(re.findall(r"could not be captured", part))
    p = work / f"{n}.rounds.jsonl"
    rows = [json.loads(l) for l in p.read_text().splitlines()] if p.exists() else []
    secs = " / ".join(f"{r['seconds']:.2f}" for r in rows) or "—"
    acc = f"{rows[-1]['mean_test_acc']:.4f}" if rows else "—"
    print(f"| {n} | {secs} | {' / '.join(f'{float(t):.2f}' for t in train) or '—'} | {replayed} | {failed} | {acc} |")
print("\n(A failed recording is warned once per process: later failures show as rounds that were not replayed.)")
import collections, csv
for n in names:
    p = work / f"ncu-{n}.csv"
    if not p.exists():
        continue
    rows = [r for r in csv.reader(p.read_text().splitlines()) if len(r) > 5]
    head, rows = rows[0], rows[1:]
    name, value = head.index("Kernel Name"), head.index("Metric Value")
    total, count = collections.Counter(), collections.Counter()
    for r in rows:
        try:
            ns = float(r[value].replace(",", ""))
        except ValueError:
            continue
        total[r[name][:60]] += ns
        count[r[name][:60]] += 1
    all_ns = sum(total.values())
    print(f"\n**{n}**: {sum(count.values())} launches, {all_ns / 1e6:.2f} ms of device time")
    print("\n| share | launches | µs each | kernel |\n|---:|---:|---:|---|")
    for k, ns in total.most_common(15):
        print(f"| {100 * ns / all_ns:.1f} % | {count[k]} | {ns / count[k] / 1e3:.1f} | `{k}` |")
EOF
