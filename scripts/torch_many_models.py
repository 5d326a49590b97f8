#!/usr/bin/env python3
"""K small models trained at once in PyTorch: the reference for fedweave's
batched clients (`fedweave bench --k K`, `[device] batch_clients`).

K copies of one of fedweave's models (`cnn` = pFedGraph's SimpleCNN, `cnn-bn`
= PFLlib's FedAvgCNN with batch norm) are stacked with `torch.func`
(`stack_module_state`, `vmap` over `grad` of a `functional_call`) and trained
together: each client its own batch, one SGD step with momentum 0.9 and weight
decay 1e-5 on every client per step (`torch._foreach_*` over the stacked
tensors), as fedweave's batched trainer does. Batch norm runs in training
mode without running statistics (vmap cannot update buffers in place).
Prints client-steps/s (K × stacked steps per second), median of 5 timed runs
after a warm-up, and the one-model loop for K = 1.

    python3 scripts/torch_many_models.py [--device cuda] [--batch 16] [--k 1 --k 10 --k 100]
"""
import argparse
import copy

import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, replace_all_batch_norm_modules_, stack_module_state, vmap

from torch_cpu_throughput import cnn_bn, median_rate, simple_cnn, steps_per_second


def stacked_rate(make, k, batch, device, steps):
    torch.manual_seed(0)
    models = [make().to(device) for _ in range(k)]
    for m in models:
        replace_all_batch_norm_modules_(m)
    params, buffers = stack_module_state(models)
    base = copy.deepcopy(models[0]).to("meta")

    def loss(p, b, x, y):
        return F.cross_entropy(functional_call(base, (p, b), (x,)), y)

    step_grads = vmap(grad(loss))
    names = list(params)
    theta = [params[n].detach() for n in names]
    bufs = [torch.zeros_like(t) for t in theta]
    x = torch.randn(k, batch, 1, 28, 28, device=device)
    y = torch.randint(0, 10, (k, batch), device=device)

    def run(n):
        for _ in range(n):
            g = step_grads(dict(zip(names, theta)), buffers, x, y)
            gs = [g[n] for n in names]
            torch._foreach_add_(gs, theta, alpha=1e-5)
            torch._foreach_mul_(bufs, 0.9)
            torch._foreach_add_(bufs, gs)
            torch._foreach_add_(theta, bufs, alpha=-0.01)
        if device != "cpu":
            torch.cuda.synchronize()

    return k * median_rate(run, steps, warm_up=3)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--k", type=int, action="append")
    ap.add_argument("--steps", type=int, default=20)
    a = ap.parse_args()
    ks = a.k or [1, 10, 100]
    where = torch.cuda.get_device_name() if a.device != "cpu" else "cpu"
    print(f"torch {torch.__version__} on {where}, batch {a.batch} per client")
    print("| model | K | one-model loop steps/s | stacked (vmap) client-steps/s |")
    print("|---|---:|---:|---:|")
    for name, make in [("cnn", simple_cnn), ("cnn-bn", cnn_bn)]:
        for k in ks:
            loop = "—"
            if k == 1:
                torch.manual_seed(0)
                loop = f"{steps_per_second(make(), a.steps * 5, (1, 28, 28), a.batch, a.device):,.1f}"
            stacked = stacked_rate(make, k, a.batch, a.device, a.steps)
            print(f"| {name} | {k} | {loop} | {stacked:,.1f} |", flush=True)


if __name__ == "__main__":
    main()
