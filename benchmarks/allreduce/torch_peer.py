"""The peer of allreduce_bench: torch.distributed.all_reduce on gloo, driven by the benchmark.

Started under torchrun (or launch) with the same world size as the benchmark. Rank 0 reads
commands from a FIFO ("run BYTES WARMUP ITERS" or "quit"), shares them with the other ranks, and
writes "BYTES MEDIAN_US WRONG" to the results FIFO. The data and the checks are the benchmark's:
rank r contributes r + (i % 5) at element i.
"""
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from stats import median  # noqa: E402

DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
          "bfloat16": torch.bfloat16, "int32": torch.int32, "int64": torch.int64}


def main():
    commands_path, results_path, dtype_name = sys.argv[1], sys.argv[2], sys.argv[3]
    dtype = DTYPES[dtype_name]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    commands = open(commands_path) if rank == 0 else None
    results = open(results_path, "w", buffering=1) if rank == 0 else None
    while True:
        box = [commands.readline().split() if rank == 0 else None]
        dist.broadcast_object_list(box, src=0)
        words = box[0]
        if not words or words[0] != "run":
            break
        nbytes, warmup, iters = int(words[1]), int(words[2]), int(words[3])
        count = nbytes // torch.tensor([], dtype=dtype).element_size()
        pattern = (torch.arange(count, dtype=torch.int64) % 5).to(dtype)
        t = pattern + rank
        dist.all_reduce(t)
        expected = pattern * world + world * (world - 1) // 2
        wrong = int((t != expected).sum().item())
        for _ in range(warmup):
            dist.all_reduce(t)
        dist.barrier()
        times = []
        for _ in range(iters):
            start = time.perf_counter()
            dist.all_reduce(t)
            times.append(time.perf_counter() - start)
        if rank == 0:
            results.write(f"{nbytes} {median(times) * 1e6:.3f} {wrong}\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
