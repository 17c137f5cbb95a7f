#!/usr/bin/env python3
"""gpt_bench: train_gpt against its PyTorch 2.14 peer (gpt_peer.py) on the same model, initial
weights, batches, schedule and AdamW, in pairs of runs that alternate which side goes first, under
launch on this machine (Gloo on both sides; dtrain also with shared memory, its default on one
host, when --shm is given).

Configurations (ours / the peer's):
  ddp        train_gpt --zero 0            / DDP
  zero3      train_gpt --zero 3            / FSDP2 (fully_shard per block and on the root)
  zero3_rc   ... --recompute               / ... torch.utils.checkpoint(use_reentrant=False)
  zero3_amp  train_gpt --zero 3 --amp      / FSDP2 with MixedPrecisionPolicy(bfloat16, float32)
             (bfloat16 autocast on the CPU; ZeRO-3's blocks gathered in bfloat16)

Per pair and side: the median step time over the steps after --warmup (and its forward, backward
and optimizer parts, host time), and every rank's peak resident set from launch's samples
(rss_peak_bytes, VmHWM). A row: tokens/s of each side (the medians over the pairs), their ratio
(ours / the peer's, the median of the pairs' ratios with its min-max), the step's parts, and the
peak resident memory per rank (the largest rank's) with its ratio.

The memory pass, before a row's pairs and apart from them: one run of each side with
--memory-steps steps, both counting CPU tensor storage with the tests' counting allocator
(librecompute_counting.so of the target recompute_counting: BUILD's, or --counting-lib):
train_gpt, unchanged, loads it with LD_PRELOAD, the peer with --counting-lib right after
`import torch`. Each rank writes the peak of its live tensor bytes over the whole run (start-up
included) at exit (DTRAIN_COUNTING_PEAK_FILE); ours' with the communicator buffers that hold
dtrain's gradient buckets and gathered units, which the peer's DDP and FSDP2 hold in tensors
(dtrain over Gloo in this pass, whose buffers the library counts). The row gets the largest
rank's of each side in MiB and their ratio (ours / the peer's). The counting allocator takes a
mutex per allocation and keeps dtrain's host memory cache off, so it never runs in the timed
pairs.
--memory-only runs the memory pass alone, --no-memory the pairs alone.

--cgroup runs the memory-cgroup pass alone (root and a writable cgroup file system; SKIP with the
reason otherwise): a GPT too large for DDP at 4 ranks (8 blocks x 768, 57.0M parameters, batch 1,
2 steps) under ours' zero3_rc and ddp and the peer's, each first in a memory cgroup of its own
without a limit (its peak: launch and every rank; and the largest rank's peak resident set from
launch's samples), then each again under one limit halfway between ours' zero3_rc peak and ours'
ddp peak: what trains there, and what launch reports of a side that does not (its workers
killed by the OOM killer).

  benchmarks/gpt/gpt_bench.py BUILD [--presets nano,small] [--worlds 2,4] [--pairs 5]
                              [--steps 12] [--warmup 4] [--configs ddp,zero3,zero3_rc,zero3_amp]
                              [--batch-size 8] [--memory-steps 4] [--counting-lib LIB]
                              [--memory-only | --no-memory | --cgroup] [--json FILE]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PEER = os.path.join(HERE, "gpt_peer.py")
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "common"))  # benchmarks/common/stats.py
from stats import median, paired_ratios, spread  # noqa: E402

CONFIGS = {
    "ddp": (["--zero", "0"], ["--mode", "ddp"]),
    "zero3": (["--zero", "3"], ["--mode", "fsdp2"]),
    "zero3_rc": (["--zero", "3", "--recompute"], ["--mode", "fsdp2", "--recompute"]),
    "zero3_amp": (["--zero", "3", "--amp"], ["--mode", "fsdp2", "--amp"]),
}


def records(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def run(cmd, metrics, env=None, timeout=900):
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                         env=dict(os.environ, **(env or {})))
    if out.returncode != 0:
        sys.exit(f"gpt_bench: {' '.join(cmd)} failed:\n{out.stdout[-3000:]}{out.stderr[-3000:]}")
    rows = records(metrics)
    steps = [r for r in rows if "step_seconds" in r and r.get("rank", 0) == 0]
    peaks = {}
    for r in rows:
        if r.get("source") == "launch" and "rss_peak_bytes" in r:
            peaks[r["rank"]] = max(peaks.get(r["rank"], 0), r["rss_peak_bytes"])
    return steps, max(peaks.values()) if peaks else float("nan")


def median_after(steps, key, warmup):
    return median(s[key] for s in steps if s["step"] > warmup)


class Sides:
    """The command lines of one row's two sides under launch."""

    def __init__(self, a, preset, world, name, init, batch_size=None, shape=()):
        self.launch = [os.path.join(a.build, "launch"), "--nproc-per-node", str(world)]
        self.trainer = os.path.join(a.build, "train_gpt")
        self.world = world
        self.common = (["--preset", preset, "--batch-size", str(batch_size or a.batch_size),
                        "--warmup-steps", "2", "--data", a.data, "--init-from", init,
                        "--threads", "1"] + list(shape))
        self.ours_flags, self.peer_flags = CONFIGS[name]
        self.ours_env = None if a.shm else {"DTRAIN_SHM": "0"}

    def ours(self, steps, launch_flags=(), wrapper=()):
        return (self.launch + list(launch_flags) + list(wrapper) + [self.trainer]
                + ["--steps", str(steps)] + self.common + self.ours_flags
                + ["--eval-every", "0", "--sample-tokens", "0"])

    def peer(self, steps, metrics, launch_flags=(), extra=()):
        return (self.launch + list(launch_flags) + ["--python", sys.executable, PEER]
                + ["--steps", str(steps)] + self.common + self.peer_flags
                + ["--metrics-file", metrics] + list(extra))


