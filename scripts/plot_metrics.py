#!/usr/bin/env python3
"""Plots dtrain metrics files (JSONL, one record a line: docs/design.md#metrics) into
one PNG: a trainer's file, launch's --metrics-file, or both.

    scripts/plot_metrics.py metrics.jsonl                    # writes metrics.png beside it
    scripts/plot_metrics.py -o runs.png a.jsonl b.jsonl      # several runs in one figure
    scripts/plot_metrics.py -o job.png launch.jsonl          # launch's file: the whole job
    scripts/plot_metrics.py --fields loss,rss_bytes launch.jsonl

Default panels, each drawn when a file has its fields: loss, accuracy and samples/s (trainer
records), then CPU % and resident memory per rank and GPU utilisation and memory per GPU
(launch's samples). One line per series: per run (`run_id`) and, where a file holds several, per
node, rank or GPU -- launch's file has every rank's trainer records and samples, so each rank gets
its own line. Trainer records (they have a `step`) are drawn against the step; records without
one (launch's samples) against seconds since the run's first record. A restarted run appends to
the same file, its line going on from the step it resumed from (back, when steps were redone),
and the trainer's `resumed` record draws a dashed line there.
Needs matplotlib (the project's .venv has it: scripts/requirements.txt). Exits 2 on a malformed
file, naming file and line.
"""
import argparse
import collections
import json
import math
import os
import sys

DEFAULT_PANELS = [
    ("loss", ["loss"]),
    ("accuracy", ["accuracy", "test_accuracy"]),
    ("samples/s", ["samples_per_s"]),
    ("CPU % of a core, per rank", ["cpu_percent"]),
    ("resident memory (bytes), per rank", ["rss_bytes"]),
    ("GPU utilisation %", ["gpu_util"]),
    ("GPU memory in use (bytes)", ["gpu_mem_used_bytes"]),
]
SCHEMA_KEYS = {"time", "source", "run_id", "node", "rank", "gpu", "interface", "mount", "step"}


def fail(message):
    print(f"plot_metrics.py: {message}", file=sys.stderr)
    sys.exit(2)


def read_records(path):
    records = []
    try:
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    fail(f"{path}:{number}: not JSON ({e.msg})")
                if not isinstance(record, dict) or not isinstance(record.get("time"), (int, float)):
                    fail(f"{path}:{number}: not a metrics record (an object with a numeric 'time')")
                records.append(record)
    except OSError as e:
        fail(f"cannot read {path}: {e.strerror}")
    return records


def smooth(values, window):
    """Trailing moving average that skips missing (None/NaN) values."""
    out, recent = [], collections.deque()
    for v in values:
        if v is not None and not math.isnan(v):
            recent.append(v)
            if len(recent) > window:
                recent.popleft()
        out.append(sum(recent) / len(recent) if recent else float("nan"))
    return out


def series_key(record):
    """What tells one line of a run from another: the node, GPU and rank a record is about."""
    return (record.get("node") or "", record.get("gpu"), record.get("rank"))


def series(records, field):
    """{key: (x, y)} of one field of one run, and the x label: by step when the records have one,
    else by seconds since the run's first record."""
    points = [r for r in records if field in r]
    if not points:
        return {}, None
    by_step = all("step" in r for r in points)
    start = min(r["time"] for r in records)
    out = collections.OrderedDict()
    for r in points:
        xs, ys = out.setdefault(series_key(r), ([], []))
        xs.append(r["step"] if by_step else r["time"] - start)
        ys.append(float("nan") if r[field] is None else float(r[field]))
    return out, "step" if by_step else "seconds"


def line_label(run, key, field, show_run, show_node, show_index, show_field):
    node, gpu, rank = key
    parts = [run] if show_run else []
    if show_node and node:
        parts.append(node)
    if show_index and gpu is not None:
        parts.append(f"gpu {gpu}")
    if show_index and rank is not None:
        parts.append(f"rank {rank}")
    if show_field:
        parts.append(field)
    return " ".join(parts) or run


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", help="JSONL metrics files")
    parser.add_argument("-o", "--output", help="PNG to write (default: the first file's name with .png)")
    parser.add_argument("--fields", help="comma-separated fields, one panel each, instead of "
                                         "the default panels (loss, accuracy, samples/s, CPU, "
                                         "memory, GPU)")
    parser.add_argument("--smooth", type=int, default=10,
                        help="moving-average window over steps for per-step fields (default 10)")
    args = parser.parse_args()
    if args.smooth < 1:
        fail("--smooth must be at least 1")

    runs = collections.OrderedDict()  # run label -> records
    for path in args.files:
        for record in read_records(path):
            label = record.get("run_id") or os.path.basename(path)
            runs.setdefault(label, []).append(record)
    if not runs:
        fail("no records in " + ", ".join(args.files))
    for records in runs.values():
        records.sort(key=lambda r: r["time"])

    panels = DEFAULT_PANELS
    if args.fields:
        panels = [(f, [f]) for f in args.fields.split(",") if f]
    present = {k for records in runs.values() for r in records for k in r} - SCHEMA_KEYS
    panels = [(title, [f for f in fields if f in present]) for title, fields in panels]
    panels = [(title, fields) for title, fields in panels if fields]
    if not panels:
        fail("none of the fields to plot occur in the files (fields present: "
             + ", ".join(sorted(present)) + ")")

    import matplotlib
    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 3 * len(panels)), squeeze=False)
    lines = []  # per panel
    for (title, fields), ax in zip(panels, axes[:, 0]):
        drawn = collections.OrderedDict()  # (run, key, field) -> (x, y)
        xlabel = None
        for label, records in runs.items():
            for field in fields:
                by_key, x = series(records, field)
                xlabel = xlabel or x
                for key, xy in by_key.items():
                    drawn[(label, key, field)] = xy
        nodes = {key[0] for _, key, _ in drawn}
        indices = {key[1:] for _, key, _ in drawn}
        for (label, key, field), (xs, ys) in drawn.items():
            # Sparse fields (test accuracy after each evaluation) are drawn as they are.
            window = args.smooth if len(xs) > 4 * args.smooth else 1
            name = line_label(label, key, field, show_run=len(runs) > 1, show_node=len(nodes) > 1,
                              show_index=len(indices) > 1, show_field=len(fields) > 1)
            ax.plot(xs, smooth(ys, window), label=name, marker="o" if len(xs) < 30 else None)
        ax.set_xlabel(xlabel)
        # A run resumed from a checkpoint (the trainer's `resumed` record): a dashed line there.
        for records in runs.values():
            for r in records:
                if "resumed" in r and "step" in r and xlabel == "step":
                    ax.axvline(r["step"], color="grey", linestyle="--", linewidth=1)
        lines.append(len(drawn))
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        if len(drawn) <= 16:
            ax.legend(fontsize="small")
        else:  # a legend of hundreds of ranks hides the plot
            ax.text(0.99, 0.98, f"{len(drawn)} lines", transform=ax.transAxes, ha="right",
                    va="top", fontsize="small")
    fig.tight_layout()
    output = args.output or os.path.splitext(args.files[0])[0] + ".png"
    fig.savefig(output, dpi=100)
    print(f"plot_metrics.py: wrote {output} ({len(runs)} run(s), "
          f"{sum(len(r) for r in runs.values())} records; panels: "
          + "; ".join(f"{title}: {n} line(s)" for (title, _), n in zip(panels, lines)) + ")")


if __name__ == "__main__":
    main()
