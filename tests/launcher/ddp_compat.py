"""A plain PyTorch DDP script, written for torchrun: it must run unchanged under `launch`.

    torchrun --standalone --nproc_per_node=2 ddp_compat.py
    launch --nproc-per-node 2 --python .venv/bin/python3 ddp_compat.py

Gloo, init_process_group with the default env:// (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE),
DDP on a small model, a few steps; prints one line per rank that the test checks. With
--fail-rank R, rank R raises once it has joined the process group, inside a function wrapped by
torchrun's @record, which writes TORCHELASTIC_ERROR_FILE -- launch's report must show that message.

Under torch 2.x a Gloo worker thread can still be freeing its last collective when the interpreter
exits, and needing the GIL then, aborts the process (SIGABRT, "terminate called without an active
exception"; under torchrun too: pytorch/pytorch#190489). DDP's reference cycles keep the process
group, and so its threads, alive until the collection at exit; collected before it, the group
joins them while Python still runs. The failing rank raises before any collective for the same
reason: the exception's traceback would keep the model, and so the group, alive. That collection
did not cover every case (a rank of the two-node test aborted so once, with no Python frame left,
on a loaded machine), so a rank that finished leaves with os._exit(0) once its output is flushed:
the interpreter's teardown, which is PyTorch's and not what this script checks, never runs.
"""
import argparse
import gc
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP


@record
def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--fail-rank", type=int, default=-1)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == args.fail_rank:
        raise RuntimeError(f"compat test failure on rank {rank}")
    assert world == int(os.environ["WORLD_SIZE"]), "WORLD_SIZE disagrees with the process group"
    assert rank == int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])

    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.manual_seed(1 + rank)  # different data per rank: DDP must still keep replicas equal
    for _ in range(args.steps):
        loss = model(torch.randn(16, 8)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    weight = model.module.weight.detach().clone()
    gathered = [torch.zeros_like(weight) for _ in range(world)]
    dist.all_gather(gathered, weight)
    same = all(torch.equal(gathered[0], w) for w in gathered)
    print(f"ddp_compat rank={rank} local_rank={local_rank} world={world} replicas_equal={same} "
          f"restart_count={os.environ.get('TORCHELASTIC_RESTART_COUNT')} "
          f"weight_sum={weight.sum().item():.6f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    gc.collect()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