def timed_pairs(a, tmp, sides):
    """--pairs pairs of runs, alternating which side goes first: per pair and side the median
    step parts after --warmup and the largest rank's peak resident set."""
    pairs = []
    for i in range(a.pairs):
        pair = {}
        for side in (["ours", "peer"] if i % 2 == 0 else ["peer", "ours"]):
            metrics = os.path.join(tmp, f"{side}.jsonl")
            if os.path.exists(metrics):
                os.remove(metrics)
            lm = ["--metrics-file", metrics, "--sample-interval", "0.2"]
            if side == "ours":
                steps, rss = run(sides.ours(a.steps, lm), metrics, env=sides.ours_env)
            else:
                peer_metrics = os.path.join(tmp, "peer-steps.jsonl")
                _, rss = run(sides.peer(a.steps, peer_metrics, lm), metrics)
                steps = [s for s in records(peer_metrics) if "step_seconds" in s]
            pair[side] = {k: median_after(steps, k + "_seconds", a.warmup)
                          for k in ("step", "forward", "backward", "optimizer")}
            pair[side]["rss"] = rss
        pairs.append(pair)
    return pairs


def peaks(cmd, prefix, world, env=None):
    """Runs one side under the counting allocator (DTRAIN_COUNTING_PEAK_FILE=prefix): the peaks
    of the largest rank (by peak_bytes), which each rank writes to PREFIX.<RANK> at its exit
    (Note [Counting a whole program] in benchmarks/recompute/counting_library.cpp)."""
    files = [f"{prefix}.{rank}" for rank in range(world)]
    for path in files:
        if os.path.exists(path):
            os.remove(path)
    run(cmd, os.devnull, env=dict(env or {}, DTRAIN_COUNTING_PEAK_FILE=prefix))
    for rank, path in enumerate(files):
        if not os.path.exists(path):
            sys.exit(f"gpt_bench: rank {rank} of {' '.join(cmd)} wrote no {path}; HINT: is the "
                     f"library given the one the target recompute_counting builds?")
    return max((json.load(open(path)) for path in files), key=lambda r: r["peak_bytes"])


