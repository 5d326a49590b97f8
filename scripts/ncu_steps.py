#!/usr/bin/env python3
"""Where a training step's time goes on a GPU: the device's busy time per step
from an Nsight Compute trace, against the wall time per step `fedweave bench`
measured without the profiler.

Input: ncu's per-launch CSV (`ncu --metrics gpu__time_duration.sum --csv
--log-file F ...`) of a window of consecutive launches of one steady training
loop (launches of the warm-up skipped with --launch-skip). The loop launches
the same kernels in the same order every step, so the step is the shortest
period of the sequence of kernel names; the window's device time divided by
its whole steps is the device time per step. If the device time is far below
the wall time, the step waits on the host (per-launch work), not on kernels.

    python3 scripts/ncu_steps.py TRACE.csv [--wall-steps-per-s R] [--top 12]

Prints one markdown block: launches per step, device µs per step, the wall µs
per step and the device's busy share, then the kernels taking most device time.
"""
import argparse
import csv
import sys


def launches(path):
    """(kernel name, ns) per launch, in launch order."""
    with open(path, newline="") as f:
        rows = [line for line in f if line.startswith('"')]
    out = {}
    for r in csv.DictReader(rows):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        unit = r.get("Metric Unit", "nsecond")
        value = float(r["Metric Value"].replace(",", ""))
        scale = {"nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6}.get(unit, 1.0)
        out[int(r["ID"])] = (r["Kernel Name"], value * scale)
    return [out[i] for i in sorted(out)]


def period(names):
    """The shortest p with names[i] == names[i + p] for most i (70 %: a step
    may launch a few kernels more than the next, e.g. a buffer's first use or
    a copy burn makes only when a view is not contiguous; session 22's steps of
    `cnn-bn` differed by ~7 %)."""
    n = len(names)
    for p in range(1, n // 2 + 1):
        same = sum(names[i] == names[i + p] for i in range(n - p))
        if same >= 0.7 * (n - p):
            return p
    return None


def short(name, width=70):
    name = name.split("(")[0]
    return name if len(name) <= width else name[: width - 1] + "…"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--wall-steps-per-s", type=float)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--title", default=None)
    a = ap.parse_args()
    seq = launches(a.trace)
    if not seq:
        sys.exit(f"ncu_steps.py: no gpu__time_duration rows in {a.trace}")
    names = [k for k, _ in seq]
    p = period(names)
    print(f"**{a.title or a.trace}**: {len(seq)} launches profiled")
    print()
    if p is None:
        print("No repeating step found in the window (not a steady loop?).")
        return
    steps = len(seq) // p
    device_ns = sum(ns for _, ns in seq[: steps * p]) / steps
    print(f"- launches per step: {p}")
    print(f"- device time per step: {device_ns / 1e3:,.1f} µs ({device_ns / p / 1e3:.1f} µs per launch)")
    if a.wall_steps_per_s:
        wall_us = 1e6 / a.wall_steps_per_s
        print(f"- wall time per step (bench, no profiler): {wall_us:,.1f} µs; "
              f"device busy {100 * device_ns / 1e3 / wall_us:.0f} % of it; "
              f"{(wall_us - device_ns / 1e3) / p:.1f} µs of host time per launch")
    print()
    per = {}
    for k, ns in seq[: steps * p]:
        c, t = per.get(k, (0, 0.0))
        per[k] = (c + 1, t + ns)
    print("| kernel | launches per step | µs per step | share |")
    print("|---|---:|---:|---:|")
    total = sum(t for _, t in per.values())
    for k, (c, t) in sorted(per.items(), key=lambda kv: -kv[1][1])[: a.top]:
        print(f"| `{short(k)}` | {c / steps:g} | {t / steps / 1e3:,.1f} | {100 * t / total:.1f} % |")
    print()


if __name__ == "__main__":
    main()
