#!/usr/bin/env python3
"""Issue 11's and 12's baselines table from a finished sweep of
experiments/baselines_fmnist.toml (docs/results.md, "Baselines on Fashion-MNIST").

Usage: scripts/baselines_table.py [SWEEP_DIR]   (default runs/baselines_fmnist)

Prints, per method and split, the headline (mean over clients of the test
accuracy at each client's best validation round), the last round's mean test
accuracy, the median seconds per round and the megabytes moved per round (up +
down), next to pFedGraph's Table 1 numbers on Fashion-MNIST where the paper
reports the method (Severe = pathological 2 classes, Modest = Dirichlet 0.1; the
paper trains 50 rounds of 200 iterations). Only the standard library.
"""
import json, os, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAPER = {  # pFedGraph Table 1, Fashion-MNIST: (Severe, Modest)
    "pfedgraph": (99.39, 96.46),
    "local": (99.32, 96.44),
    "fedavg": (95.37, 84.51),
    "fedavg-ft": (99.09, 96.33),
}
ORDER = [
    "local", "fedavg", "fedavg-ft", "fedprox-ft", "pfedgraph", "ditto", "apfl", "fedala",
    "fedrep", "fedper", "lg-fedavg", "fedbabu", "fedrod", "fedproto", "knn-per", "fedphp",
    "fedpac", "fedcp", "per-fedavg", "pfedme", "scaffold", "feddyn", "fednova", "moon",
    "cfl", "ifca", "fedem", "fedamp", "h-fedamp", "fedfomo", "l2c", "apple", "pfedhn", "pfedla",
]
SPLITS = [("pathological", "Severe (2 classes)"), ("dirichlet", "Dir(0.1)")]


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "runs", "baselines_fmnist")
    runs = {}
    for d in sorted(os.listdir(root)):
        path = os.path.join(root, d, "summary.json")
        if not os.path.exists(path):
            continue
        with open(path) as f:
            s = json.load(f)
        key = dict(kv.split("=", 1) for kv in d.split("__"))
        runs[(key["algorithm"], key["partition"])] = s
    names = {m for (m, _) in runs}
    methods = [m for m in ORDER if m in names] + sorted(names - set(ORDER))
    head = "| method | " + " | ".join(
        f"{name}: best-val / last | s/round | MB/round" for _, name in SPLITS
    ) + " | paper (Severe / Modest) |"
    print(head)
    print("|---" * (2 + 3 * len(SPLITS)) + "|")
    for m in methods:
        cells = []
        for split, _ in SPLITS:
            s = runs.get((m, split))
            if s is None:
                cells += ["—", "—", "—"]
                continue
            mb = (s["bytes_up"] + s["bytes_down"]) / s["rounds"] / 1e6
            cells += [
                f"{100 * s['mean_test_acc']:.2f} / {100 * s['last_round_mean_test_acc']:.2f}",
                f"{s['seconds_per_round_median']:.2f}",
                f"{mb:.2f}",
            ]
        paper = PAPER.get(m)
        p = f"{paper[0]:.2f} / {paper[1]:.2f}" if paper else "—"
        print(f"| `{m}` | " + " | ".join(cells) + f" | {p} |")


if __name__ == "__main__":
    main()
