#!/usr/bin/env python3
"""Compare FedDWA and FedAGHN with their baselines on Fashion-MNIST.

Usage: scripts/graph_methods_fmnist.py [--rounds R] [--max-train N] [--out DIR]

Two splits of 20 clients, both from the FedDWA/FedAGHN papers:
  - Dirichlet(0.1) per class ("practical 2" / FedAGHN's Dir(0.1));
  - groups: 4 groups of 5 consecutive clients sharing dominant classes
    (FedDWA's "practical 1", FedAGHN's case study), dominant fraction 0.8.
Model `cnn-bn` (FedAGHN's 4-layer CNN with BN, statistics local); one
local epoch per round (FedDWA's setting; FedAGHN's paper uses 5), batch 64,
SGD lr 0.01 without momentum (both papers); a seeded class-stratified
subsample of `--max-train` training images keeps a run within minutes.

Prints a Markdown table of mean test accuracy (best-validation protocol),
seconds per round and MB per client per round, and for the groups split how
much of each method's final graph stays inside a client's own group.
Runs already on disk are reused. Only the standard library.
"""
import argparse, json, os, subprocess, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target", "release", "fedweave")
CLIENTS, GROUPS = 20, 4
METHODS = ["feddwa", "fedaghn", "fedavg-ft", "local", "fedavg", "pfedgraph"]
SPLITS = {
    "dirichlet(0.1)": ["partition.kind=dirichlet", "partition.beta=0.1"],
    "groups(4)": ["partition.kind=groups", f"partition.groups={GROUPS}",
                  "partition.dominant_fraction=0.8"],
}
CONFIG = """seed = 1
clients = {clients}
rounds = {rounds}

[data]
dataset = "fashion-mnist"
max_train_samples = {max_train}

[partition]
kind = "iid"

[model]
kind = "cnn-bn"

[train]
local_iterations = 0
local_epochs = 1
batch_size = 64
lr = 0.01
momentum = 0.0
weight_decay = 0.0

[algorithm]
name = "fedavg"
"""


def run(config, out, overrides):
    summary = os.path.join(out, "summary.json")
    if not os.path.exists(summary):
        cmd = [BIN, "run", config, "--out", out] + [a for o in overrides for a in ("--set", o)]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(summary) as f:
        return json.load(f)


def in_group_share(graph):
    """Mean over clients of the off-diagonal weight that stays in the group."""
    group = lambda i: i * GROUPS // CLIENTS
    shares = []
    for i, row in enumerate(graph):
        off = sum(w for j, w in enumerate(row) if j != i)
        same = sum(w for j, w in enumerate(row) if j != i and group(j) == group(i))
        if off > 0:
            shares.append(same / off)
    return sum(shares) / len(shares) if shares else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--max-train", type=int, default=12000)
    ap.add_argument("--out", default=os.path.join(ROOT, "runs", "graph-methods-fmnist"))
    a = ap.parse_args()
    if not os.path.exists(BIN):
        subprocess.run(["cargo", "build", "--release", "-p", "fedweave-cli"], cwd=ROOT, check=True)
    os.makedirs(a.out, exist_ok=True)
    config = os.path.join(a.out, "base.toml")
    with open(config, "w") as f:
        f.write(CONFIG.format(clients=CLIENTS, rounds=a.rounds, max_train=a.max_train))
    start = time.time()
    print(f"## Fashion-MNIST, {CLIENTS} clients, cnn-bn, {a.rounds} rounds, "
          f"{a.max_train} training images\n")
    print("| method | " + " | ".join(SPLITS) + " | s/round | MB up/down per client-round "
          "| in-group share of off-diagonal weight (groups) |")
    print("|---|" + "---|" * (len(SPLITS) + 3))
    for method in METHODS:
        cells, spr, mb, share = [], [], "", ""
        for name, ov in SPLITS.items():
            tag = name.replace("(", "").replace(")", "").replace(".", "")
            s = run(config, os.path.join(a.out, f"{method}-{tag}-r{a.rounds}"),
                    ov + [f"algorithm.name={method}"])
            cells.append(f"{100 * s['mean_test_acc']:.2f}")
            spr.append(s["seconds_per_round_median"])
            per = CLIENTS * a.rounds * 1e6
            mb = f"{s['bytes_up'] / per:.2f} / {s['bytes_down'] / per:.2f}"
            if name.startswith("groups"):
                share = f"{in_group_share(s['final_graph']):.2f}"
        print(f"| {method} | " + " | ".join(cells)
              + f" | {sum(spr) / len(spr):.1f} | {mb} | {share} |", flush=True)
    print(f"\n(total {time.time() - start:.0f} s; chance in-group share = "
          f"{(CLIENTS // GROUPS - 1) / (CLIENTS - 1):.2f})")


if __name__ == "__main__":
    main()
