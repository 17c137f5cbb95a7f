#!/usr/bin/env python3
"""train_resnet under launch with 2 ranks, at a small size (ResNet-18 of width 8 on a synthetic
CIFAR-10 of 1,200 images): the loss falls, the ranks end bitwise equal, the metrics file holds a
record per step in the schema, the Prometheus endpoint answers a scrape mid-run (parsed, not
grepped), --amp trains on the CPU, a rank killed mid-run is restarted and resumes from its
checkpoint bitwise, bad input exits with one clear message, and under a launch that watches
(--metrics-port, --metrics-file) every rank's figures reach launch's endpoint and file beside
launch's own samples, with no port of the trainer's; --zero 1 and 2 train as DDP does, --zero 3
ends bitwise equal to --zero 2; --recompute ends bitwise equal.

Usage: train_resnet_test.py <build-dir> [test ...]   (tests: train, amp, resume, usage,
data, watch, zero, zero3, recompute; default all)
"""
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

BUILD = os.path.abspath(sys.argv[1])
SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAUNCH = os.path.join(BUILD, "launch")
TRAINER = os.path.join(BUILD, "train_resnet")
SMALL = ["--arch", "resnet18", "--width", "8", "--batch-size", "16", "--warmup-steps", "5", "--lr", "0.8",
         "--threads", "1"]


def fail(message):
    print("FAIL: " + message)
    sys.exit(1)


def parse_prometheus(text):
    """{(name, frozenset(labels)): value} and {name: type} of a text exposition; raises on lines
    outside the grammar dtrain writes."""
    samples, types = {}, {}
    sample = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
    label = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(?:,|$)')
    for line in text.splitlines():
        if not line:
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            types[name] = kind
            continue
        if line.startswith("#"):
            continue
        m = sample.match(line)
        if not m:
            raise ValueError(f"not a sample line: {line!r}")
        name, labels, value = m.groups()
        if name not in types:
            raise ValueError(f"{name} has no TYPE line before its samples")
        pairs = label.findall(labels or "")
        if "".join(f'{k}="{v}",' for k, v in pairs).rstrip(",") != (labels or ""):
            raise ValueError(f"bad label set in {line!r}")
        samples[(name, frozenset(pairs))] = float(value)
    return samples, types


class Run:
    """A launch job whose output is read line by line on a thread."""

    def __init__(self, args, env=None, launch_args=()):
        full_env = dict(os.environ, **(env or {}))
        self.proc = subprocess.Popen([LAUNCH, "--nproc-per-node", "2", *launch_args, TRAINER] + args,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=full_env)
        self.lines = []
        self.reader = threading.Thread(target=self._read)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            sys.stdout.write(line)
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, pattern, timeout):
        deadline = time.time() + timeout
        while time.time() < deadline:
            for line in list(self.lines):
                m = re.search(pattern, line)
                if m:
                    return m
            if self.proc.poll() is not None and not self.reader.is_alive():
                break
            time.sleep(0.05)
        fail(f"no line matching {pattern!r} within {timeout} s")

    def finish(self, timeout=240):
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            fail(f"launch did not finish within {timeout} s")
        self.reader.join()
        return rc


def step_records(path):
    with open(path) as f:
        records = [json.loads(line) for line in f]
    for r in records:
        for key, kind in (("time", (int, float)), ("source", str), ("run_id", str),
                          ("node", str), ("rank", int), ("step", int)):
            if not isinstance(r.get(key), kind):
                fail(f"metrics record without a valid {key!r}: {r}")
        if r["source"] != "trainer" or r["rank"] != 0:
            fail(f"unexpected source/rank: {r}")
    return records


def check_training(run):
    """The loss fell below 70% of the first interval's, the ranks ended bitwise equal, and the
    summary came; returns the number of steps."""
    total = int(run.wait_for(r"step \d+/(\d+)", 1).group(1))
    losses = [float(m.group(1)) for line in run.lines
              for m in [re.search(r"epoch \d+/\d+  step \d+/\d+  loss ([0-9.]+)", line)] if m]
    if len(losses) < 3:
        fail(f"expected at least 3 progress lines, got {len(losses)}")
    if not losses[-1] < 0.7 * losses[0]:
        fail(f"loss {losses[-1]} at the end is not below 70% of the first interval's {losses[0]}")
    fingerprints(run)
    run.wait_for(r"done: \d+ steps .* test accuracy [0-9.]+%", 1)
    return total


