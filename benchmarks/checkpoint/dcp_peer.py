"""dcp_bench's peer: the model of `checkpoint_bench --sharded` (an MLP of Linear layers with ReLU
between) sharded with FSDP2 (fully_shard per Linear and on the root), trained one Adam step over
Gloo, and saved / loaded with torch.distributed.checkpoint (DCP) the way a PyTorch 2.14 user
does: get_state_dict -> dcp.save, and get_state_dict -> dcp.load -> set_state_dict. Run under
`launch --python PYTHON` (or torchrun) by dcp_bench.py; the flags are the C++ side's.

  --job save   build (seed 0), one step, save (timed), fingerprint the parameters into
               --reference, one more step (the parameters move away from what was saved), then
               the loads
  --job load   build (seed 1: other values), one step, then the loads at this world size,
               whatever the one it was saved at
  The loads: load (timed) and check against --reference, twice: the checkpoint's files first
  dropped from the page cache (cold), then read once (warm), as on dtrain's side.

fsync: FileSystemWriter(sync_files=True), DCP's default, fsyncs every data file and .metadata.tmp
before renaming it to .metadata; it does not fsync the directory, so a crash after the save may
lose the rename. The directory's fsync is added here (rank 0, after dcp.save) and timed with the
save, as dtrain's save() fsyncs its directory too. Rank 0 writes --result (JSON).
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

MODEL_SEED = 0       # the save job's model
OTHER_SEED = 1       # the load job's: restore must overwrite every value
DATA_SEED = 100      # + rank; + 1000 for the step that moves the parameters after the save
FINGERPRINT_MUL = 2654435761


def build(a, seed, mesh):
    """io -> width -> ... -> width -> io, the same values on every rank, each Linear a unit."""
    torch.manual_seed(seed)
    layers = []
    for i in range(a.layers):
        layers.append(torch.nn.Linear(a.io if i == 0 else a.width,
                                      a.io if i + 1 == a.layers else a.width))
        if i + 1 < a.layers:
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers)
    for m in model:
        if isinstance(m, torch.nn.Linear):
            fully_shard(m, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def train_step(a, model, optimizer, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(a.batch, a.io, generator=g)
    y = torch.randn(a.batch, a.io, generator=g)
    optimizer.zero_grad(set_to_none=True)
    torch.nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()


def fingerprint(t):
    """checkpoint_bench's: sum of bits_i * (i * FINGERPRINT_MUL + 1) modulo 2^64 (int64 wraps);
    the weights are odd, so a change of any one element changes it."""
    bits = t.detach().contiguous().view(torch.int32).flatten().to(torch.int64)
    weights = torch.arange(bits.numel(), dtype=torch.int64).mul_(FINGERPRINT_MUL).add_(1)
    return int(bits.mul_(weights).sum())


def fingerprints(model):
    """Every parameter in full (one all-gather each), by name: the same on every rank."""
    return {name: fingerprint(p.full_tensor()) for name, p in model.named_parameters()}


def timed(fn):
    dist.barrier()
    start = time.perf_counter()
    fn()
    dist.barrier()
    return time.perf_counter() - start


def save(model, optimizer, path):
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd},
             storage_writer=FileSystemWriter(path, sync_files=True))
    if dist.get_rank() == 0:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        os.fsync(fd)
        os.close(fd)


def prepare_cache(path, warm):
    """Every file under `path` read once (warm) or fsynced and dropped from the page cache."""
    for root, _, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            if warm:
                while os.read(fd, 4 << 20):
                    pass
            else:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)


def load(model, optimizer, path):
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, storage_reader=FileSystemReader(path))
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--job", choices=["save", "load"], required=True)
    p.add_argument("--dir", required=True, help="the checkpoint directory")
    p.add_argument("--reference", required=True, help="the saved parameters' fingerprints")
    p.add_argument("--result", required=True)
    p.add_argument("--io", type=int, default=1024)
    p.add_argument("--width", type=int, default=4096)
    p.add_argument("--layers", type=int, default=5)
    p.add_argument("--batch", type=int, default=4)
    a = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    saving = a.job == "save"
    model = build(a, MODEL_SEED if saving else OTHER_SEED, mesh)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    train_step(a, model, optimizer, DATA_SEED + rank)
    result = {"world": world}
    if saving:
        result["save_s"] = timed(lambda: save(model, optimizer, a.dir))
        saved = fingerprints(model)
        if rank == 0:
            with open(a.reference, "w") as f:
                json.dump(saved, f)
        train_step(a, model, optimizer, DATA_SEED + 1000 + rank)
    else:
        with open(a.reference) as f:
            saved = json.load(f)
    # Note [Page cache before a load] (sharded_bench.cpp): cold, then warm, as dtrain's side.
    result["check"] = True
    for warm in (False, True):
        if int(os.environ.get("LOCAL_RANK", "0")) == 0:
            prepare_cache(a.dir, warm)
        result["load_warm_s" if warm else "load_cold_s"] = timed(
            lambda: load(model, optimizer, a.dir))
        result["check"] = fingerprints(model) == saved and result["check"]
    result["parameters"] = sum(p.numel() for p in model.parameters())
    if rank == 0:
        with open(a.result, "w") as f:
            json.dump(result, f)
    # Every rank past its last collective before any tears Gloo down: a rank that destroys the
    # group while a peer still sends has been seen to abort ("terminate called without an
    # active exception") at 4 ranks on 2 cores.
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
