#!/usr/bin/env python3
"""zero_peer_bench: dtrain's ZeRO against the peers PyTorch 2.x has, on zero_bench's DeepMlp
(Adam, MSE) over Gloo on the CPU, 1 thread per rank:
  ZeRO-3  zero_bench's worker --stage 3   / FSDP2 fully_shard per Linear and on the root
  ZeRO-1  zero_bench's worker --stage 1   / DDP + ZeroRedundancyOptimizer(Adam)
(zero_peer.py is the peer). dtrain's side is the worker zero_bench runs, measured as zero_bench
measures it, run freely (no turns) with DTRAIN_SHM=0, so that both sides send through Gloo.

Before its runs, each peer trains a few steps in --check mode and is compared with one process
on the whole batch (gradients of the first step and parameters at the end, relative error of the
norm <= 1e-5): Gloo's AVG has an open silent-correctness report (pytorch #162338). A peer that
fails gets no row -- the line says so -- and the driver exits 1.

Then --pairs pairs of runs per world size and method, alternating which side goes first. Per run:
the median step over the timed steps (rank 0); per pair the ratio ours / the peer's. A row: both
sides' medians over the pairs, the median ratio with its min-max. Memory and bytes per rank and
step are the same from run to run; their ratios are printed the same way.

  benchmarks/zero/zero_peer_bench.py BUILD --counting-lib LIB [--worlds 2,4] [--pairs 5]
      [--width 1024] [--io 256] [--layers 6] [--batch 16] [--steps 5] [--warmup 2]
      [--check-steps 3] [--buckets-in-flight 2] [--json FILE] [--smoke]
BUILD holds zero_bench and launch; LIB is librecompute_counting.so (benchmarks/recompute).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "common"))  # benchmarks/common/stats.py
from stats import median, median_spread, paired_ratios  # noqa: E402

MiB = float(1 << 20)
PEERS = {3: "fsdp2", 1: "zero1"}


def run(cmd, out, env=None, timeout=600):
    if os.path.exists(out):
        os.remove(out)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, **(env or {})))
    if done.returncode != 0 or not os.path.exists(out):
        sys.exit(f"zero_peer_bench: {' '.join(cmd)} failed (exit {done.returncode}):\n"
                 f"{done.stdout[-3000:]}{done.stderr[-3000:]}")
    with open(out) as f:
        return json.loads(f.read())


def model_args(a):
    return ["--width", str(a.width), "--io", str(a.io), "--layers", str(a.layers),
            "--batch", str(a.batch)]


def ours(a, world, stage, out):
    cmd = ([os.path.join(a.build, "launch"), "--nproc-per-node", str(world), "--",
            os.path.join(a.build, "zero_bench"), "--worker", "--stage", str(stage)]
           + model_args(a) + ["--warmup", str(a.warmup), "--steps", str(a.steps), "--out", out,
                              "--buckets-in-flight", str(a.buckets_in_flight)])
    # The counting library preloaded counts tensors and communicator buffers at one moment
    # (Note [Peak in a step] in zero_bench_worker.cpp); its whole-run files are not read.
    env = {"DTRAIN_SHM": "0", "LD_PRELOAD": os.path.abspath(a.counting_lib),
           "DTRAIN_COUNTING_PEAK_FILE": os.path.join(os.path.dirname(out), "whole-run")}
    r = run(cmd, out, env=env)
    if len(r.get("step_peak_bytes") or []) != len(r["step_peak_storage_bytes"]):
        sys.exit("zero_peer_bench: zero_bench's worker counted no step peak with the counting "
                 f"library preloaded ({a.counting_lib}): its functions were not found")
    return r


def peer(a, world, stage, out, check=False):
    steps = ["--steps", str(a.check_steps), "--check"] if check else [
        "--warmup", str(a.warmup), "--steps", str(a.steps)]
    cmd = ([os.path.join(a.build, "launch"), "--nproc-per-node", str(world), "--python",
            a.python, os.path.join(HERE, "zero_peer.py"), "--mode", PEERS[stage]]
           + model_args(a) + steps + ["--counting-lib", a.counting_lib, "--out", out])
    return run(cmd, out)


def side_of(pairs, i, key):
    """One side's figure over the pairs (0: ours, 1: the peer's), in their order."""
    return [pair[i][key] for pair in pairs]


def ratios(pairs, key):
    """Ours / the peer's per pair: the two sides of a pair ran back to back."""
    return paired_ratios(side_of(pairs, 0, key), side_of(pairs, 1, key))


