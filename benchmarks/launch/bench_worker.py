"""launch_bench's Python worker: the torchrun-side equivalent of the C++ test worker.

Joins a store and passes one barrier, then exits. The store is torch.distributed's TCPStore at
MASTER_ADDR:MASTER_PORT, hosted by rank 0 -- what init_process_group's env:// does -- so it runs
unchanged under torchrun and under launch.
"""
import os
from datetime import timedelta

import torch.distributed as dist


def main():
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          rank == 0, timedelta(seconds=60))
    if store.add("barrier/start/count", 1) >= world:
        store.set("barrier/start/done", "1")
    store.wait(["barrier/start/done"])
    # Rank 0 hosts the store: it leaves last, so no peer loses the store mid-wait.
    if store.add("barrier/exit/count", 1) >= world:
        store.set("barrier/exit/done", "1")
    store.wait(["barrier/exit/done"])


if __name__ == "__main__":
    main()
