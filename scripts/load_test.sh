#!/usr/bin/env bash
# Loopback load test of the networked runtime (issue 14): CLIENTS clients
# hosted by WORKERS `fedweave worker` processes, FedAvg with `cnn-bn` on
# 1x28x28 inputs (582,218 parameters, 2.33 MB a model), ROUNDS rounds. Each
# client's data is its own small pair of CSV files (`data.dataset = "csv"`:
# 16 training and 4 test rows of random pixels) and local work is one step of
# batch 8, so the round time is the runtime's: encoding, gRPC transfer,
# decoding, checks, aggregation and bookkeeping, plus the clients' small
# training and scoring. Prints the round latencies, the server's peak memory,
# the payload throughput, and the raw loopback bandwidth of one TCP stream
# measured here.
#
#   scripts/load_test.sh                 # 200 clients, 4 workers, 4 rounds
#   CLIENTS=50 ROUNDS=2 scripts/load_test.sh
#   MODEL=mlp scripts/load_test.sh       # an MLP of the same size (2,699
#                                        # inputs: 582,210 parameters) whose
#                                        # compute is ~30x smaller: the round
#                                        # time is then mostly the runtime's
#
# Needs a release build (cargo build --release -p fedweave-cli). Bounded:
# every process is killed after LIMIT seconds (default 900).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/fedweave}
CLIENTS=${CLIENTS:-200}
WORKERS=${WORKERS:-4}
ROUNDS=${ROUNDS:-4}
LIMIT=${LIMIT:-900}
MODEL=${MODEL:-cnn-bn}
if [ "$MODEL" = mlp ]; then FEATURES=2699; SHAPE="shape = [2699]"; else FEATURES=784; SHAPE="shape = [1, 28, 28]"; fi
dir=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$dir"' EXIT

python3 - "$dir" "$CLIENTS" "$FEATURES" <<'PY'
import os, random, sys
d, n, features = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(1)
for i in range(n):
    os.makedirs(f"{d}/data/{i}")
    for name, rows in (("train", 16), ("test", 4)):
        with open(f"{d}/data/{i}/{name}.csv", "w") as f:
            for _ in range(rows):
                px = ",".join(str(rng.randrange(256) / 255) for _ in range(features))
                f.write(f"{rng.randrange(10)},{px}\n")
PY

cat > "$dir/cfg.toml" <<EOF
seed = 1
clients = $CLIENTS
rounds = $ROUNDS
threads = 1
round_timeout = $LIMIT
[data]
dataset = "csv"
path = "$dir/data/{id}"
classes = 10
$SHAPE
[partition]
kind = "natural"
[model]
kind = "$MODEL"
[train]
local_iterations = 1
batch_size = 8
[algorithm]
name = "fedavg"
EOF

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
start=$(date +%s.%N)
timeout "$LIMIT" /usr/bin/time -f "%M %U %S" -o "$dir/server.mem" \
  "$BIN" serve "$dir/cfg.toml" --listen "127.0.0.1:$port" --out "$dir/run" \
  > "$dir/server.out" 2> "$dir/server.err" &
server=$!
per=$(( (CLIENTS + WORKERS - 1) / WORKERS ))
for ((w = 0; w < WORKERS; w++)); do
  a=$((w * per)); b=$(( (w + 1) * per < CLIENTS ? (w + 1) * per : CLIENTS ))
  timeout "$LIMIT" /usr/bin/time -f "%M" -o "$dir/worker$w.mem" \
    "$BIN" worker "$dir/cfg.toml" --connect "http://127.0.0.1:$port" --ids "$a..$b" \
    > /dev/null 2> "$dir/worker$w.err" &
done
wait "$server" || { cat "$dir/server.err"; exit 1; }
wait
end=$(date +%s.%N)

python3 - "$dir" "$start" "$end" <<'EOF'
import json, os, socket, sys, threading, time
d, start, end = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
rounds = [json.loads(l) for l in open(os.path.join(d, "run", "rounds.jsonl"))]
def fields(f):
    return open(os.path.join(d, f)).read().split("\n")[-2].split()
mem = lambda f: int(fields(f)[0]) / 1024
workers = sorted(f for f in os.listdir(d) if f.startswith("worker") and f.endswith(".mem"))
print(f"clients {len(rounds[0]['participants'])}, rounds {len(rounds)}, "
      f"wall {end - start:.1f} s (joins and data loading included)")
for r in rounds:
    mb = (r["bytes_up"] + r["bytes_down"]) / 1e6
    print(f"round {r['round']}: {r['seconds']:.2f} s, {mb:.0f} MB of models up + down, "
          f"{mb / r['seconds']:.0f} MB/s, absent {r.get('absent', [])}")
steady = rounds[1:] or rounds
sec = sorted(r["seconds"] for r in steady)[len(steady) // 2]
mb = (steady[0]["bytes_up"] + steady[0]["bytes_down"]) / 1e6
print(f"median round (after the first) {sec:.2f} s: {mb / sec:.0f} MB/s of model payload")
cpu = sum(float(x) for x in fields("server.mem")[1:3])
print(f"server CPU (user + system) {cpu:.1f} s in all, {cpu / len(rounds):.2f} s a round")
print(f"server peak RSS {mem('server.mem'):.0f} MiB; workers "
      + ", ".join(f"{mem(w):.0f}" for w in workers) + " MiB")

# Raw loopback bandwidth: one TCP stream, 2 GiB in 4 MiB writes.
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(1)
total, chunk = 2 << 30, b"\0" * (4 << 20)
def sink():
    c, _ = srv.accept(); got = 0
    while got < total:
        n = len(c.recv(4 << 20))
        if n == 0: break
        got += n
t = threading.Thread(target=sink); t.start()
s = socket.create_connection(srv.getsockname()); t0 = time.time()
for _ in range(total // len(chunk)): s.sendall(chunk)
s.close(); t.join(); dt = time.time() - t0
print(f"raw loopback, one TCP stream: {total / dt / 1e6:.0f} MB/s")
EOF
