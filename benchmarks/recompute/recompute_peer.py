#!/usr/bin/env python3
"""PyTorch's side of recompute_bench: one configuration in this process, the way a PyTorch user
recomputes activations -- torch.utils.checkpoint.checkpoint_sequential on an explicit
nn.Sequential: for ResNet-50, torchvision's resnet50() as Sequential(stem, its 16 blocks, head)
in 18 segments (the stem and each block recomputed; checkpoint_sequential runs the last segment,
the head, plainly), for the MLP the same Linear -> LayerNorm -> Tanh blocks in `segments`
segments. It is the non-reentrant checkpoint (use_reentrant=False), the one PyTorch 2.x
recommends; --reentrant runs the reentrant one (1.x had only that, which LOG.md's earlier results
measured), which gives the first segment's parameters no gradient unless its input requires grad:
the input is then made to require grad (the documented workaround; it adds the first layer's input
gradient).
Tensor bytes are counted by dtrain's counting allocator (--counting-lib, loaded after torch: the
same libc10), on the GPU by torch.cuda's statistics. Writes one JSON line to --out."""
import argparse
import ctypes
import json
import os
import resource
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint_sequential

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from stats import median  # noqa: E402


def resnet50_sequential():
    import torchvision  # only here: the MLP's runs do without it
    net = torchvision.models.resnet50()
    stem = nn.Sequential(net.conv1, net.bn1, net.relu, net.maxpool)
    blocks = [b for layer in (net.layer1, net.layer2, net.layer3, net.layer4) for b in layer]
    head = nn.Sequential(net.avgpool, nn.Flatten(1), net.fc)
    return nn.Sequential(stem, *blocks, head)


def deep_mlp(blocks, width):
    layers = []
    for _ in range(blocks):
        layers += [nn.Linear(width, width), nn.LayerNorm(width), nn.Tanh()]
    return nn.Sequential(*layers)


class CpuBytes:
    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        for name in ("dtrain_counting_live", "dtrain_counting_peak"):
            getattr(self.lib, name).restype = ctypes.c_int64
        self.lib.dtrain_counting_install()

    def live(self):
        return self.lib.dtrain_counting_live()

    def peak(self):
        return self.lib.dtrain_counting_peak()

    def reset_peak(self):
        self.lib.dtrain_counting_reset_peak()


class CudaBytes:
    def live(self):
        return torch.cuda.memory_allocated(0)

    def peak(self):
        return torch.cuda.max_memory_allocated(0)

    def reset_peak(self):
        torch.cuda.reset_peak_memory_stats(0)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="resnet50")
    p.add_argument("--recompute", action="store_true")
    p.add_argument("--gpu", action="store_true")
    p.add_argument("--reentrant", action="store_true")
    for name, default in (("batch", 16), ("size", 224), ("blocks", 64), ("width", 256),
                          ("segments", 8), ("warmup", 1), ("steps", 3), ("threads", 1)):
        p.add_argument("--" + name, type=int, default=default)
    p.add_argument("--counting-lib", default="")
    p.add_argument("--out", required=True)
    a = p.parse_args()

    torch.set_num_threads(a.threads)
    device = torch.device("cuda:0" if a.gpu else "cpu")
    memory = CudaBytes() if a.gpu else CpuBytes(a.counting_lib)
    torch.manual_seed(1)
    if a.model == "resnet50":
        net = resnet50_sequential().to(device)
        segments = len(net)
        x = torch.randn(a.batch, 3, a.size, a.size, device=device)
        target = torch.randint(0, 1000, (a.batch,), device=device)
    else:
        net = deep_mlp(a.blocks, a.width).to(device)
        segments = a.segments
        x = torch.randn(a.batch, a.width, device=device)
        target = None
    if a.recompute and a.reentrant:
        x.requires_grad_()
    sgd = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    scaler = torch.amp.GradScaler("cuda", enabled=a.gpu)
    sync = torch.cuda.synchronize if a.gpu else (lambda: None)

    fwd, bwd, step = [], [], []
    kept = peak = 0
    first_loss = first_grad_sum = 0.0
    for s in range(a.warmup + a.steps):
        sync()
        t0 = time.perf_counter()
        # The gradients go (2.x's default, as libtorch's zero_grad() on dtrain's side): both peaks
        # count the gradients backward makes.
        sgd.zero_grad(set_to_none=True)
        base = memory.live()
        memory.reset_peak()
        with torch.autocast(device.type, enabled=a.gpu):
            out = (checkpoint_sequential(net, segments, x, use_reentrant=a.reentrant) if a.recompute
                   else net(x))
            loss = F.cross_entropy(out, target) if target is not None else out.pow(2).mean()
        del out
        sync()
        t1 = time.perf_counter()
        kept = memory.live() - base
        scaler.scale(loss).backward()
        sync()
        t2 = time.perf_counter()
        peak = memory.peak() - base
        if s == 0:
            first_loss = loss.item()
            first_grad_sum = sum(p.grad.sum().item() for p in net.parameters())
        del loss
        scaler.step(sgd)
        scaler.update()
        sync()
        t3 = time.perf_counter()
        if s >= a.warmup:
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
            step.append(t3 - t0)
    with open(a.out, "w") as f:
        json.dump({"forward_s": median(fwd), "backward_s": median(bwd), "step_s": median(step),
                   "kept_bytes": kept, "peak_bytes": peak, "first_loss": first_loss,
                   "first_grad_sum": first_grad_sum,
                   "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}, f)
        f.write("\n")


if __name__ == "__main__":
    main()