def memory_pass(a, tmp, sides, counting):
    """One run of each side of --memory-steps steps under the counting allocator: ours' tensor
    storage and communicator buffers together (Note [Communicator buffers] in
    counting_library.cpp; dtrain over Gloo, whose buffers it counts), the peer's tensors."""
    prefix = os.path.join(tmp, "peak")
    # LD_PRELOAD through env(1), so that it reaches the workers only: loaded into launch too it
    # would pull libtorch in there and write a peak file of launch's own.
    ours = peaks(sides.ours(a.memory_steps, wrapper=["env", f"LD_PRELOAD={counting}"]), prefix,
                 sides.world, {"DTRAIN_SHM": "0"})
    if ours["buffer_peak_bytes"] == 0:
        sys.exit(f"gpt_bench: {counting} counted no communicator buffer of train_gpt (every "
                 f"configuration has gradient buckets); HINT: does libdtrain_comm.so still call "
                 f"HostBufferPool::allocate through its PLT? (Note [Communicator buffers])")
    peer = peaks(sides.peer(a.memory_steps, os.path.join(tmp, "peer-memory.jsonl"),
                            extra=["--counting-lib", counting]), prefix, sides.world)
    return {"ours_peak_tensor_bytes": ours["peak_bytes"],
            "ours_peak_tensor_storage_bytes": ours["tensor_peak_bytes"],
            "ours_peak_buffer_bytes": ours["buffer_peak_bytes"],
            "peer_peak_tensor_bytes": peer["peak_bytes"],
            "peak_tensor_ratio": ours["peak_bytes"] / peer["peak_bytes"]}


# The cgroup pass's model: too large for DDP at 4 ranks under the limit (57.0M parameters: 16
# bytes each per rank with AdamW under DDP, 16/4 under ZeRO-3), batch 1, 2 steps, 4 windows of
# closing evaluation.
CGROUP_SHAPE = ["--layers", "8", "--dim", "768", "--heads", "12", "--context", "128",
                "--eval-batches", "4"]
CGROUP_WORLD = 4


class MemoryCgroup:
    """A memory cgroup of its own (v1's memory controller or v2), made empty for one run: its
    limit, the command's wrapper that enters it, and its peak usage after the run (every process
    in it: launch and its workers)."""

    def __init__(self, name, limit):
        v1 = os.path.exists("/sys/fs/cgroup/memory/cgroup.procs")
        self.dir = os.path.join("/sys/fs/cgroup/memory" if v1 else "/sys/fs/cgroup", name)
        self.peak_file = "memory.max_usage_in_bytes" if v1 else "memory.peak"
        os.mkdir(self.dir)
        with open(os.path.join(self.dir, "memory.limit_in_bytes" if v1 else "memory.max"),
                  "w") as f:
            f.write(str(limit) if limit else ("-1" if v1 else "max"))

    def wrapper(self):
        return ["/bin/sh", "-c", f'echo $$ > {self.dir}/cgroup.procs && exec "$@"', "sh"]

    def peak(self):
        with open(os.path.join(self.dir, self.peak_file)) as f:
            return int(f.read())

    def remove(self):
        for _ in range(50):  # its processes leave it when they are reaped
            try:
                os.rmdir(self.dir)
                return
            except OSError:
                time.sleep(0.1)
        sys.exit(f"gpt_bench: the cgroup {self.dir} is still busy after its run")


def cgroup_unavailable():
    """Why no memory cgroup can be made here, or None."""
    try:
        probe = MemoryCgroup(f"gpt-bench-probe-{os.getpid()}", 0)
    except OSError as e:
        return f"cannot create a memory cgroup ({e}); needs root and a writable cgroup file system"
    probe.remove()
    return None


def in_cgroup(cmd, name, limit, env=None):
    """Runs cmd (launch and its workers) in a fresh memory cgroup: its exit code, output, the
    cgroup's peak bytes."""
    cgroup = MemoryCgroup(f"{name}-{os.getpid()}", limit)
    try:
        out = subprocess.run(cgroup.wrapper() + cmd, capture_output=True, text=True, timeout=900,
                             env=dict(os.environ, **(env or {})))
        return out.returncode, out.stdout + out.stderr, cgroup.peak()
    finally:
        cgroup.remove()


