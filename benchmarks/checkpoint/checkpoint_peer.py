"""torch.save / torch.load of the same state as checkpoint_bench's, for its interleaved comparison.

Started by checkpoint_bench with the build's DTRAIN_PYTHON (the project's .venv). Reads the state's
tensors (names and shapes) from the JSON file named on the command line, builds them once, then
answers one command per stdin line with the seconds it took:

    save PATH    torch.save(state, f) to PATH, then flush and fsync (what a crash-safe save needs)
    load PATH    torch.load(PATH)
    drop PATH    posix_fadvise(DONTNEED) on PATH: its pages leave the page cache (cold reads)
    quit
"""
import json
import os
import sys
import time

import torch


def main():
    spec = json.load(open(sys.argv[1]))
    torch.manual_seed(0)
    state = {
        "model": {name: torch.randn(shape) for name, shape in spec["model"]},
        "optimizer": {name: torch.randn(shape) for name, shape in spec["optimizer"]},
        "step": 1,
    }
    print("ready", flush=True)
    for line in sys.stdin:
        command, _, path = line.strip().partition(" ")
        start = time.perf_counter()
        if command == "save":
            with open(path, "wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())
        elif command == "load":
            loaded = torch.load(path)
            assert len(loaded["model"]) == len(state["model"])
        elif command == "drop":
            fd = os.open(path, os.O_RDONLY)
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
        elif command == "quit":
            return
        print(f"{time.perf_counter() - start:.6f}", flush=True)


if __name__ == "__main__":
    main()
