#!/usr/bin/env python3
"""PyTorch's side of zero_peer_bench.py: zero_bench's DeepMlp (io -> width, layers - 2 hidden
width x width, width -> io, ReLU between; Adam(lr 1e-4); MSE) trained the way a PyTorch 2.x user
shards it, over Gloo on the CPU, under `launch --python PYTHON`:
  fsdp2  fully_shard on every Linear and on the root (device mesh of the world, defaults:
         reshard after forward, parameters and gradients in float32), beside ZeRO-3;
  zero1  DistributedDataParallel with torch.distributed.optim.ZeroRedundancyOptimizer(Adam),
         which gives each rank whole parameters to step and broadcasts them, beside ZeRO-1.
Every rank builds the model from seed 0 and draws its batch from seed 1 + rank.

Per timed step (rank 0): its time, the bus bytes of the collectives it issued -- counted by
wrapping torch.distributed's functions that FSDP2 and ZeroRedundancyOptimizer call (looked up on
the module at each call, so the wrapper takes effect), as dtrain's Communicator::payloadBytes()
counts them -- and the bytes the process wrote (/proc/self/io wchar: Gloo's sockets). DDP's
allreduces run in its C++ reducer, past the wrappers: zero1's bus bytes are not counted. Every
rank's peak of CPU tensor storage in a step comes from dtrain's counting allocator (--counting-lib,
loaded right after torch, before any tensor of the job; the same libc10), and its optimizer's
state from the state's storages.

--check trains --steps steps and compares, on rank 0, the averaged gradients of the first step
and the parameters at the end with one process training the same model on the whole batch (every
rank's batch, concatenated): Gloo's AVG has an open silent-correctness report (pytorch #162338),
and Adam alone would not notice gradients off by a constant factor.

  launch --nproc-per-node 2 --python .venv/bin/python3 benchmarks/zero/zero_peer.py \\
      --mode fsdp2 --counting-lib build/librecompute_counting.so --out peer.json
"""
import argparse
import ctypes
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

CHECK_TOLERANCE = 1e-5  # relative, of a tensor's norm


class CountingBytes:
    """dtrain's counting CPU allocator (testing/counting_allocator.h) in this process."""

    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        for name in ("dtrain_counting_live", "dtrain_counting_peak"):
            getattr(self.lib, name).restype = ctypes.c_int64
        self.lib.dtrain_counting_install()

    def peak(self):
        return self.lib.dtrain_counting_peak()

    def reset_peak(self):
        self.lib.dtrain_counting_reset_peak()


class BusBytes:
    """Bus bytes of the collectives issued through torch.distributed's Python functions, counted
    as nccl-tests (and dtrain's payloadBytes()) count them: allreduce 2(n-1)/n of its buffer,
    all-gather and reduce-scatter (n-1)/n of the whole n-block buffer, broadcast its buffer. Only
    the outermost call counts, whichever function it is built from."""

    def __init__(self):
        self.bytes = 0
        self.depth = 0
        n = dist.get_world_size()

        def size(t):
            return t.numel() * t.element_size()

        def wrap(name, busbytes):
            inner = getattr(dist, name)

            def counted(*args, **kwargs):
                if self.depth == 0:
                    self.bytes += busbytes(*args, **kwargs)
                self.depth += 1
                try:
                    return inner(*args, **kwargs)
                finally:
                    self.depth -= 1
            setattr(dist, name, counted)

        def arg(args, kwargs, index, name):
            return kwargs[name] if name in kwargs else args[index]
        wrap("all_reduce", lambda *a, **k: 2 * (n - 1) / n * size(arg(a, k, 0, "tensor")))
        wrap("broadcast", lambda *a, **k: size(arg(a, k, 0, "tensor")))
        wrap("all_gather_single",
             lambda *a, **k: (n - 1) / n * size(arg(a, k, 0, "output_tensor")))
        wrap("all_gather_into_tensor",
             lambda *a, **k: (n - 1) / n * size(arg(a, k, 0, "output_tensor")))
        for name in ("reduce_scatter_single", "reduce_scatter_tensor"):
            wrap(name, lambda *a, **k: (n - 1) / n * size(arg(a, k, 1, "input")))

def written_bytes():
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("wchar:"):
                return int(line.split()[1])
    return 0


def deep_mlp(a):
    layers = []
    for i in range(a.layers):
        layers.append(nn.Linear(a.io if i == 0 else a.width,
                                a.io if i + 1 == a.layers else a.width))
        if i + 1 < a.layers:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def batch_of(a, rank):
    g = torch.Generator()
    g.manual_seed(1 + rank)
    return torch.randn(a.batch, a.io, generator=g), torch.randn(a.batch, a.io, generator=g)


