"""train_gpt's peer: the same model (gpt_model.py), data, schedule and optimizer, trained the way a
PyTorch 2.14 user would -- DDP, or FSDP2 (fully_shard per block and on the root, with
MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32) under --amp), and
torch.utils.checkpoint(use_reentrant=False) per block under --recompute -- over Gloo, under
`launch --python PYTHON` or torchrun. It reads the same flags as train_gpt for what they share
(the preset, and --layers, --heads, --dim, --context over it), draws the same batches (windows at
offsets from a generator seeded as train_gpt seeds its own) and writes one JSON record per step
(rank 0): the loss, the step's seconds, and at the end the validation loss over the windows
train_gpt evaluates at its end (--eval-batches, spread over the ranks: the validation text is
held from the start, as train_gpt holds it) and every rank's peak resident set.

--counting-lib PATH loads librecompute_counting.so (benchmarks/recompute/counting_library.cpp, the
tests' counting CPU allocator) first thing in main(), before the process group and the model:
every CPU tensor's storage is then counted as train_gpt's is under gpt_bench's memory pass. With
DTRAIN_COUNTING_PEAK_FILE=PREFIX in the environment the library writes this rank's peak of live
tensor bytes over the whole run to PREFIX.<RANK> at exit, as it does for train_gpt loaded with
LD_PRELOAD.

  launch --nproc-per-node 2 --python .venv/bin/python3 benchmarks/gpt/gpt_peer.py \\
      --mode fsdp2 --steps 20 --data corpus.txt --init-from init.pt --metrics-file peer.jsonl
"""
import argparse
import contextlib
import ctypes
import dataclasses
import json
import math
import os
import resource
import sys
import time

import torch
import torch.distributed as dist
from torch.nn import functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_model import GPT, GPTConfig  # noqa: E402

COUNTING = None  # the counting library, under --counting-lib

MASK = (1 << 64) - 1


def generator_for(seed, step, micro, rank):
    """train_gpt's generatorFor: splitmix64 of (seed, step, micro-batch, rank)."""
    z = seed & MASK
    for v in (step, micro, rank):
        z = (z + 0x9E3779B97F4A7C15 + (v & MASK)) & MASK
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        z ^= z >> 31
    g = torch.Generator()
    g.manual_seed(z)
    return g


def read_corpus(path):
    if os.path.isdir(path):
        names = sorted(n for n in os.listdir(path)
                       if os.path.isfile(os.path.join(path, n))
                       and not os.path.islink(os.path.join(path, n)) and not n.endswith(".dat"))
        return b"".join(open(os.path.join(path, n), "rb").read() for n in names)
    return open(path, "rb").read()


