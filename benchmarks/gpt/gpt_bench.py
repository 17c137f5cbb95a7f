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

  benchmarks/gpt/gpt_bench.py BUILD [--presets nano,small] [--worlds 2,4] [--pairs 5]
                              [--steps 12] [--warmup 4] [--configs ddp,zero3,zero3_rc,zero3_amp]
                              [--batch-size 8] [--json FILE]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
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
    p.add_argument("--json", default="")
    a = p.parse_args()
    import torch
    from gpt_model import GPT, GPTConfig

    launch = os.path.join(a.build, "launch")
    trainer = os.path.join(a.build, "train_gpt")
    peer = os.path.join(HERE, "gpt_peer.py")
    results = []
    print(f"# gpt_bench: {a.pairs} pairs per row, {a.steps} steps each (medians after "
          f"{a.warmup}), batch {a.batch_size} per rank, 1 thread per rank; dtrain over "
          f"{'shared memory' if a.shm else 'Gloo'}, the peer over Gloo (PyTorch "
          f"{torch.__version__}); ratio: ours / the peer's tokens/s, median [min-max] of the "
          f"pairs; ms: ours/peer's median step parts; rss: peak resident MiB per rank (largest)")
    print(f"# {'preset':>6} {'world':>5} {'config':>10} {'ours tok/s':>10} {'peer tok/s':>10} "
          f"{'ratio':>6} {'[min-max]':>13} {'fwd ms':>13} {'bwd ms':>13} {'opt ms':>11} "
          f"{'rss ours':>8} {'peer':>6} {'ratio':>6}")
    with tempfile.TemporaryDirectory() as tmp:
        for preset in a.presets.split(","):
            config = GPTConfig.preset(preset)
            torch.manual_seed(0)
            init = os.path.join(tmp, f"{preset}.pt")
            torch.save(GPT(config).state_dict(), init)
            tokens = a.batch_size * config.context
            common = ["--preset", preset, "--steps", str(a.steps), "--batch-size",
                      str(a.batch_size), "--warmup-steps", "2", "--data", a.data, "--init-from",
                      init, "--threads", "1"]
            for world in [int(w) for w in a.worlds.split(",")]:
                for name in a.configs.split(","):
                    ours_flags, peer_flags = CONFIGS[name]
                    pairs = []
                    for i in range(a.pairs):
                        sides = {}
                        for side in (["ours", "peer"] if i % 2 == 0 else ["peer", "ours"]):
                            metrics = os.path.join(tmp, f"{side}.jsonl")
                            if os.path.exists(metrics):
                                os.remove(metrics)
                            lm = ["--metrics-file", metrics, "--sample-interval", "0.2"]
                            if side == "ours":
                                cmd = ([launch, "--nproc-per-node", str(world)] + lm
                                       + [trainer] + common + ours_flags
                                       + ["--eval-every", "0", "--sample-tokens", "0"])
                                steps, rss = run(cmd, metrics,
                                                 env=None if a.shm else {"DTRAIN_SHM": "0"})
                            else:
                                peer_metrics = os.path.join(tmp, "peer-steps.jsonl")
                                cmd = ([launch, "--nproc-per-node", str(world)] + lm
                                       + ["--python", sys.executable, peer] + common + peer_flags
                                       + ["--metrics-file", peer_metrics])
                                _, rss = run(cmd, metrics)
                                steps = records(peer_metrics)
                                steps = [s for s in steps if "step_seconds" in s]
                            sides[side] = {
                                k: median_after(steps, k + "_seconds", a.warmup)
                                for k in ("step", "forward", "backward", "optimizer")}
                            sides[side]["rss"] = rss
                        pairs.append(sides)
                    def side_of(side, key):
                        return [p[side][key] for p in pairs]

                    def med(side, key):
                        return median(side_of(side, key))
                    # ours / the peer's tokens/s per pair: the peer's step / ours.
                    ratios = paired_ratios(side_of("peer", "step"), side_of("ours", "step"))
                    lo, hi = spread(ratios)
                    row = {"preset": preset, "world": world, "config": name,
                           "ours_tokens_per_s": tokens * world / med("ours", "step"),
                           "peer_tokens_per_s": tokens * world / med("peer", "step"),
                           "ratio": median(ratios), "ratio_min": lo, "ratio_max": hi,
                           "pairs": pairs}
                    for side in ("ours", "peer"):
                        for key in ("forward", "backward", "optimizer", "rss"):
                            row[f"{side}_{key}"] = med(side, key)
                    results.append(row)
                    ms = {k: f"{row['ours_' + k] * 1e3:.0f}/{row['peer_' + k] * 1e3:.0f}"
                          for k in ("forward", "backward", "optimizer")}
                    print(f"  {preset:>6} {world:>5} {name:>10} {row['ours_tokens_per_s']:>10.0f} "
                          f"{row['peer_tokens_per_s']:>10.0f} {row['ratio']:>6.3f} "
                          f"[{row['ratio_min']:.3f}-{row['ratio_max']:.3f}] {ms['forward']:>13} "
                          f"{ms['backward']:>13} {ms['optimizer']:>11} "
                          f"{row['ours_rss'] / 2**20:>8.0f} {row['peer_rss'] / 2**20:>6.0f} "
                          f"{row['ours_rss'] / row['peer_rss']:>6.3f}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