def test_train():
    with tempfile.TemporaryDirectory() as tmp:
        metrics = os.path.join(tmp, "metrics.jsonl")
        # Rank 0 pauses 3 s before step 12 (DTRAIN_FAULT slow), so the scrape below sees a
        # known step.
        run = Run(SMALL + ["--synthetic", "1200", "--data-dir", os.path.join(tmp, "data"),
                           "--epochs", "3", "--log-every", "12", "--metrics-file", metrics,
                           "--metrics-port", "0"],
                  env={"DTRAIN_FAULT": "slow:3000@rank=0,step=12"})
        port = int(run.wait_for(r"metrics: http://[^:]+:(\d+)/metrics", 120).group(1))
        deadline = time.time() + 60
        while time.time() < deadline:
            if os.path.exists(metrics) and sum(1 for _ in open(metrics)) >= 12:
                break
            time.sleep(0.02)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as res:
            content_type = res.headers["Content-Type"]
            body = res.read().decode()
        if not content_type.startswith("text/plain; version=0.0.4"):
            fail(f"Content-Type {content_type}")
        samples, types = parse_prometheus(body)
        series = {name: value for (name, labels), value in samples.items()
                  if dict(labels).get("rank") == "0" and "node" in dict(labels)}
        for name in ("dtrain_step", "dtrain_loss", "dtrain_accuracy", "dtrain_samples_per_s",
                     "dtrain_lr", "dtrain_allreduce_wait_share"):
            if name not in series or types.get(name) != "gauge":
                fail(f"scrape lacks the gauge {name}: {body}")
        if series["dtrain_step"] != 12:
            fail(f"scraped during the pause before step 12, got step {series['dtrain_step']}")
        if not (0 < series["dtrain_loss"] < 10 and series["dtrain_samples_per_s"] > 0
                and 0 <= series["dtrain_allreduce_wait_share"] <= 1):
            fail(f"implausible values: {series}")

        if run.finish() != 0:
            fail("launch failed")
        total = check_training(run)
        records = step_records(metrics)
        steps = [r["step"] for r in records if "loss" in r]
        if steps != list(range(1, total + 1)):
            fail(f"expected a loss record for steps 1..{total}, got {steps}")
        for r in records:
            if "loss" in r and not all(isinstance(r[k], (int, float)) for k in
                                       ("loss", "accuracy", "samples_per_s", "lr",
                                        "allreduce_wait_share")):
                fail(f"step record misses a field: {r}")
        evals = [r for r in records if "test_accuracy" in r]
        if len(evals) != 3 or not all(0 <= r["test_accuracy"] <= 1 for r in evals):
            fail(f"expected a test_accuracy record per epoch: {evals}")
        if len({r["run_id"] for r in records}) != 1:
            fail("records of one run carry several run ids")
    print("train: ok")


def test_amp():
    """--amp on the CPU (bfloat16 autocast) with gradient accumulation (noSync)."""
    with tempfile.TemporaryDirectory() as tmp:
        run = Run(SMALL + ["--synthetic", "1200", "--data-dir", os.path.join(tmp, "data"),
                           "--epochs", "3", "--log-every", "12", "--amp", "--accum-steps", "2",
                           "--batch-size", "8"])
        if run.finish() != 0:
            fail("launch failed")
        run.wait_for(r"2 ranks x 16 samples per step on cpu \(amp: bfloat16\)", 1)
        check_training(run)
    print("amp: ok")


def test_zero():
    """--zero 2 (gradients and optimizer state sharded) with accumulation (noSync), then --zero 1:
    the loss falls as under DDP and the ranks end bitwise equal (the all-gather). Then --zero 2
    with sharded checkpoints: rank 1 SIGKILLed at step 25 (a checkpoint saved at step 20), the
    job restarts, restores every rank's shards and ends bitwise equal to an uninterrupted run."""
    with tempfile.TemporaryDirectory() as tmp:
        for stage, extra in (("2", ["--accum-steps", "2", "--batch-size", "8"]), ("1", [])):
            run = Run(SMALL + ["--synthetic", "1200", "--data-dir", os.path.join(tmp, "data"),
                               "--epochs", "3", "--log-every", "12", "--zero", stage] + extra)
            if run.finish() != 0:
                fail(f"launch failed (--zero {stage})")
            run.wait_for(rf"samples per step on cpu \(ZeRO-{stage}\)", 1)
            check_training(run)

        common = SMALL + ["--synthetic", "1200", "--data-dir", os.path.join(tmp, "data"),
                          "--epochs", "1", "--log-every", "12", "--save-every", "10",
                          "--zero", "2"]
        check_sharded_resume(common, tmp, killed_at=25, saved_at=20, what="--zero 2")
    print("zero: ok")