def cgroup_pass(a, tmp):
    """A GPT too large for DDP at 4 ranks (CGROUP_SHAPE), both sides: each run once in a cgroup
    without a limit for its peak, then every run again in a cgroup whose limit lies halfway
    between ZeRO-3 with recompute's peak and DDP's (ours): what trains there, and what launch
    says of what does not."""
    import torch
    from gpt_model import GPT, GPTConfig
    why = cgroup_unavailable()
    if why:
        print(f"# cgroup pass: SKIP: {why}")
        return []
    config = GPTConfig(layers=8, dim=768, heads=12, context=128)
    torch.manual_seed(0)
    model = GPT(config)
    init = os.path.join(tmp, "cgroup.pt")
    torch.save(model.state_dict(), init)
    parameters = sum(t.numel() for t in model.parameters())
    del model
    runs = {}
    metrics = os.path.join(tmp, "cgroup.jsonl")
    lm = ["--metrics-file", metrics, "--sample-interval", "0.2"]
    for name in ("zero3_rc", "ddp"):
        sides = Sides(a, "nano", CGROUP_WORLD, name, init, batch_size=1, shape=CGROUP_SHAPE)
        runs[("ours", name)] = (sides.ours(2, lm), sides.ours_env)
        runs[("peer", name)] = (sides.peer(2, os.path.join(tmp, "cgroup-peer.jsonl"), lm), None)
    rows = {}
    for (side, name), (cmd, env) in runs.items():
        if os.path.exists(metrics):
            os.remove(metrics)
        rc, out, peak = in_cgroup(cmd, "gpt-bench", 0, env)
        if rc != 0:
            sys.exit(f"gpt_bench: {side} {name} failed without a memory limit:\n{out[-3000:]}")
        rss = max(r["rss_peak_bytes"] for r in records(metrics)
                  if r.get("source") == "launch" and "rss_peak_bytes" in r)
        rows[(side, name)] = {"side": side, "config": name, "peak_unlimited_bytes": peak,
                              "rss_peak_per_rank_bytes": rss}
    low, high = (rows[("ours", "zero3_rc")]["peak_unlimited_bytes"],
                 rows[("ours", "ddp")]["peak_unlimited_bytes"])
    if low >= high:
        sys.exit(f"gpt_bench: ZeRO-3 with recompute peaked at {low / 2**20:.0f} MiB, DDP at "
                 f"{high / 2**20:.0f}: no limit lies between them for this model")
    limit = (low + high) // 2 // 2**20 * 2**20
    print(f"# cgroup pass: a GPT of {parameters / 1e6:.1f}M parameters "
          f"({' '.join(CGROUP_SHAPE)}), {CGROUP_WORLD} ranks, batch 1, 2 steps; peak: the "
          f"cgroup's (launch and every rank) without a limit; then each again under a limit of "
          f"{limit / 2**20:.0f} MiB (halfway between ours' zero3_rc and ddp)")
    print(f"# {'side':>5} {'config':>9} {'peak MiB':>9} {'rank RSS':>9}  under the limit")
    for (side, name), (cmd, env) in runs.items():
        rc, out, peak = in_cgroup(cmd, "gpt-bench", limit, env)
        oom = "likely killed by the OOM killer" in out
        # launch's one line on the root cause, without the kernel log's quote.
        said = next((line.strip().removeprefix("launch: ").split(" (kernel log")[0]
                     for line in out.splitlines() if "killed by SIGKILL" in line), "")
        row = rows[(side, name)]
        row.update(limit_bytes=limit, exit_code=rc, oom_said=oom, launch_line=said,
                   parameters=parameters)
        outcome = "trained" if rc == 0 else f"exit {rc}" + (f", launch: {said}" if said else "")
        print(f"  {side:>5} {name:>9} {row['peak_unlimited_bytes'] / 2**20:>9.0f} "
              f"{row['rss_peak_per_rank_bytes'] / 2**20:>9.0f}  {outcome}", flush=True)
    return list(rows.values())


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("build")
    p.add_argument("--presets", default="nano,small")
    p.add_argument("--worlds", default="2,4")
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--configs", default="ddp,zero3,zero3_rc,zero3_amp")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--shm", action="store_true", help="dtrain over shared memory (default: Gloo)")
    p.add_argument("--data", default="/usr/share/games/fortunes")
    p.add_argument("--memory-steps", type=int, default=4, help="steps of a memory pass's run")
    p.add_argument("--counting-lib", default="",
                   help="librecompute_counting.so for the memory pass (default: BUILD's)")
    passes = p.add_mutually_exclusive_group()
    passes.add_argument("--memory-only", action="store_true", help="the memory pass alone")
    passes.add_argument("--no-memory", action="store_true", help="the timed pairs alone")
    passes.add_argument("--cgroup", action="store_true",
                        help="the memory-cgroup pass alone (root; SKIP otherwise)")
    p.add_argument("--json", default="")
    a = p.parse_args()
    import torch
    from gpt_model import GPT, GPTConfig

    if a.cgroup:
        with tempfile.TemporaryDirectory() as tmp:
            results = cgroup_pass(a, tmp)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(results, f, indent=1)
        return
    timed, counted = not a.memory_only, not a.no_memory
    counting = os.path.abspath(a.counting_lib or os.path.join(a.build, "librecompute_counting.so"))
    if counted and not os.path.isfile(counting):
        sys.exit(f"gpt_bench: no counting library {counting} for the memory pass; HINT: build the "
                 f"target recompute_counting, give --counting-lib, or --no-memory")
    results = []
    if timed:
        print(f"# gpt_bench: {a.pairs} pairs per row, {a.steps} steps each (medians after "
              f"{a.warmup}), batch {a.batch_size} per rank, 1 thread per rank; dtrain over "
              f"{'shared memory' if a.shm else 'Gloo'}, the peer over Gloo (PyTorch "
              f"{torch.__version__}); ratio: ours / the peer's tokens/s, median [min-max] of the "
              f"pairs; ms: ours/peer's median step parts; rss: peak resident MiB per rank "
              f"(largest)")
    if counted:
        print(f"# memory pass: one run per side of {a.memory_steps} steps, batch {a.batch_size} "
              f"per rank, under the counting allocator (PyTorch {torch.__version__}); tensor: "
              f"peak live tensor MiB per rank over the whole run (largest rank), ours with its "
              f"communicator buffers (buffers: their own peak), and the peer's")
    print(f"# {'preset':>6} {'world':>5} {'config':>10}"
          + (f" {'ours tok/s':>10} {'peer tok/s':>10} {'ratio':>6} {'[min-max]':>13} "
             f"{'fwd ms':>13} {'bwd ms':>13} {'opt ms':>11} {'rss ours':>8} {'peer':>6} "
             f"{'ratio':>6}" if timed else "")
          + (f" {'tensor ours':>11} {'buffers':>7} {'peer':>7} {'ratio':>6}" if counted else ""))
    with tempfile.TemporaryDirectory() as tmp:
        for preset in a.presets.split(","):
            config = GPTConfig.preset(preset)
            torch.manual_seed(0)
            init = os.path.join(tmp, f"{preset}.pt")
            torch.save(GPT(config).state_dict(), init)
            tokens = a.batch_size * config.context
            for world in [int(w) for w in a.worlds.split(",")]:
                for name in a.configs.split(","):
                    sides = Sides(a, preset, world, name, init)
                    row = {"preset": preset, "world": world, "config": name}
                    line = f"  {preset:>6} {world:>5} {name:>10}"
                    if counted:
                        row.update(memory_pass(a, tmp, sides, counting))
                    if timed:
                        pairs = timed_pairs(a, tmp, sides)

                        def med(side, key):
                            return median(p[side][key] for p in pairs)
                        # ours / the peer's tokens/s per pair: the peer's step / ours.
                        ratios = paired_ratios([p["peer"]["step"] for p in pairs],
                                               [p["ours"]["step"] for p in pairs])
                        lo, hi = spread(ratios)
                        row.update(ours_tokens_per_s=tokens * world / med("ours", "step"),
                                   peer_tokens_per_s=tokens * world / med("peer", "step"),
                                   ratio=median(ratios), ratio_min=lo, ratio_max=hi, pairs=pairs)
                        for side in ("ours", "peer"):
                            for key in ("forward", "backward", "optimizer", "rss"):
                                row[f"{side}_{key}"] = med(side, key)
                        ms = {k: f"{row['ours_' + k] * 1e3:.0f}/{row['peer_' + k] * 1e3:.0f}"
                              for k in ("forward", "backward", "optimizer")}
                        line += (f" {row['ours_tokens_per_s']:>10.0f} "
                                 f"{row['peer_tokens_per_s']:>10.0f} {row['ratio']:>6.3f} "
                                 f"[{lo:.3f}-{hi:.3f}] {ms['forward']:>13} {ms['backward']:>13} "
                                 f"{ms['optimizer']:>11} {row['ours_rss'] / 2**20:>8.0f} "
                                 f"{row['peer_rss'] / 2**20:>6.0f} "
                                 f"{row['ours_rss'] / row['peer_rss']:>6.3f}")
                    if counted:
                        line += (f" {row['ours_peak_tensor_bytes'] / 2**20:>11.1f} "
                                 f"{row['ours_peak_buffer_bytes'] / 2**20:>7.1f} "
                                 f"{row['peer_peak_tensor_bytes'] / 2**20:>7.1f} "
                                 f"{row['peak_tensor_ratio']:>6.3f}")
                    results.append(row)
                    print(line, flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
