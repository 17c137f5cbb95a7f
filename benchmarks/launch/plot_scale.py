#!/usr/bin/env python3
"""Draws launch_scale_bench's figures against N (benchmarks/README.md): rendezvous time of launch
and torchrun, and the store's steady load by class, with the requests of one rendezvous per node.

    launch_scale_bench --csv scale.csv
    .venv/bin/python3 benchmarks/launch/plot_scale.py scale.csv scale.png

The point is the curves' shape: flat or linear in N, never quadratic.
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read(path):
    rows = {"launch": [], "torchrun": []}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            rows[row["who"]].append({k: (float(v) if k != "who" else v) for k, v in row.items()})
    for who in rows:
        rows[who].sort(key=lambda r: r["nodes"])
    return rows


def series(rows, field):
    points = [(r["nodes"], r[field]) for r in rows if r[field] >= 0]
    return [p[0] for p in points], [p[1] for p in points]


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: plot_scale.py SCALE.csv OUT.png")
    rows = read(sys.argv[1])
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))

    for who, style in (("launch", "-o"), ("torchrun", "--s")):
        for field, label in (("start_to_plans", "all started -> all ranks"),
                             ("join_to_plans", "last join -> all ranks")):
            x, y = series(rows[who], field)
            if x:
                left.plot(x, y, style, label=f"{who}: {label}")
    left.set_xscale("log", base=2)
    left.set_yscale("log")
    left.set_xlabel("simulated nodes N")
    left.set_ylabel("seconds")
    left.set_title("Rendezvous")
    left.grid(True, which="both", alpha=0.3)
    left.legend(fontsize=8)

    for field, label in (("heartbeats_per_s", "heartbeats / s"),
                         ("monitoring_per_s", "monitoring (progress, samples) / s"),
                         ("rest_per_s", "everything else / s")):
        x, y = series(rows["launch"], field)
        if x:
            right.plot(x, y, "-o", label=label)
    x, y = series(rows["launch"], "rendezvous_requests_per_node")
    if x:
        right.plot(x, y, ":^", label="requests of a rendezvous / N")
    right.set_xscale("log", base=2)
    right.set_yscale("log")
    right.set_xlabel("simulated nodes N")
    right.set_ylabel("store requests")
    right.set_title("launch's store at steady state (heartbeat every 5 s)")
    right.grid(True, which="both", alpha=0.3)
    right.legend(fontsize=8)

    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)


if __name__ == "__main__":
    main()
