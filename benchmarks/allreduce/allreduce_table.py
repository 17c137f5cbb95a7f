#!/usr/bin/env python3
"""The allreduce tables of benchmarks/README.md: allreduce_bench run several times, medians.

    allreduce_table.py [--runs 5] [--world 2] [--before OLD_BENCH] [--out DIR] BENCH [-- ARGS...]

Runs BENCH (build/allreduce_bench) --runs times with --world and ARGS; with --before, an older
build's allreduce_bench runs beside it in every run, the two in alternating order, so both see the
same machine. Each run's output and the load average (/proc/loadavg) before and after it are kept
in DIR (a fresh temporary directory by default). Prints Markdown: per size the median over runs of
each column, every ratio as the median of the runs' own ratios (each taken inside one run, where
the contenders were interleaved round by round), and the load of every run.
"""
import argparse
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from stats import median  # noqa: E402


def load_average():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def parse(text):
    """Rows of one allreduce_bench output: {size: {column: value}}, columns as in its header."""
    columns, rows = None, {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        cells = [c for part in line.split("|") for c in part.split()]
        if cells[0] == "size":
            columns = cells
            continue
        if columns is None or len(cells) != len(columns):
            continue
        row = {}
        for name, cell in zip(columns, cells):
            try:
                row[name] = float(cell)
            except ValueError:
                row[name] = None  # "-": no such contender in this run
        rows[int(row["size"])] = row
    return columns, rows


def human(size):
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= div:
            return f"{size // div} {unit}"
    return f"{size} B"


def fmt(v):
    if v is None:
        return "-"
    if v >= 100:
        return f"{v:.1f}"
    if v >= 0.1:
        return f"{v:.2f}"
    return f"{v:.3f}"


def median_of(runs, size, column):
    values = [r[size][column] for r in runs if size in r and r[size].get(column) is not None]
    return median(values, when_empty=None)


def run_once(bench, world, args, out_dir, tag, index):
    before = load_average()
    result = subprocess.run([bench, "--world", str(world)] + args, capture_output=True, text=True)
    after = load_average()
    path = os.path.join(out_dir, f"{tag}.{index}.txt")
    with open(path, "w") as f:
        f.write(f"# load {before:.2f} -> {after:.2f}\n{result.stdout}{result.stderr}")
    if result.returncode != 0:
        sys.exit(f"allreduce_table: {bench} exited {result.returncode}; its output is in {path}")
    return parse(result.stdout), (before, after)


def print_table(title, columns, runs, loads):
    times = [c for c in columns if c.endswith("_us")]
    first = columns.index("op") + 1
    rates = [c for c in columns[first:] if c not in times and c not in ("#wrong",) and "/" not in c]
    ratios = [c for c in columns if "/" in c]
    sizes = sorted({s for r in runs for s in r})
    print(f"\n{title}: {len(runs)} runs, load " +
          ", ".join(f"{b:.1f}-{a:.1f}" for b, a in loads))
    head = ["size"] + [t.replace("_us", " µs") for t in times] + rates
    print("\n| " + " | ".join(head) + " |\n|" + "---:|" * len(head))
    for s in sizes:
        cells = [human(s)] + [fmt(median_of(runs, s, c)) for c in times + rates]
        print("| " + " | ".join(cells) + " |")
    shown = [c for c in ratios if any(median_of(runs, s, c) is not None for s in sizes)]
    print("\n| size | " + " | ".join(shown) + " |\n|" + "---:|" * (len(shown) + 1))
    for s in sizes:
        print("| " + " | ".join([human(s)] + [fmt(median_of(runs, s, c)) for c in shown]) + " |")
    wrong = sum(r[s].get("#wrong") or 0 for r in runs for s in r)
    print(f"\n#wrong over all runs and cells: {int(wrong)}")


def print_before_after(before, after):
    sizes = sorted({s for r in after for s in r})
    pairs = [("shm_us", "shm µs"), ("shm-own_us", "shm-own µs"), ("shm/mpi", "shm/mpi"),
             ("own/mpi", "own/mpi")]
    head = ["size"] + [f"{label} before" for _, label in pairs] + \
           [f"{label} after" for _, label in pairs]
    print("\nBefore and after, the same runs:\n\n| " + " | ".join(head) + " |\n|" +
          "---:|" * len(head))
    for s in sizes:
        cells = [human(s)] + [fmt(median_of(before, s, c)) for c, _ in pairs] + \
                [fmt(median_of(after, s, c)) for c, _ in pairs]
        print("| " + " | ".join(cells) + " |")


def main():
    argv = sys.argv[1:]
    extra = []
    if "--" in argv:
        extra = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bench")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--before", help="an older build's allreduce_bench, run beside BENCH")
    p.add_argument("--out", help="where each run's output goes (default: a new temporary dir)")
    o = p.parse_args(argv)
    out_dir = o.out or tempfile.mkdtemp(prefix="allreduce_table.")
    os.makedirs(out_dir, exist_ok=True)
    after, before, loads_after, loads_before = [], [], [], []
    columns = None
    for i in range(o.runs):
        order = [("after", o.bench), ("before", o.before)] if i % 2 == 0 else \
                [("before", o.before), ("after", o.bench)]
        for tag, bench in order:
            if bench is None:
                continue
            (cols, rows), load = run_once(bench, o.world, extra, out_dir, tag, i)
            if tag == "after":
                columns = cols
                after.append(rows)
                loads_after.append(load)
            else:
                before.append(rows)
                loads_before.append(load)
    print(f"allreduce_table: world {o.world}, {o.runs} runs, args {' '.join(extra) or '(none)'}; "
          f"raw outputs in {out_dir}")
    print_table("After" if before else "Results", columns, after, loads_after)
    if before:
        print_table("Before", columns, before, loads_before)
        print_before_after(before, after)


if __name__ == "__main__":
    main()
