#!/usr/bin/env python3
"""dcp_bench: dtrain's sharded checkpoints (a stage-3 ShardedOptimizer in the Checkpointer,
`checkpoint_bench --sharded`) against PyTorch 2.14's torch.distributed.checkpoint (DCP) over
FSDP2 (dcp_peer.py) on the same MLP trained one Adam step, in pairs of runs that alternate which
side goes first, under launch on this machine (Gloo on both sides, one thread per rank).

Per pair, saved world W and side: a save job at W ranks -- save (timed), fingerprint the
parameters, one more step, the loads -- then the bytes of the checkpoint directory (du
--apparent-size), then a load job at the other world size W' -- a model of other values, one
step, the loads (re-sharded from W to W'). The loads: load (timed) and check, twice, the
checkpoint's files first dropped from the page cache (cold: a restore on another machine, or
much later), then read once (warm: right after the save on the same machine), the same way on
both sides (Note [Page cache before a load], sharded_bench.cpp): dtrain writes its bulk with
O_DIRECT and leaves none of it cached, DCP writes through the page cache. A check compares every
parameter after the load with the saved one bitwise (a 64-bit fingerprint, Note [Parameter
fingerprint] in sharded_bench.cpp).

fsync: dtrain's save() fsyncs its file, the directory and LATEST before it returns; DCP's
FileSystemWriter (sync_files=True, its default) fsyncs every data file and .metadata but not the
directory, which dcp_peer.py fsyncs after dcp.save, inside the timed save.

Printed: per saved world and operation the medians of each side's seconds and the speedup (the
peer's time over ours: above 1, dtrain is faster; the median of the pairs' ratios and their
min-max); the bytes written by each side and their ratio (ours / the peer's). A row whose runs
had a failed check is not printed; the script then exits 1.

  benchmarks/checkpoint/dcp_bench.py BUILD [--worlds 2,4] [--save-at 2,4] [--pairs 5]
      [--dir D] [--io 1024] [--width 4096] [--layers 5] [--json FILE] [--smoke]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "common"))  # benchmarks/common/stats.py
from stats import median, paired_ratios, spread  # noqa: E402

SIDES = ("ours", "peer")
# reload: the load job's, at the other world size; cold / warm: the page cache emptied of the
# checkpoint's files, or filled with them, before the load (Note [Page cache before a load])
OPS = ("save", "load_cold", "load_warm", "reload_cold", "reload_warm")


def series(pairs, side, key):
    """One side's figure over the pairs, in their order (pair i ran its sides back to back)."""
    return [pr[side][key] for pr in pairs]


def parameter_count(a):
    sizes = [a.io] + [a.width] * (a.layers - 1) + [a.io]
    return sum(i * o + o for i, o in zip(sizes, sizes[1:]))


def apparent_bytes(path):
    """du --apparent-size -sb: the files' sizes and the directories' own."""
    out = subprocess.run(["du", "--apparent-size", "-sb", path], capture_output=True, text=True,
                         check=True)
    return int(out.stdout.split()[0])


def run_job(a, side, job, world, scratch):
    """One launch of a side's job; its rank 0's result (a dict)."""
    result = os.path.join(scratch, f"{side}-{job}.json")
    if os.path.exists(result):
        os.remove(result)
    flags = ["--job", job, "--dir", os.path.join(scratch, f"{side}-ckpt"),
             "--reference", os.path.join(scratch, f"{side}-reference.json"), "--result", result,
             "--io", str(a.io), "--width", str(a.width), "--layers", str(a.layers)]
    launch = [os.path.join(a.build, "launch"), "--nproc-per-node", str(world)]
    if side == "ours":
        cmd = launch + [os.path.join(a.build, "checkpoint_bench"), "--sharded"] + flags
        env = dict(os.environ, DTRAIN_SHM="0")  # Gloo, as the peer's (not shared memory)
    else:
        cmd = launch + ["--python", sys.executable, os.path.join(HERE, "dcp_peer.py")] + flags
        env = dict(os.environ)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout, env=env)
    if out.returncode != 0 or not os.path.exists(result):
        sys.exit(f"dcp_bench: {' '.join(cmd)} failed (exit {out.returncode}):\n"
                 f"{out.stdout[-3000:]}{out.stderr[-3000:]}")
    with open(result) as f:
        return json.load(f)