def check_sharded_resume(args, tmp, killed_at, saved_at, what):
    """`args` with --checkpoint-dir, once uninterrupted and once with rank 1 SIGKILLed at step
    `killed_at` (a checkpoint saved at `saved_at`) and restarted: both end bitwise equal."""
    plain = Run(args + ["--checkpoint-dir", os.path.join(tmp, "a")])
    if plain.finish() != 0:
        fail(f"the uninterrupted {what} run with checkpoints failed")
    expected = fingerprints(plain)
    run = Run(args + ["--checkpoint-dir", os.path.join(tmp, "b")],
              env={"DTRAIN_FAULT": f"signal:KILL@rank=1,step={killed_at},attempt=0"},
              launch_args=["--max-restarts", "1"])
    if run.finish() != 0:
        fail(f"the restarted {what} run failed")
    run.wait_for(rf"resumed from the checkpoint of step {saved_at} \(", 1)
    if fingerprints(run) != expected:
        fail(f"{what} resumed from sharded checkpoints does not end bitwise equal to the "
             "uninterrupted run")


def test_zero3():
    """--zero 3 (every residual block a unit: parameters gathered only while it runs) with
    accumulation (noSync), then also with --recompute and --offload (a no-op on the CPU): each
    ends bitwise equal to the same run under --zero 2 (the same reduce-scatters and SGD over the
    same values), its ranks agreeing after the parameters are gathered. Then with stage-3
    checkpoints: killed, restarted, resumed bitwise."""
    with tempfile.TemporaryDirectory() as tmp:
        common = SMALL + ["--synthetic", "600", "--data-dir", os.path.join(tmp, "data"),
                          "--epochs", "1", "--log-every", "6", "--accum-steps", "2",
                          "--batch-size", "8"]
        reference = Run(common + ["--zero", "2"])
        if reference.finish() != 0:
            fail("the --zero 2 run failed")
        expected = fingerprints(reference)
        for extra in ([], ["--recompute", "--offload"]):
            run = Run(common + ["--zero", "3"] + extra)
            if run.finish() != 0:
                fail(f"launch failed (--zero 3 {' '.join(extra)})")
            run.wait_for(r"samples per step on cpu \(ZeRO-3\)", 1)
            run.wait_for(r"done: \d+ steps .* test accuracy [0-9.]+%", 1)
            if fingerprints(run) != expected:
                fail(f"--zero 3 {' '.join(extra)} does not end bitwise equal to --zero 2")

        # Stage-3 checkpoints: rank 1 SIGKILLed at step 15 (a checkpoint saved at step 10), the
        # job restarts, restores every rank's shards (the parameters too) and ends bitwise equal
        # to the uninterrupted run.
        ckpt = SMALL + ["--synthetic", "600", "--data-dir", os.path.join(tmp, "data"),
                        "--epochs", "1", "--log-every", "6", "--save-every", "10", "--zero", "3"]
        check_sharded_resume(ckpt, tmp, killed_at=15, saved_at=10, what="--zero 3")
    print("zero3: ok")


def fingerprints(run):
    prints = {m.group(1): m.group(2) for line in run.lines
              for m in [re.search(r"fingerprint of rank (\d)'s model: ([0-9a-f]{16})", line)] if m}
    if sorted(prints) != ["0", "1"] or prints["0"] != prints["1"]:
        fail(f"ranks do not agree bitwise: {prints}")
    return prints["0"]