def aim(ratio, bound=1.0):
    return "met" if ratio <= bound else "NOT met"


def print_stage3(world, pairs, check):
    step, peak, bus, sock = (ratios(pairs, k) for k in ("step", "peak", "bus", "socket"))
    o, p = pairs[0]

    def med(side, k):
        return median(side_of(pairs, side, k))
    print(f"  {world:>5} {'zero3/fsdp2':>12} {med(0, 'step'):>8.1f} {med(1, 'step'):>8.1f} "
          f"{median_spread(step):>21} {med(0, 'peak') / MiB:>8.2f} {med(1, 'peak') / MiB:>8.2f} "
          f"{median_spread(peak):>21} {med(0, 'idle') / MiB:>7.2f} {o['bus'] / MiB:>7.2f} "
          f"{p['bus'] / MiB:>7.2f} {median_spread(bus):>21} {median_spread(sock):>21}")
    print(f"  {'':>5} ours: peak {o['peak'] / MiB:.2f} MiB at one moment; apart, "
          f"{o['storage'] / MiB:.2f} MiB tensor storage and {o['buffers'] / MiB:.2f} MiB "
          f"communicator buffers in use at their most (largest rank); held "
          f"between steps {o['held'] / MiB:.2f} MiB (most of any rank); socket MiB/step "
          f"ours {o['socket'] / MiB:.2f}, peer {p['socket'] / MiB:.2f}; aims: peak "
          f"{aim(median(peak))}, bus bytes {aim(median(bus))} (<= 1.0); peer check: "
          f"{check}")


def print_stage1(world, pairs, check):
    step, state = ratios(pairs, "step"), ratios(pairs, "state")
    o, p = pairs[0]

    def med(side, k):
        return median(side_of(pairs, side, k))
    print(f"  {world:>5} {'zero1/zero-ro':>12} {med(0, 'step'):>8.1f} {med(1, 'step'):>8.1f} "
          f"{median_spread(step):>21} {o['state'] / MiB:>8.2f} {p['state'] / MiB:>8.2f} "
          f"{median_spread(state):>21}")
    print(f"  {'':>5} ZeroRedundancyOptimizer's partitions, MiB per rank: "
          f"{', '.join(f'{b / MiB:.2f}' for b in p['partitions'])}; aims: step "
          f"{aim(median(step))}, state per rank <= its largest partition "
          f"{aim(median(state))}; peer check: {check}")