def run_side(a, side, world, other, scratch):
    """A save job at `world` and a load job at `other`: seconds, bytes and checks."""
    saved = run_job(a, side, "save", world, scratch)
    ckpt = os.path.join(scratch, f"{side}-ckpt")
    nbytes = apparent_bytes(ckpt)
    loaded = run_job(a, side, "load", other, scratch)
    shutil.rmtree(ckpt)
    return {"save": saved["save_s"], "load_cold": saved["load_cold_s"],
            "load_warm": saved["load_warm_s"], "reload_cold": loaded["load_cold_s"],
            "reload_warm": loaded["load_warm_s"], "bytes": nbytes,
            "checks": [saved["check"], loaded["check"]]}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("build", help="the build directory (launch, checkpoint_bench)")
    p.add_argument("--worlds", default="2,4",
                   help="world sizes; a checkpoint saved at one is loaded at the next (cyclic)")
    p.add_argument("--save-at", default="", help="the worlds to save at (default: all)")
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--dir", default=tempfile.gettempdir(),
                   help="a fresh directory is made in it for the checkpoints, removed at the end")
    p.add_argument("--io", type=int, default=1024)
    p.add_argument("--width", type=int, default=4096)
    p.add_argument("--layers", type=int, default=5)
    p.add_argument("--timeout", type=int, default=600, help="seconds per launch")
    p.add_argument("--json", default="")
    p.add_argument("--smoke", action="store_true",
                   help="a small model, one pair, saved at 2 ranks and loaded at 4 (CI)")
    a = p.parse_args()
    if a.smoke:
        a.io, a.width, a.layers, a.pairs, a.worlds, a.save_at = 64, 128, 3, 1, "2,4", "2"
    worlds = [int(w) for w in a.worlds.split(",")]
    save_at = [int(w) for w in a.save_at.split(",")] if a.save_at else worlds
    if a.pairs < 1 or any(w not in worlds for w in save_at):
        p.error("--pairs must be positive and --save-at a subset of --worlds")
    import torch

    params = parameter_count(a)
    print(f"# dcp_bench: MLP {a.io}-{a.width}x{a.layers - 1}-{a.io}, {params / 1e6:.1f}M "
          f"float32 parameters ({params * 4 / 1e6:.0f} MB) + Adam; {a.pairs} interleaved pairs; "
          f"dtrain ZeRO-3 Checkpointer vs FSDP2 + DCP (PyTorch {torch.__version__}), Gloo, "
          f"1 thread per rank")
    print("# save: until every rank returned, fsync included (dtrain: file, directory, LATEST; "
          "DCP: files, .metadata, + the directory's fsync added); load: cold (the files dropped "
          "from the page cache) then warm (read once), each job; load@W: at the other size")
    print("# speedup: peer's time / ours (above 1: dtrain faster), median of the pairs' ratios "
          "[min-max]; MB: du --apparent-size of the checkpoint directory")
    print(f"# {'saved':>5} {'op':>15} {'ours_s':>8} {'peer_s':>8} {'speedup':>7} "
          f"{'[min-max]':>13}")
    rows, failed = [], []
    began = time.perf_counter()
    scratch = tempfile.mkdtemp(prefix="dtrain-dcp-bench-", dir=a.dir)
    try:
        for world in save_at:
            other = worlds[(worlds.index(world) + 1) % len(worlds)]
            pairs = []
            for i in range(a.pairs):
                order = SIDES if i % 2 == 0 else tuple(reversed(SIDES))
                pairs.append({side: run_side(a, side, world, other, scratch) for side in order})
            bad = [f"{side} pair {i}" for i, pr in enumerate(pairs) for side in SIDES
                   if not all(pr[side]["checks"])]
            row = {"saved_world": world, "loaded_world": other, "pairs": pairs,
                   "checks_passed": not bad}
            rows.append(row)
            if bad:
                failed.append(f"saved at {world}: restore check FAILED ({', '.join(bad)})")
                print(f"# saved at {world}: restore check FAILED ({', '.join(bad)}); no row")
                continue
            for op in OPS:
                ratios = paired_ratios(series(pairs, "peer", op), series(pairs, "ours", op))
                ours = median(series(pairs, "ours", op))
                peer = median(series(pairs, "peer", op))
                lo, hi = spread(ratios)
                cache = op.split("_")[1] if "_" in op else ""
                name = (f"load@{other}" if op.startswith("re") else
                        "load" if cache else op) + ("" if op.startswith("re") else f"@{world}")
                name += f" {cache}" if cache else ""
                row[op] = {"ours_s": ours, "peer_s": peer, "speedup": median(ratios),
                           "min": lo, "max": hi}
                print(f"  {world:>5} {name:>15} {ours:>8.3f} {peer:>8.3f} "
                      f"{median(ratios):>7.2f} [{lo:.2f}-{hi:.2f}]", flush=True)
            ratios = paired_ratios(series(pairs, "ours", "bytes"), series(pairs, "peer", "bytes"))
            lo, hi = spread(ratios)
            row["bytes"] = {side: median(series(pairs, side, "bytes")) for side in SIDES}
            row["bytes"].update(ratio=median(ratios), min=lo, max=hi)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"# bytes written: parameters and Adam's two moments are {params * 12 / 1e6:.1f} MB; "
          f"ratio: ours / the peer's (below 1: dtrain writes less)")
    print(f"# {'saved':>5} {'ours_MB':>10} {'peer_MB':>8} {'ratio':>7} {'[min-max]':>13}")
    for row in rows:
        if "bytes" in row:
            b = row["bytes"]
            print(f"  {row['saved_world']:>5} {b['ours'] / 1e6:>10.1f} {b['peer'] / 1e6:>8.1f} "
                  f"{b['ratio']:>7.3f} [{b['min']:.3f}-{b['max']:.3f}]")
    checks = sum(len(pr[s]["checks"]) for r in rows for pr in r["pairs"] for s in SIDES)
    print(f"# restore checks: {'FAILED: ' + '; '.join(failed) if failed else 'all passed'} "
          f"({checks} loads, parameters bitwise equal to the saved ones); "
          f"{time.perf_counter() - began:.0f} s in all")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
