#!/usr/bin/env python3
"""PyTorch's CPU training throughput on fedweave's models, for the per-core
comparison of issue 16 (docs/results.md, "Per-core training throughput").

Same work as `cargo bench -p fedweave-nn --bench train_throughput`: one SGD
step (lr 0.01, momentum 0.9, dampening 0, weight decay 1e-5) of a batch of 64 random
1x28x28 images = forward, cross-entropy, backward, update. The models are
fedweave's `cnn` (pFedGraph's SimpleCNN, 44,426 parameters), `cnn-bn`
(PFLlib's FedAvgCNN with batch norm, 582,218), and on 3x32x32 `cnn-dwa`
(FedDWA's CNN), `resnet8` (FedDWA's) and `resnet9` (SFL's). Prints steps/s and
samples/s at 1 and 2 intra-op threads, median of 5 runs after a warm-up.
`--device cuda` measures the same steps on a GPU instead (scripts/gpu_bench.sh),
`--batch` changes the batch size.

    python3 scripts/torch_cpu_throughput.py [--steps 50] [--device cuda] [--batch 64]
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


class Basic(nn.Module):
    """He et al.'s basic block, 1x1-conv shortcut when the shape changes."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
            nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout))
        self.short = nn.Identity() if cin == cout and stride == 1 else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        return torch.relu(self.body(x) + self.short(x))


def resnet8():
    """FedDWA's resnet8 as fedweave builds it (crates/fedweave-nn/src/resnet.rs)."""
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
        nn.MaxPool2d(3, 2, 1), Basic(16, 16, 1), Basic(16, 32, 2), Basic(32, 64, 2),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))


def cnn_dwa():
    """FedDWA's CIFAR CNN as fedweave builds it (no dropout), on 3x32x32."""
    return nn.Sequential(
        nn.Conv2d(3, 32, 3), nn.ReLU(), nn.MaxPool2d(2), nn.BatchNorm2d(32),
        nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2), nn.BatchNorm2d(64),
        nn.Flatten(), nn.Linear(64 * 6 * 6, 512), nn.ReLU(), nn.Linear(512, 10))


def conv_bn(cin, cout):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())


class Residual(nn.Module):
    """SFL's ResNet-9 residual: x + two conv-BN-ReLU layers."""

    def __init__(self, c):
        super().__init__()
        self.body = nn.Sequential(conv_bn(c, c), conv_bn(c, c))

    def forward(self, x):
        return x + self.body(x)


def resnet9():
    """SFL's ResNet-9 ("BResidual") as fedweave builds it, on 3x32x32."""
    return nn.Sequential(
        conv_bn(3, 64), conv_bn(64, 128), nn.MaxPool2d(2), Residual(128),
        conv_bn(128, 256), nn.MaxPool2d(2), Residual(256), conv_bn(256, 256), nn.MaxPool2d(2),
        nn.AdaptiveMaxPool2d(1), nn.Flatten(), nn.Linear(256, 10))


def steps_per_second(model, steps, shape, batch=64, device="cpu"):
    model = model.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-5)
    loss_fn = nn.CrossEntropyLoss()
    x = torch.randn(batch, *shape, device=device)
    y = torch.randint(0, 10, (batch,), device=device)

    def run(n):
        for _ in range(n):
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()
        if device != "cpu":
            torch.cuda.synchronize()

    return median_rate(run, steps)


def median_rate(run, steps, warm_up=10):
    """Median over 5 timed calls of run(steps) of steps per second, after
    run(warm_up)."""
    run(warm_up)
    rates = []
    for _ in range(5):
        t = time.perf_counter()
        run(steps)
        rates.append(steps / (time.perf_counter() - t))
    return statistics.median(rates)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, default=64)
    a = ap.parse_args()
    where = torch.cuda.get_device_name() if a.device != "cpu" else "cpu"
    print(f"torch {torch.__version__} on {where}, batch {a.batch}")
    print("| model | parameters | threads | steps/s | samples/s |")
    print("|---|---:|---:|---:|---:|")
    # (name, model, input, share of --steps: resnet9 is ~50x the others' work)
    for name, make, shape, share in [
            ("cnn", simple_cnn, (1, 28, 28), 1), ("cnn-bn", cnn_bn, (1, 28, 28), 1),
            ("cnn-dwa", cnn_dwa, (3, 32, 32), 1), ("resnet8", resnet8, (3, 32, 32), 1),
            ("resnet9", resnet9, (3, 32, 32), 0.1)]:
        for threads in ((1, 2) if a.device == "cpu" else (torch.get_num_threads(),)):
            torch.set_num_threads(threads)
            torch.manual_seed(0)
            model = make()
            params = sum(p.numel() for p in model.parameters())
            steps = max(3, int(a.steps * share))
            r = steps_per_second(model, steps, shape, a.batch, a.device)
            print(f"| {name} | {params:,} | {threads} | {r:.1f} | {a.batch * r:,.0f} |")


if __name__ == "__main__":
    main()
