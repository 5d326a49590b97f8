#!/usr/bin/env python3
"""Reproduce pFedGraph's Table 1 (Fashion-MNIST) and Table 3 (attacks) with fedweave.

Usage: scripts/pfedgraph_tables.py [--rounds R] [--out runs/pfedgraph-tables] [--only table1|table3]

Runs `fedweave run examples/fmnist_pfedgraph.toml` with the settings of the
paper (Extreme = pathological K=5, Severe = K=10, Modest = Dirichlet 0.1,
Homo = iid; cnn; 200 local iterations; batch 64; lr 0.01; momentum 0.9;
wd 1e-5) and prints fedweave's mean test accuracy (best-validation protocol,
scored before and after local training each round as pFedGraph's code does:
`eval.when=before_and_after`) next to the paper's numbers, as a Markdown
table. Only the standard library.
"""
import argparse, json, os, subprocess, sys, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target", "release", "fedweave")
CONFIG = os.path.join(ROOT, "examples", "fmnist_pfedgraph.toml")

SETTINGS = {
    "Extreme": ["clients=5", "partition.kind=pathological"],
    "Severe": ["clients=10", "partition.kind=pathological"],
    "Modest": ["clients=10", "partition.kind=dirichlet", "partition.beta=0.1"],
    "Homo": ["clients=10", "partition.kind=iid"],
}
PAPER_T1 = {  # Fashion-MNIST, pFedGraph paper Table 1
    "pfedgraph": [99.46, 99.39, 96.46, 87.25],
    "local": [99.46, 99.32, 96.44, 84.88],
    "fedavg": [96.15, 95.37, 84.51, 87.27],
    "fedavg-ft": [99.25, 99.09, 96.33, 86.23],
}
ATTACKS = ["shuffle", "same_value", "sign_flip", "gaussian"]


def run(out, overrides):
    summary = os.path.join(out, "summary.json")
    if not os.path.exists(summary):
        overrides = overrides + ["eval.when=before_and_after"]
        cmd = [BIN, "run", CONFIG, "--out", out] + [a for o in overrides for a in ("--set", o)]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(summary) as f:
        return json.load(f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--out", default=os.path.join(ROOT, "runs", "pfedgraph-tables"))
    ap.add_argument("--only", choices=["table1", "table3"])
    a = ap.parse_args()
    if not os.path.exists(BIN):
        subprocess.run(["cargo", "build", "--release", "-p", "fedweave-cli"], cwd=ROOT, check=True)
    start = time.time()
    if a.only != "table3":
        print(f"## Table 1, Fashion-MNIST, {a.rounds} rounds (fedweave / paper at 50 rounds)\n")
        print("| method | " + " | ".join(SETTINGS) + " | s/round (Severe) |")
        print("|---|" + "---|" * (len(SETTINGS) + 1))
        for algo, paper in PAPER_T1.items():
            cells, spr = [], ""
            for (name, ov), p in zip(SETTINGS.items(), paper):
                s = run(os.path.join(a.out, f"t1-{algo}-{name}-r{a.rounds}"),
                        ov + [f"algorithm.name={algo}", f"rounds={a.rounds}"])
                cells.append(f"{100 * s['mean_test_acc']:.2f} / {p:.2f}")
                if name == "Severe":
                    spr = f"{s['seconds_per_round_median']:.1f}"
            print(f"| {algo} | " + " | ".join(cells) + f" | {spr} |")
            sys.stdout.flush()
    if a.only != "table1":
        print(f"\n## Table 3 analogue: Fashion-MNIST Homo, r = 0.4, {a.rounds} rounds (benign clients)\n")
        print("| method | " + " | ".join(ATTACKS) + " |")
        print("|---|" + "---|" * len(ATTACKS))
        for algo in ["pfedgraph", "fedavg"]:
            cells = []
            for atk in ATTACKS:
                s = run(os.path.join(a.out, f"t3-{algo}-{atk}-r{a.rounds}"),
                        SETTINGS["Homo"] + [f"algorithm.name={algo}", f"rounds={a.rounds}",
                                            f"attack.kind={atk}", "attack.ratio=0.4"])
                cells.append(f"{100 * s['mean_test_acc']:.2f}")
            print(f"| {algo} | " + " | ".join(cells) + " |")
            sys.stdout.flush()
    print(f"\nwall time {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
