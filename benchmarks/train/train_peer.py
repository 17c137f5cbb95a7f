#!/usr/bin/env python3
"""PyTorch's side of train_bench: the same training step as train_bench_worker.cpp, written the way
a PyTorch user writes it — torchvision's ResNet, a Dataset over the CIFAR-10 binary files with
torchvision's RandomCrop(32, padding=4) + RandomHorizontalFlip + Normalize, a DataLoader with one
worker process and a DistributedSampler, DistributedDataParallel over gloo, SGD. Started by
train_bench through torchrun; rank 0 writes its timings as JSON to --out.

With --device cuda (train_bench --gpu) it is PyTorch eager in one process: the model on cuda:0,
no process group, torch.autocast(float16) and torch.amp.GradScaler under --amp, each step
timed until the GPU has finished it."""
import argparse
import gc
import json
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import torchvision
import torchvision.transforms as T

MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)


class Cifar10(torch.utils.data.Dataset):
    def __init__(self, directory):
        raw = np.concatenate([np.fromfile(f"{directory}/data_batch_{i}.bin", dtype=np.uint8)
                              for i in range(1, 6)]).reshape(-1, 3073)
        self.labels = torch.from_numpy(raw[:, 0].astype(np.int64))
        self.images = torch.from_numpy(raw[:, 1:].reshape(-1, 3, 32, 32).copy())
        self.transform = T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(),
                                    T.ConvertImageDtype(torch.float), T.Normalize(MEAN, STD)])

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.transform(self.images[i]), self.labels[i]


def cifar_resnet18():
    net = torchvision.models.resnet18(num_classes=10)
    net.conv1 = nn.Conv2d(3, 64, 3, stride=1, padding=1, bias=False)  # the CIFAR stem
    nn.init.kaiming_normal_(net.conv1.weight, mode="fan_out", nonlinearity="relu")
    net.maxpool = nn.Identity()
    return net


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--data", default="")
    parser.add_argument("--out", default="")
    parser.add_argument("--turns", default="")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--amp", action="store_true")
    args = parser.parse_args()

    torch.set_num_threads(1)
    cuda = args.device == "cuda"
    if cuda:
        rank, world = 0, 1
        barrier = lambda: None  # noqa: E731
    else:
        dist.init_process_group("gloo")
        rank, world, barrier = dist.get_rank(), dist.get_world_size(), dist.barrier
    device = torch.device("cuda:0" if cuda else "cpu")
    torch.manual_seed(0)
    cifar = args.model == "resnet18"
    net = (cifar_resnet18() if cifar else torchvision.models.resnet50()).to(device)
    ddp = net if cuda else nn.parallel.DistributedDataParallel(net)
    sgd = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    scaler = torch.amp.GradScaler("cuda", enabled=args.amp and cuda)

    if cifar:
        dataset = Cifar10(args.data)
        sampler = torch.utils.data.distributed.DistributedSampler(dataset, world, rank)
        loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch, sampler=sampler,
                                             num_workers=1, prefetch_factor=4, drop_last=True,
                                             persistent_workers=True)
        state = {"epoch": 0, "it": iter(loader)}

        def next_batch():
            try:
                return next(state["it"])
            except StopIteration:
                state["epoch"] += 1
                sampler.set_epoch(state["epoch"])
                state["it"] = iter(loader)
                return next(state["it"])
    else:
        torch.manual_seed(rank + 1)
        fixed = (torch.randn(args.batch, 3, 224, 224).to(device),
                 torch.randint(0, 1000, (args.batch,)).to(device))

        def next_batch():
            return fixed

    # Turns with the driver: Note [Turns] in benchmarks/common/bench_process.h.
    go = done = None
    if args.turns and rank == 0:
        go = open(args.turns + ".go", "rb", buffering=0)
        done = open(args.turns + ".done", "wb", buffering=0)

    def step():
        if go is not None and not go.read(1):
            raise RuntimeError("the driver closed the turn FIFO")
        barrier()
        start = time.perf_counter()
        images, labels = next_batch()
        images, labels = images.to(device), labels.to(device)
        sgd.zero_grad()
        with torch.autocast(args.device, dtype=torch.float16 if cuda else torch.bfloat16,
                            enabled=args.amp):
            loss = F.cross_entropy(ddp(images), labels)
        scaler.scale(loss).backward()
        scaler.step(sgd)
        scaler.update()
        if cuda:
            torch.cuda.synchronize()
        ms = (time.perf_counter() - start) * 1e3
        barrier()
        if done is not None:
            done.write(b"d")
        return ms

    for _ in range(args.warmup):
        step()
    step_ms = [step() for _ in range(args.steps)]
    if rank == 0 and args.out:
        with open(args.out, "w") as f:
            json.dump({"impl": "pytorch", "model": args.model,
                       "parameters": sum(p.numel() for p in net.parameters()),
                       "step_ms": step_ms}, f)
    if not cuda:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # Frees DDP's reference cycles, and with them the process group, whose Gloo threads would
    # otherwise free their last work during interpreter exit and abort it under torch 2.x
    # (pytorch/pytorch#190489).
    gc.collect()
