#!/usr/bin/env python3
"""docs/launch.md's table of torchrun's options against torchrun and against launch: every option
string of the installed torch's `torchrun` parser has a row (all aliases of one option in one
row), the table names no option torchrun lacks, and launch does with each spelling what its row
says: "accepted" exits 0 running a quick program; "accepted, ignored with a warning" exits 0 and
prints a warning naming the option; "refused: ..." exits 2 with a message naming the option.

Usage: torchrun_flags_test.py <build-dir> <source-dir>
"""
import os
import re
import socket
import subprocess
import sys
import tempfile

import torch
from torch.distributed.run import get_args_parser

BUILD = os.path.abspath(sys.argv[1])
SOURCE = os.path.abspath(sys.argv[2])
LAUNCH = os.path.join(BUILD, "launch")
DOC = os.path.join(SOURCE, "docs", "launch.md")
SECTION = "## torchrun compatibility"
MARKS = ("accepted, ignored with a warning", "accepted", "refused")
USAGE_ERROR = "(exit 2: usage error"  # how launch ends a usage error's message


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_options():
    """[option strings of one option] for each of torchrun's options, and whether it takes a
    value."""
    options = []
    for action in get_args_parser()._actions:
        if action.option_strings:
            options.append((tuple(action.option_strings), action.nargs != 0))
    return options


def table_rows():
    """[(line number, (option strings), mark, launch cell)] of the table in SECTION."""
    with open(DOC, encoding="utf-8") as f:
        lines = f.read().split("\n")
    start = lines.index(SECTION)  # ValueError names the missing section
    rows = []
    for number, line in enumerate(lines[start + 1:], start + 2):
        if line.startswith("## "):
            break
        if not line.startswith("| `-"):
            continue  # prose, the header, the separator
        cells = [c.strip() for c in line.strip("|").split("|")]
        names = tuple(re.findall(r"`(-[^`]+)`", cells[0]))
        mark = next((m for m in MARKS if cells[1].startswith(m)), None)
        rows.append((number, names, mark, cells[1]))
    return rows


def sample_args(name, takes_value, tmp):
    """The arguments that try `name`: a value that launch takes, where it takes one."""
    canonical = name.lstrip("-").replace("_", "-")
    values = {
        "nnodes": "1",
        "nproc-per-node": "1",
        "rdzv-backend": "c10d",
        "rdzv-endpoint": "127.0.0.1:%d" % free_port(),
        "rdzv-id": "torchrun-flags",
        "max-restarts": "0",
        "monitor-interval": "0.1",
        "start-method": "spawn",
        "role": "trainer",
        "log-dir": os.path.join(tmp, "logs"),
        "r": "0", "redirects": "0",
        "t": "0", "tee": "0",
        "log-line-prefix-template": "[${rank}] ",
        "local-ranks-filter": "0",
        "node-rank": "0",
        "master-addr": "127.0.0.1",
        "master-port": str(free_port()),
    }
    return [name, values.get(canonical, "1")] if takes_value else [name]


def run_launch(name, takes_value, tmp):
    """launch's exit status and output with `name` among its options."""
    program = ["/bin/true"]
    extra = []
    if name in ("-m", "--module"):  # PROGRAM is then a module
        extra, program = ["--python", sys.executable], ["platform"]
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DTRAIN_", "SLURM_", "PET_", "TORCHELASTIC_"))}
    argv = [LAUNCH, "--nproc-per-node", "1"] + extra + sample_args(name, takes_value, tmp) + program
    try:
        p = subprocess.run(argv, cwd=tmp, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        return None, "timed out after 20 s: " + " ".join(argv[1:])
    return p.returncode, p.stdout


def names_option(output, name):
    """Whether output names the option as given or in launch's dash spelling of it."""
    spellings = {name, "--" + name.lstrip("-").replace("_", "-")}
    return any(re.search(re.escape(s) + r"(?![a-z0-9_-])", output) for s in spellings)


def main():
    problems = []
    options = torchrun_options()
    takes_value = {s: v for strings, v in options for s in strings}
    rows = table_rows()
    if not rows:
        print("FAIL: docs/launch.md has no table under %r" % SECTION)
        return 1

    in_table = {}
    for number, names, mark, cell in rows:
        for n in names:
            if n in in_table:
                problems.append("docs/launch.md:%d: %s has a row already (line %d)"
                                % (number, n, in_table[n]))
            in_table[n] = number
        if mark is None:
            problems.append("docs/launch.md:%d: the launch column %r is none of: %s"
                            % (number, cell, "; ".join(MARKS)))
    for strings, _ in options:
        missing = [s for s in strings if s not in in_table]
        if missing:
            problems.append("torchrun option %s is missing from the table in docs/launch.md"
                            % ", ".join(missing))
        elif len({in_table[s] for s in strings}) > 1:
            problems.append("torchrun option %s is split over rows %s of docs/launch.md; one "
                            "row per option" % (", ".join(strings),
                                               sorted({in_table[s] for s in strings})))
    for n, number in sorted(in_table.items(), key=lambda kv: kv[1]):
        if n not in takes_value:
            problems.append("docs/launch.md:%d: %s is not an option of torchrun %s"
                            % (number, n, torch.__version__))

    with tempfile.TemporaryDirectory(prefix="torchrun_flags.") as tmp:
        for number, names, mark, cell in rows:
            for n in names:
                if mark is None or n not in takes_value:
                    continue
                status, output = run_launch(n, takes_value[n], tmp)
                where = "docs/launch.md:%d: launch ... %s (%s)" % (number, n, mark)
                excerpt = "\n    ".join(output.strip().splitlines()[-5:])
                if status is None:
                    problems.append("%s: %s" % (where, output))
                elif mark == "refused":
                    if status != 2 or not names_option(output, n):
                        problems.append("%s: want exit 2 and a message naming %s, got exit %d:\n"
                                        "    %s" % (where, n, status, excerpt))
                elif status != 0 or USAGE_ERROR in output:
                    problems.append("%s: want exit 0, got exit %d:\n    %s"
                                    % (where, status, excerpt))
                elif mark.startswith("accepted, ignored") and not any(
                        "warning" in line.lower() and names_option(line, n)
                        for line in output.splitlines()):
                    problems.append("%s: exit 0 but no warning line names %s:\n    %s"
                                    % (where, n, excerpt))

    for p in problems:
        print("FAIL: " + p)
    if problems:
        return 1
    print("torchrun_flags: ok (%d torchrun options, %d spellings tried)"
          % (len(options), len(takes_value)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