def figures(r):
    """One run's figures. Peak: the largest rank's most in a step, tensor storage and dtrain's
    communicator buffers in use at one moment (Note [Peak in a step] in zero_bench_worker.cpp;
    the peer holds none outside tensors); storage and buffers: the same rank's two peaks apart.
    Held (in use between steps) and idle (the communicator's cache of released buffers, resident
    but unused) are reported apart, the most of any rank."""
    storage = r["step_peak_storage_bytes"]
    none = [0] * len(storage)
    buffers = r.get("comm_peak_bytes") or none
    totals = r.get("step_peak_bytes") or storage  # the peer: tensors alone
    i = totals.index(max(totals))
    return {"step": median(r["step_ms"]), "bus": median(r["payload_bytes"]),
            "socket": median(r["socket_bytes"]), "peak": totals[i],
            "storage": storage[i], "buffers": buffers[i],
            "held": max(r.get("comm_held_bytes") or none),
            "idle": max(r.get("comm_idle_bytes") or none),
            "state": max(r["optimizer_state_bytes"]), "partitions": r["optimizer_state_bytes"]}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("build")
    p.add_argument("--counting-lib", required=True)
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--worlds", default="2,4")
    p.add_argument("--stages", default="3,1")
    p.add_argument("--pairs", type=int, default=5)
    for name, default in (("width", 1024), ("io", 256), ("layers", 6), ("batch", 16),
                          ("steps", 5), ("warmup", 2), ("check-steps", 3)):
        p.add_argument("--" + name, type=int, default=default)
    p.add_argument("--buckets-in-flight", type=int, default=2,
                   help="dtrain's ZeroOptions::bucketsInFlight (its default: 2)")
    p.add_argument("--json", default="")
    p.add_argument("--smoke", action="store_true",
                   help="the plumbing in CI time: world 2, a small model, one pair whose peer "
                        "side is its check run")
    a = p.parse_args()
    if a.smoke:
        a.worlds, a.pairs, a.width, a.io, a.layers, a.batch = "2", 1, 128, 32, 3, 4
        a.steps, a.warmup, a.check_steps = 2, 1, 2
    import torch
    print(f"# zero_peer_bench: Adam, DeepMlp({a.io} -> {a.width} x {a.layers - 1} -> {a.io}), "
          f"batch {a.batch} per rank, 1 thread per rank, Gloo on both sides (dtrain "
          f"DTRAIN_SHM=0; PyTorch {torch.__version__}); {a.pairs} pairs of runs alternating "
          f"who goes first, {a.steps} steps (+{a.warmup} warm-up) each; ratio = ours / the "
          f"peer's, median [min-max] of the pairs{', SMOKE' if a.smoke else ''}")
    print("# ms: median step; peak: MiB per rank at the most in a step (largest rank; ours: "
          "tensor storage and communicator buffers in use at one moment); idle: ours, MiB of "
          "released communicator buffers cached after the steps (resident, unused, not in the "
          "peak; most of any rank); bus: MiB per step counted as nccl-tests' busbw; socket: "
          "bytes written per step (/proc/self/io wchar), ratio")
    print(f"# {'world':>5} {'method':>12} {'ours ms':>8} {'peer ms':>8} {'step ratio':>21} "
          f"{'peak':>8} {'peer':>8} {'peak ratio':>21} {'idle':>7} {'bus':>7} {'peer':>7} "
          f"{'bus ratio':>21} {'socket ratio':>21}")
    print(f"# {'':>5} {'':>12} {'':>8} {'':>8} {'':>21} {'state':>8} {'largest':>8} "
          f"{'state ratio':>21}   (ZeRO-1 rows: optimizer state MiB per rank)")
    results, failed = [], False
    with tempfile.TemporaryDirectory() as tmp:
        for world in [int(w) for w in a.worlds.split(",")]:
            for stage in [int(s) for s in a.stages.split(",")]:
                checked = peer(a, world, stage, os.path.join(tmp, "check.json"), check=True)
                c = checked["check"]
                check = (f"{'passed' if c['passed'] else 'FAILED'} (gradients "
                         f"{c['gradient_error']:.1e}, parameters after {c['steps']} steps "
                         f"{c['parameter_error']:.1e}; tolerance {c['tolerance']:.0e})")
                if not c["passed"]:
                    failed = True
                    print(f"  {world:>5} {PEERS[stage]:>12} no row: the peer disagrees with one "
                          f"process on the whole batch: {check}", flush=True)
                    results.append({"world": world, "stage": stage, "check": c})
                    continue
                pairs = []
                for i in range(a.pairs):
                    sides = {}
                    for side in (["ours", "peer"] if i % 2 == 0 else ["peer", "ours"]):
                        out = os.path.join(tmp, f"{side}.json")
                        if side == "ours":
                            r = ours(a, world, stage, out)
                        else:  # a smoke run's pair takes the check's steps: CI time
                            r = checked if a.smoke else peer(a, world, stage, out)
                        sides[side] = figures(r)
                    pairs.append((sides["ours"], sides["peer"]))
                (print_stage3 if stage == 3 else print_stage1)(world, pairs, check)
                sys.stdout.flush()
                results.append({"world": world, "stage": stage, "check": c, "pairs": pairs})
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    rows = sum(1 for r in results if "pairs" in r)
    return 1 if failed or rows != len(results) or not rows else 0


if __name__ == "__main__":
    sys.exit(main())
