#!/usr/bin/env python3
"""PyTorch DDP side of ddp_step_bench: the same models, batch and step as ddp_step_worker.cpp,
under torch.nn.parallel.DistributedDataParallel with the gloo backend. Started by ddp_step_bench
through torchrun; rank 0 writes its timings as JSON to --out."""
import argparse
import gc
import json
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class BenchMlp(nn.Module):
    def __init__(self, width=4096, io=1024):
        super().__init__()
        self.fc1 = nn.Linear(io, width)
        self.fc2 = nn.Linear(width, width)
        self.fc3 = nn.Linear(width, io)

    def forward(self, x):
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


def conv(cin, cout, k, stride, pad):
    return nn.Conv2d(cin, cout, k, stride=stride, padding=pad, bias=False)


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = conv(cin, cout, 3, stride, 1)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = conv(cout, cout, 3, 1, 1)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(conv(cin, cout, 1, stride, 0), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + (self.downsample(x) if self.downsample is not None else x))


class ResNet18(nn.Module):
    def __init__(self, classes=10, base=64):
        super().__init__()
        self.conv1 = conv(3, base, 3, 1, 1)  # CIFAR stem: no stride, no max-pool
        self.bn1 = nn.BatchNorm2d(base)
        layers, cin = [], base
        for stage, width in enumerate([base, 2 * base, 4 * base, 8 * base]):
            blocks = []
            for block in range(2):
                blocks.append(BasicBlock(cin, width, 2 if stage > 0 and block == 0 else 1))
                cin = width
            layers.append(nn.Sequential(*blocks))
        self.layers = nn.ModuleList(layers)
        self.fc = nn.Linear(8 * base, classes)

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        for layer in self.layers:
            h = layer(h)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(h, 1), 1))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--out", default="")
    parser.add_argument("--turns", default="")
    parser.add_argument("--grad-as-bucket-view", action="store_true")
    parser.add_argument("--grad-copies", action="store_true")  # PyTorch's default anyway
    parser.add_argument("--compression", default="none", choices=["none", "fp16", "bf16"])
    args = parser.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    if args.model == "mlp":
        width, io = (64, 32) if args.smoke else (4096, 1024)
        net, classify = BenchMlp(width, io), False
        x, y = torch.randn(args.batch, io), torch.randn(args.batch, io)
    else:
        net, classify = ResNet18(10, 8 if args.smoke else 64), True
        x, y = torch.randn(args.batch, 3, 32, 32), torch.randint(0, 10, (args.batch,))
    ddp = nn.parallel.DistributedDataParallel(
        net, gradient_as_bucket_view=args.grad_as_bucket_view)
    if args.compression != "none":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        hook = (default_hooks.fp16_compress_hook if args.compression == "fp16"
                else default_hooks.bf16_compress_hook)
        ddp.register_comm_hook(None, hook)
    sgd = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)

    def step():
        sgd.zero_grad()
        out = ddp(x)
        loss = F.cross_entropy(out, y) if classify else F.mse_loss(out, y)
        loss.backward()
        sgd.step()

    # Turns with the driver: Note [Turns] in benchmarks/common/bench_process.h.
    go = done = None
    if args.turns and rank == 0:
        go = open(args.turns + ".go", "rb", buffering=0)
        done = open(args.turns + ".done", "wb", buffering=0)

    def turn(sync):
        if go is not None and not go.read(1):
            raise RuntimeError("the driver closed the turn FIFO")
        dist.barrier()
        start = time.perf_counter()
        if sync:
            step()
        else:
            with ddp.no_sync():
                step()
        ms = (time.perf_counter() - start) * 1e3
        dist.barrier()
        if done is not None:
            done.write(b"d")
        return ms

    for _ in range(args.warmup):
        turn(True)
    step_ms, nosync_ms = [], []
    for _ in range(args.steps):
        step_ms.append(turn(True))
        nosync_ms.append(turn(False))
    if rank == 0 and args.out:
        with open(args.out, "w") as f:
            json.dump({"impl": "pytorch", "model": args.model,
                       "parameters": sum(p.numel() for p in net.parameters()),
                       "step_ms": step_ms, "nosync_ms": nosync_ms}, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # Frees DDP's reference cycles, and with them the process group, whose Gloo threads would
    # otherwise free their last work during interpreter exit and abort it under torch 2.x
    # (pytorch/pytorch#190489).
    gc.collect()