def test_resume():
    """Rank 1 is SIGKILLed at step 25 (a checkpoint was saved at step 20); launch restarts the
    job, which resumes from that checkpoint and ends bitwise equal to an uninterrupted run."""
    with tempfile.TemporaryDirectory() as tmp:
        common = SMALL + ["--synthetic", "1200", "--data-dir", os.path.join(tmp, "data"),
                          "--epochs", "1", "--log-every", "12", "--save-every", "10"]
        plain = Run(common + ["--checkpoint-dir", os.path.join(tmp, "a")])
        if plain.finish() != 0:
            fail("the uninterrupted run failed")
        expected = fingerprints(plain)

        metrics = os.path.join(tmp, "b.jsonl")
        run = Run(common + ["--checkpoint-dir", os.path.join(tmp, "b"), "--metrics-file", metrics],
                  env={"DTRAIN_FAULT": "signal:KILL@rank=1,step=25,attempt=0"},
                  launch_args=["--max-restarts", "1"])
        if run.finish() != 0:
            fail("the restarted run failed")
        run.wait_for(r"rank 1 .*SIGKILL", 1)
        run.wait_for(r"resumed from the checkpoint of step 20 \(", 1)
        if fingerprints(run) != expected:
            fail("the resumed run does not end bitwise equal to the uninterrupted one")
        if not os.listdir(os.path.join(tmp, "b")):
            fail("no checkpoint directory was written")
        records = step_records(metrics)
        if [r["step"] for r in records if "resumed" in r] != [20]:
            fail("the metrics file lacks the record of the resume at step 20")
        steps = [r["step"] for r in records if "loss" in r]
        if steps[:25] != list(range(1, 26)) or steps[25:] != list(range(21, 38)):
            fail(f"expected steps 1-25, then 21-37 after the resume: {steps}")

        # The same command once more: everything is done, it resumes at the last step and
        # trains nothing.
        again = Run(common + ["--checkpoint-dir", os.path.join(tmp, "b")])
        if again.finish() != 0:
            fail("the rerun failed")
        again.wait_for(r"resumed from the checkpoint of step 37 ", 1)
        again.wait_for(r"done: all 37 steps were trained before", 1)
        if fingerprints(again) != expected:
            fail("the rerun changed the model")
    print("resume: ok")


def expect_exit(args, rc_expected, pattern):
    out = subprocess.run([TRAINER] + args, capture_output=True, text=True, timeout=60)
    text = out.stdout + out.stderr
    if out.returncode != rc_expected or not re.search(pattern, text):
        fail(f"{args}: exit {out.returncode} (expected {rc_expected}), output: {text}")
    return text


def test_usage():
    text = expect_exit(["--help"], 0, r"--accum-steps")
    for flag, default in (("arch", "resnet18"), ("epochs", "10"), ("batch-size", "128"),
                          ("lr", "0.2"), ("momentum", "0.9"), ("weight-decay", "0.0005"),
                          ("warmup-steps", "100"), ("eval-every", "0"), ("device", "auto"),
                          ("seed", "0"), ("threads", "0")):
        if not re.search(rf"--{flag}\b.*\(default: {re.escape(default)}\)", text):
            fail(f"--help does not list --{flag} with its default {default}:\n{text}")
    for flag in ("data-dir", "synthetic", "metrics-file", "metrics-port", "checkpoint-dir",
                 "save-every", "amp", "accum-steps"):
        if f"--{flag}" not in text:
            fail(f"--help does not list --{flag}")
    expect_exit(["--epochs", "x"], 2, r"--epochs must be an integer .* got 'x'")
    expect_exit(["--lr", "-1"], 2, r"--lr must be a number")
    expect_exit(["--arch", "resnet152"], 2, r"--arch must be one of")
    expect_exit(["--device", "tpu"], 2, r"--device must be auto, cpu or cuda")
    expect_exit(["--bogus"], 2, r"bogus")
    expect_exit(["--zero", "4"], 2, r"--zero must be an integer in \[0, 3\], got '4'")
    expect_exit(["--offload"], 2, r"--offload needs --zero 2 or 3")
    if not (re.search(r"--offload\b.*no-op", text) and re.search(r"--zero\b.*3 and param", text)
            and re.search(r"--checkpoint-dir\b.*sharded with --zero", text)):
        fail(f"--help does not describe --zero 3 and --offload:\n{text}")
    print("usage: ok")