def lr_at(a, s):
    if s < a.warmup_steps:
        return a.lr * (s + 1) / a.warmup_steps
    floor = a.lr * a.min_lr_ratio
    progress = (s - a.warmup_steps) / max(1, a.steps - a.warmup_steps)
    return floor + 0.5 * (a.lr - floor) * (1 + math.cos(math.pi * min(1.0, progress)))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["ddp", "fsdp2"], default="ddp")
    p.add_argument("--preset", default="nano")
    for flag in ("layers", "heads", "dim", "context"):
        p.add_argument(f"--{flag}", type=int, default=0, help="(default: the preset's)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--accum-steps", type=int, default=1)
    p.add_argument("--optimizer", choices=["adamw", "sgd"], default="adamw")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--min-lr-ratio", type=float, default=0.1)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--warmup-steps", type=int, default=50)
    p.add_argument("--amp", action="store_true")
    p.add_argument("--recompute", action="store_true")
    p.add_argument("--data", required=True)
    p.add_argument("--val-fraction", type=float, default=0.1)
    p.add_argument("--eval-batches", type=int, default=16,
                   help="validation windows at the end, spread over the ranks (train_gpt's)")
    p.add_argument("--init-from", required=True, help="the initial state_dict (both sides')")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--metrics-file", required=True)
    p.add_argument("--counting-lib", default="",
                   help="librecompute_counting.so: count CPU tensor bytes (see above)")
    a = p.parse_args()
    if a.counting_lib:
        # After `import torch` (the library uses its libc10), before any tensor of the run.
        global COUNTING
        COUNTING = ctypes.CDLL(a.counting_lib)
        COUNTING.dtrain_counting_install()
    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    config = GPTConfig.preset(a.preset)
    shape = {k: getattr(a, k) for k in ("layers", "heads", "dim", "context") if getattr(a, k)}
    config = dataclasses.replace(config, **shape)
    model = GPT(config)
    model.load_state_dict(torch.load(a.init_from, weights_only=True), strict=True)
    blocks = list(model.blocks)
    if a.recompute:
        from torch.utils.checkpoint import checkpoint

        def run_blocks(x):
            for b in blocks:
                x = checkpoint(b, x, use_reentrant=False)
            return x
        model.blocks.forward = run_blocks
    decay = [t for t in model.parameters() if t.requires_grad and t.dim() >= 2]
    no_decay = [t for t in model.parameters() if t.requires_grad and t.dim() < 2]
    if a.mode == "ddp":
        wrapped = torch.nn.parallel.DistributedDataParallel(model)
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        mesh = init_device_mesh("cpu", (world,))
        mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
              if a.amp else MixedPrecisionPolicy())
        for b in blocks:
            fully_shard(b, mesh=mesh, mp_policy=mp)
        fully_shard(model, mesh=mesh, mp_policy=mp)
        wrapped = model
        # fully_shard replaced the parameters with sharded ones: the groups are taken again.
        decay = [t for t in model.parameters() if t.requires_grad and t.dim() >= 2]
        no_decay = [t for t in model.parameters() if t.requires_grad and t.dim() < 2]
    groups = [{"params": decay, "weight_decay": a.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    if a.optimizer == "sgd":
        optimizer = torch.optim.SGD(groups, lr=a.lr)
    else:
        optimizer = torch.optim.AdamW(groups, lr=a.lr, betas=(0.9, 0.95))

    text = read_corpus(a.data)
    val = int(len(text) * a.val_fraction)
    # The training text in tensor storage, as train_gpt holds its corpus, so that a memory pass
    # (--counting-lib) counts it on both sides: bytes in Python objects are no tensor's storage.
    train = torch.frombuffer(bytearray(text[:len(text) - val]), dtype=torch.uint8).clone()
    valid = torch.frombuffer(bytearray(text[len(text) - val:]), dtype=torch.uint8).clone()
    del text
    context = config.context
    out = open(a.metrics_file, "w") if rank == 0 else None
    for step in range(a.steps):
        start = time.perf_counter()
        for group in optimizer.param_groups:
            group["lr"] = lr_at(a, step)
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        forward_s = backward_s = 0.0
        for micro in range(a.accum_steps):
            g = generator_for(a.seed, step, micro, rank)
            offsets = torch.randint(train.numel() - context - 1, (a.batch_size,), generator=g)
            seq = train[offsets[:, None] + torch.arange(context + 1)].long()
            x, y = seq[:, :-1], seq[:, 1:]
            sync = (contextlib.nullcontext() if a.mode != "ddp" or micro + 1 == a.accum_steps
                    else wrapped.no_sync())
            with sync:
                t0 = time.perf_counter()
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.amp):
                    logits = wrapped(x)
                    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                                           y.reshape(-1))
                t1 = time.perf_counter()
                (loss / a.accum_steps).backward()
                forward_s += t1 - t0
                backward_s += time.perf_counter() - t1
            total += loss.item()
        t2 = time.perf_counter()
        if a.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        optimizer.step()
        end = time.perf_counter()
        if out:
            out.write(json.dumps({"step": step + 1, "loss": total / a.accum_steps,
                                  "step_seconds": end - start, "forward_seconds": forward_s,
                                  "backward_seconds": backward_s,
                                  "optimizer_seconds": end - t2}) + "\n")
    # The validation train_gpt runs at its end (Training::evaluateNow): this rank's share of the
    # windows, the summed loss and count over the ranks. Collective under FSDP2.
    each = max(1, a.eval_batches // world)
    span = valid.numel() - context - 1
    offsets = torch.tensor([i * span // (each * world)
                            for i in range(rank * each, (rank + 1) * each)])
    seq = valid[offsets[:, None] + torch.arange(context + 1)].long()
    x, y = seq[:, :-1], seq[:, 1:]
    model.eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.amp):
        logits = wrapped(x).float()
        sums = torch.stack([F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                                            reduction="sum").double(),
                            torch.tensor(float(y.numel()), dtype=torch.double)])
    model.train()
    dist.all_reduce(sums)
    if out:
        out.write(json.dumps({"step": a.steps, "val_loss": (sums[0] / sums[1]).item()}) + "\n")
    peak = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0])
    peaks = [torch.zeros(1) for _ in range(world)]
    dist.all_gather(peaks, peak)
    if out:
        out.write(json.dumps({"peak_rss_bytes": [t.item() for t in peaks]}) + "\n")
        out.close()
    # Every rank past its last collective before any tears its Gloo pairs down: a rank of the
    # FSDP2 --amp peer once died in teardown ("terminate called without an active exception")
    # while the other still finished.
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # Every result is written: skip the interpreter's teardown, in which PyTorch 2.14's threads
    # have aborted the process ("terminate called without an active exception") after the run,
    # as they did the DCP and ZeRO peers'; the counting library's peak file is written first.
    sys.stdout.flush()
    sys.stderr.flush()
    if COUNTING is not None:
        COUNTING.dtrain_counting_write_peak()
    os._exit(0)
