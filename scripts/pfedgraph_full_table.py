#!/usr/bin/env python3
"""pFedGraph's Table 1 Fashion-MNIST column at the full budget (issue 27): keeps each
finished run's summary.json from runs/full/ in experiments/full/results/ (the run folders
are not in git) and prints the markdown tables of docs/results.md, fedweave / paper, with
the seeds each cell has.

Usage: scripts/pfedgraph_full_table.py   (from anywhere; after scripts/pfedgraph_full.sh)
"""
import json
import shutil
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / "runs" / "full"
KEPT = ROOT / "experiments" / "full" / "results"
PARTS = ["extreme", "severe", "modest", "homo"]
METHODS = ["pfedgraph", "local", "fedavg", "fedavg-ft"]
# The paper's Table 1, Fashion-MNIST (METHODS.md §1).
PAPER = {
    "pfedgraph": [99.46, 99.39, 96.46, 87.25],
    "local": [99.46, 99.32, 96.44, 84.88],
    "fedavg": [96.15, 95.37, 84.51, 87.27],
    "fedavg-ft": [99.25, 99.09, 96.33, 86.23],
}


def keep_finished():
    """Copies every finished run's summary.json into KEPT."""
    KEPT.mkdir(parents=True, exist_ok=True)
    for summary in RUNS.glob("pfedgraph_t1_*/algorithm=*__seed=*/summary.json"):
        part = summary.parent.parent.name.removeprefix("pfedgraph_t1_")
        method, seed = summary.parent.name.removeprefix("algorithm=").split("__")
        shutil.copyfile(summary, KEPT / f"{part}__{method}__{seed}.json")


def cell(part, method, col):
    """'mean (seeds) / paper', bold when more than 2 points from the paper."""
    accs = [
        100 * json.loads(f.read_text())["mean_test_acc"]
        for f in sorted(KEPT.glob(f"{part}__{method}__seed=*.json"))
    ]
    paper = PAPER[method][col]
    if not accs:
        return f"— / {paper}"
    mean = statistics.mean(accs)
    seeds = "seed 1" if len(accs) == 1 else f"{len(accs)} seeds, ± {statistics.stdev(accs):.2f}"
    text = f"{mean:.2f} ({seeds})"
    if abs(mean - paper) > 2:
        text = f"**{text}**"
    return f"{text} / {paper}"


def table(variant):
    rows = ["| method | Extreme | Severe | Modest | Homo |", "|---|---|---|---|---|"]
    for method in METHODS:
        cells = [cell(part + variant, method, col) for col, part in enumerate(PARTS)]
        rows.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


if __name__ == "__main__":
    keep_finished()
    print("All of each client's samples (the authors' code):\n")
    print(table(""))
    print("\n3,072 samples per client (the paper):\n")
    print(table("_3072"))