def test_data():
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "data")
        run = Run(SMALL + ["--synthetic", "200", "--data-dir", data, "--epochs", "1"])
        if run.finish() != 0:
            fail("writing a tiny synthetic set failed")
        path = os.path.join(data, "data_batch_3.bin")
        size = os.path.getsize(path)
        os.truncate(path, size - 5)
        run = Run(SMALL + ["--data-dir", data])
        rc = run.finish()
        offset = (size // 3073 - 1) * 3073
        if rc != 1:
            fail(f"a truncated file gave exit {rc}, expected the worker's 1")
        run.wait_for(rf"data_batch_3\.bin: truncated record at offset {offset}", 1)
        run = Run(SMALL + ["--data-dir", os.path.join(tmp, "missing")])
        if run.finish() != 1:
            fail("a missing data directory did not fail")
        run.wait_for(r"missing/data_batch_1\.bin.*HINT", 1)
    print("data: ok")


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as res:
        return parse_prometheus(res.read().decode())


def plot(files, output):
    """plot_metrics.py on `files`, run by this test's Python (DTRAIN_PYTHON, which has matplotlib):
    the PNG it wrote, and its panels as {title: lines}."""
    out = subprocess.run([sys.executable, os.path.join(SOURCE, "scripts", "plot_metrics.py"),
                          "-o", output, *files], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        fail(f"plot_metrics.py {files}: exit {out.returncode}: {out.stdout}{out.stderr}")
    with open(output, "rb") as f:
        if f.read(8) != b"\x89PNG\r\n\x1a\n":
            fail(f"{output} is not a PNG")
    panels = dict(m.groups() for m in re.finditer(r"(?:panels: |; )([^:;]+): (\d+) line\(s\)",
                                                  out.stdout))
    return {title: int(n) for title, n in panels.items()}


def test_watch():
    """launch --metrics-port 0 --metrics-file F, train_resnet without a port of its own: a scrape
    mid-run shows each rank's trainer series (step, loss, ...) labelled by node and rank beside
    launch's samples of the same ranks; F holds both sources, every step of every rank as the
    trainer recorded it (rank 0's equal to its own --metrics-file); plot_metrics.py draws F with
    a line per rank, and the trainer's file."""
    with tempfile.TemporaryDirectory() as tmp:
        launch_file = os.path.join(tmp, "launch.jsonl")
        trainer_file = os.path.join(tmp, "trainer.jsonl")
        # Rank 0 pauses 4 s before step 13 (DTRAIN_FAULT slow): both ranks have done step 12.
        run = Run(SMALL + ["--synthetic", "1200", "--data-dir", os.path.join(tmp, "data"),
                           "--epochs", "1", "--log-every", "12", "--save-every", "10",
                           "--checkpoint-dir", os.path.join(tmp, "ckpt"),
                           "--metrics-file", trainer_file],
                  env={"DTRAIN_FAULT": "slow:4000@rank=0,step=12"},
                  launch_args=["--metrics-port", "0", "--metrics-file", launch_file,
                               "--sample-interval", "0.5"])
        port = int(run.wait_for(r"launch: metrics on http://[^:]+:(\d+)/metrics", 60).group(1))
        deadline = time.time() + 120
        samples = {}
        steps = {}
        while time.time() < deadline:
            try:
                samples, types = scrape(port)
            except OSError:
                if run.proc.poll() is None:
                    raise
                fail(f"the job ended before a scrape saw both ranks at step 12 (last: {steps})")
            steps = {dict(labels).get("rank"): v for (name, labels), v in samples.items()
                     if name == "dtrain_step"}
            if steps.get("0") == 12 and steps.get("1") == 12:
                break
            if run.proc.poll() is not None:
                fail(f"the job ended before a scrape saw both ranks at step 12 (last: {steps})")
            time.sleep(0.2)
        else:
            fail(f"no scrape saw both ranks at step 12: {samples}")
        nodes = {}
        for rank in ("0", "1"):
            launch_series = [labels for (name, labels), _ in samples.items()
                             if name == "dtrain_rss_bytes" and dict(labels).get("rank") == rank]
            if len(launch_series) != 1:
                fail(f"launch's dtrain_rss_bytes of rank {rank}: {launch_series}")
            labels = launch_series[0]
            nodes[rank] = dict(labels)["node"]
            if samples[("dtrain_rss_bytes", labels)] <= 0:
                fail(f"rank {rank}'s resident memory is {samples[('dtrain_rss_bytes', labels)]}")
            # The trainer's series of the rank, with exactly launch's labels for it.
            for name in ("dtrain_step", "dtrain_loss", "dtrain_accuracy", "dtrain_samples_per_s",
                         "dtrain_allreduce_wait_share", "dtrain_loss_scale", "dtrain_lr",
                         "dtrain_checkpoint_seconds"):
                if (name, labels) not in samples or types.get(name) != "gauge":
                    fail(f"the scrape lacks {name}{dict(labels)}")
            if not (0 < samples[("dtrain_loss", labels)] < 10
                    and samples[("dtrain_samples_per_s", labels)] > 0
                    and 0 <= samples[("dtrain_allreduce_wait_share", labels)] <= 1
                    and samples[("dtrain_loss_scale", labels)] == 1):
                fail(f"implausible trainer figures of rank {rank}: {samples}")
        if samples.get(("dtrain_workers_alive", frozenset({("node", nodes["0"])}))) != 2:
            fail(f"launch's dtrain_workers_alive of node {nodes['0']}: {samples}")
        if samples.get(("dtrain_attempt", frozenset())) != 0:
            fail("no dtrain_attempt 0")
        if run.finish() != 0:
            fail("launch failed")
        total = int(run.wait_for(r"step \d+/(\d+)", 1).group(1))
        fingerprints(run)
        records = []
        with open(launch_file) as f:
            for line in f:
                records.append(json.loads(line))
        by_source = {}
        for r in records:
            by_source.setdefault(r["source"], []).append(r)
        if sorted(by_source) != ["launch", "trainer"]:
            fail(f"launch's file holds sources {sorted(by_source)}")
        if {r.get("rank") for r in by_source["launch"] if "rss_bytes" in r} != {0, 1}:
            fail("launch's file lacks its samples of both ranks")
        mine = [r for r in step_records(trainer_file) if "loss" in r]
        for rank in (0, 1):
            theirs = [r for r in by_source["trainer"] if r["rank"] == rank and "loss" in r]
            if [r["step"] for r in theirs] != list(range(1, total + 1)):
                fail(f"launch's file: rank {rank}'s loss records are steps "
                     f"{[r['step'] for r in theirs]}, not 1..{total}")
            if any(r["node"] != nodes[str(rank)] or not isinstance(r["time"], (int, float))
                   for r in theirs):
                fail(f"rank {rank}'s records are not labelled with launch's node")
            if rank == 0 and [(r["step"], r["loss"], r["time"]) for r in theirs] != \
                    [(r["step"], r["loss"], r["time"]) for r in mine]:
                fail("rank 0's records in launch's file differ from its own metrics file")
            if not [r for r in by_source["trainer"] if r["rank"] == rank and "test_accuracy" in r]:
                fail(f"launch's file lacks rank {rank}'s final evaluation")
        # Each checkpoint's background write, once, by the node's writer (local rank 0).
        written = [(r["rank"], r["step"]) for r in by_source["trainer"]
                   if "checkpoint_write_seconds" in r and r["checkpoint_bytes"] > 0]
        if written != [(0, 10), (0, 20), (0, 30), (0, total)]:
            fail(f"checkpoint writes recorded (rank, step): {written}, expected rank 0's of steps "
                 f"10, 20, 30, {total}")

        panels = plot([launch_file], os.path.join(tmp, "job.png"))
        for title in ("loss", "samples/s", "CPU % of a core, per rank",
                      "resident memory (bytes), per rank"):
            if panels.get(title) != 2:
                fail(f"the plot of launch's file: panel {title!r} should have a line per rank: "
                     f"{panels}")
        panels = plot([trainer_file], os.path.join(tmp, "trainer.png"))
        if panels.get("loss") != 1 or panels.get("accuracy") != 2:
            fail(f"the plot of the trainer's file: {panels}")
    print("watch: ok")


def test_recompute():
    """--recompute (the stem and each residual block run again in backward) ends bitwise equal to
    the same run without it."""
    with tempfile.TemporaryDirectory() as tmp:
        common = SMALL + ["--synthetic", "600", "--data-dir", os.path.join(tmp, "data"),
                          "--epochs", "1", "--log-every", "6"]
        plain = Run(common)
        if plain.finish() != 0:
            fail("the run without --recompute failed")
        run = Run(common + ["--recompute"])
        if run.finish() != 0:
            fail("the run with --recompute failed")
        if fingerprints(run) != fingerprints(plain):
            fail("--recompute does not end bitwise equal to the run without it")
    print("recompute: ok")


TESTS = {"train": test_train, "amp": test_amp, "resume": test_resume, "usage": test_usage,
         "data": test_data, "watch": test_watch, "zero": test_zero, "zero3": test_zero3,
         "recompute": test_recompute}

if __name__ == "__main__":
    for name in sys.argv[2:] or list(TESTS):
        TESTS[name]()
    print("train_resnet_test: ok")
