#!/usr/bin/env python3
"""PyTorch's CPU training throughput on fedweave's models, for the per-core
comparison of issue 16 (docs/results.md, "Per-core training throughput").

Same work as `cargo bench -p fedweave-nn --bench train_throughput`: one SGD
step (lr 0.01, momentum 0.9, dampening 0, weight decay 1e-5) of a batch of 64 random
1x28x28 images = forward, cross-entropy, backward, update. The models are
fedweave's `cnn` (pFedGraph's SimpleCNN, 44,426 parameters) and `cnn-bn`
(PFLlib's FedAvgCNN with batch norm, 582,218). Prints steps/s and
samples/s at 1 and 2 intra-op threads, median of 5 runs after a warm-up.

    python3 scripts/torch_cpu_throughput.py [--steps 50]
"""
import argparse
import statistics
import time

import torch
import torch.nn as nn


def simple_cnn():
    return nn.Sequential(
        nn.Conv2d(1, 6, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(256, 120), nn.ReLU(),
        nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 10))


def cnn_bn():
    return nn.Sequential(
        nn.Conv2d(1, 32, 5), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(1024, 512), nn.ReLU(), nn.Linear(512, 10))


def steps_per_second(model, steps, batch=64):
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-5)
    loss_fn = nn.CrossEntropyLoss()
    x = torch.randn(batch, 1, 28, 28)
    y = torch.randint(0, 10, (batch,))

    def run(n):
        for _ in range(n):
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()

    run(10)
    rates = []
    for _ in range(5):
        t = time.perf_counter()
        run(steps)
        rates.append(steps / (time.perf_counter() - t))
    return statistics.median(rates)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=50)
    a = ap.parse_args()
    print(f"torch {torch.__version__}")
    print("| model | parameters | threads | steps/s | samples/s |")
    print("|---|---:|---:|---:|---:|")
    for name, make in [("cnn", simple_cnn), ("cnn-bn", cnn_bn)]:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            torch.manual_seed(0)
            model = make()
            params = sum(p.numel() for p in model.parameters())
            r = steps_per_second(model, a.steps)
            print(f"| {name} | {params:,} | {threads} | {r:.1f} | {64 * r:,.0f} |")


if __name__ == "__main__":
    main()