def adam(params):
    return torch.optim.Adam(params, lr=1e-4)


def full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def relative_error(got, want):
    return ((got - want).norm() / want.norm().clamp_min(1e-30)).item()


def reference(a, world):
    """One process, the whole batch: the first step's gradients and the final parameters."""
    torch.manual_seed(0)
    model = deep_mlp(a)
    optimizer = adam(model.parameters())
    batches = [batch_of(a, r) for r in range(world)]
    x = torch.cat([b[0] for b in batches])
    y = torch.cat([b[1] for b in batches])
    grads = {}
    for step in range(a.steps):
        optimizer.zero_grad(set_to_none=True)
        F.mse_loss(model(x), y).backward()
        if step == 0:
            grads = {k: p.grad.clone() for k, p in model.named_parameters()}
        optimizer.step()
    return grads, {k: p.detach().clone() for k, p in model.named_parameters()}


def state_bytes(optimizer):
    seen, total = set(), 0
    for state in optimizer.state.values():
        for t in state.values():
            t = t.to_local() if hasattr(t, "to_local") else t  # FSDP2's: this rank's shard
            if torch.is_tensor(t) and t.untyped_storage().data_ptr() not in seen:
                seen.add(t.untyped_storage().data_ptr())
                total += t.untyped_storage().nbytes()
    return total


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["fsdp2", "zero1"], required=True)
    for name, default in (("width", 1024), ("io", 256), ("layers", 6), ("batch", 16),
                          ("warmup", 2), ("steps", 5)):
        p.add_argument("--" + name, type=int, default=default)
    p.add_argument("--check", action="store_true")
    p.add_argument("--counting-lib", required=True)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    counting = CountingBytes(a.counting_lib)  # before any tensor of the job
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    bus = BusBytes()

    torch.manual_seed(0)
    model = deep_mlp(a)
    parameters = sum(t.numel() for t in model.parameters())
    if a.mode == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (world,))
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        net, optimizer, inner = model, adam(model.parameters()), None
    else:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        net = torch.nn.parallel.DistributedDataParallel(model)
        optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam,
                                            lr=1e-4)
        inner = optimizer.optim
    x, y = batch_of(a, rank)

    step_ms, payload, written, peak = [], [], [], 0
    first_grads = {}
    total = a.steps if a.check else a.warmup + a.steps
    for step in range(total):
        dist.barrier()
        bus0, written0 = bus.bytes, written_bytes()
        counting.reset_peak()
        t0 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        F.mse_loss(net(x), y).backward()
        if a.check and step == 0:
            first_grads = {k: full(t.grad).clone() for k, t in model.named_parameters()}
        optimizer.step()
        t1 = time.perf_counter()
        if step >= (0 if a.check else a.warmup):
            step_ms.append(1e3 * (t1 - t0))
            payload.append(bus.bytes - bus0)
            written.append(written_bytes() - written0)
            peak = max(peak, counting.peak())
    dist.barrier()
    state = state_bytes(inner if inner is not None else optimizer)
    per_rank = torch.tensor([float(peak), float(state)], dtype=torch.float64)
    ranks = [torch.zeros_like(per_rank) for _ in range(world)]
    dist.all_gather(ranks, per_rank)
    result = {"mode": a.mode, "world": world, "parameters": parameters,
              "torch": torch.__version__, "step_ms": step_ms, "payload_bytes": payload,
              "socket_bytes": written,
              "step_peak_storage_bytes": [r[0].item() for r in ranks],
              "optimizer_state_bytes": [r[1].item() for r in ranks]}
    if a.check:
        final = {k: full(t.detach()).clone() for k, t in model.named_parameters()}
        if rank == 0:
            want_grads, want_params = reference(a, world)
            result["check"] = {
                "steps": a.steps,
                "gradient_error": max(relative_error(first_grads[k], g)
                                      for k, g in want_grads.items()),
                "parameter_error": max(relative_error(final[k], w)
                                       for k, w in want_params.items()),
                "tolerance": CHECK_TOLERANCE}
            c = result["check"]
            c["passed"] = max(c["gradient_error"], c["parameter_error"]) <= CHECK_TOLERANCE
    if rank == 0:
        with open(a.out, "w") as f:
            json.dump(result, f)
            f.write("\n")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # Every result is written and every rank met at the barrier: the interpreter's teardown is
    # skipped, where PyTorch 2.14's Gloo and FSDP2/DCP threads have aborted it ("terminate
    # called without an active exception") in a peer that had finished its work.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
