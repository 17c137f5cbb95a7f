#!/usr/bin/env python3
"""The alert rules evaluated by a real Prometheus (Debian's `prometheus`) scraping a running job:
the alerts a CPU can provoke fire and then resolve, as Prometheus' HTTP API reports them.

The job: launch --metrics-port over two test workers that pass a barrier each step, publish
progress and a loss, with
  - a loss that is NaN for steps 100..160 of every rank              -> DtrainLossNotFinite;
  - rank 1 slowed 7 s at step 220 (DTRAIN_FAULT): every rank waits
    at the barrier, --stall-timeout 2 --stall-action report       -> DtrainStalled;
  - DTRAIN_CHECKPOINT_DIR on a 4 MiB tmpfs of the test's own, which
    the test fills to 90 % and then empties                       -> DtrainCheckpointDiskNearlyFull
    (skipped with a note where the test may not mount: not root);
  - on a machine without swap, dtrain_swap_used_bytes is 0 and DtrainSwapInUse never fires.
Prometheus scrapes and evaluates every second; the rules are the shipped ones with every `for:`
shortened to 1 s, so that the test takes a minute, not the rules' ten (their durations are
promtool's to test: tests/prometheus/dtrain-alerts-test.yml). Everything runs on loopback, on
ports chosen free, and is stopped at the end or after 150 s, whichever comes first.

Usage: prometheus_alerts_test.py <source-dir> <build-dir>     (exit 77: skipped)
"""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

SOURCE = os.path.abspath(sys.argv[1])
BUILD = os.path.abspath(sys.argv[2])
RULES = os.path.join(SOURCE, "docs", "prometheus", "dtrain-alerts.yml")
DEADLINE = time.time() + 150


def fail(message):
    print("FAIL: " + message)
    sys.exit(1)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def api(port, path, **params):
    url = f"http://127.0.0.1:{port}/api/v1/{path}"
    if params:
        url += "?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=5) as r:
        body = json.load(r)
    if body.get("status") != "success":
        fail(f"{url}: {body}")
    return body["data"]


def swap_total_bytes():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("SwapTotal:"):
                return int(line.split()[1]) * 1024
    return 0


def small_filesystem(tmp):
    """A 4 MiB tmpfs mounted at tmp/ckpt-fs, or None (with the reason printed)."""
    path = os.path.join(tmp, "ckpt-fs")
    os.makedirs(path)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", path],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        print(f"note: cannot mount a small tmpfs ({r.stdout.strip()}): the checkpoint-disk "
              "alert is left to promtool's test")
        return None
    return path


def main():
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        print("SKIP: prometheus is not installed; HINT: scripts/setup.sh installs it (Debian "
              "package prometheus)")
        sys.exit(77)
    with tempfile.TemporaryDirectory() as tmp:
        fs = small_filesystem(tmp)
        try:
            run(tmp, prometheus, fs)
        finally:
            if fs:
                subprocess.run(["umount", "-l", fs])


def run(tmp, prometheus, fs):
    rules = os.path.join(tmp, "rules.yml")
    with open(RULES) as f:
        text = re.sub(r"(\n\s+for:) \S+", r"\1 1s", f.read())
    with open(rules, "w") as f:
        f.write(text)
    ckpt = os.path.join(fs, "ckpt") if fs else os.path.join(tmp, "ckpt")
    launch = subprocess.Popen(
        [os.path.join(BUILD, "launch"), "--nproc-per-node", "2", "--sample-interval", "0.5",
         "--metrics-port", "127.0.0.1:0", "--stall-timeout", "2", "--stall-action", "report",
         os.path.join(BUILD, "testing", "worker", "worker"), "--steps", "400", "--step-ms", "100",
         "--barrier-every-step", "--progress", "--publish-figures", "--quiet",
         "--nan-loss-from", "100", "--nan-loss-until", "160"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, DTRAIN_CHECKPOINT_DIR=ckpt,
                 DTRAIN_FAULT="slow:7000@rank=1,step=220"))
    server = None
    try:
        port = None
        for line in launch.stderr:
            m = re.search(r"launch: metrics on http://[^ ]*:([0-9]+)/metrics", line)
            if m:
                port = int(m.group(1))
                break
        if port is None:
            fail("launch did not print its metrics port")
        # launch's stderr keeps coming (the stall report): drain it into a file.
        log = open(os.path.join(tmp, "launch.err"), "w")
        subprocess.Popen(["cat"], stdin=launch.stderr, stdout=log)
        web = free_port()
        config = os.path.join(tmp, "prometheus.yml")
        with open(config, "w") as f:
            f.write("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                    f"rule_files: [{rules}]\n"
                    "scrape_configs:\n  - job_name: dtrain\n    static_configs:\n"
                    f"      - targets: ['127.0.0.1:{port}']\n")
        server = subprocess.Popen(
            [prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp}/data",
             f"--web.listen-address=127.0.0.1:{web}"],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, "prometheus.log"), "w"))
        watch(web, ckpt if fs else None)
    finally:
        for p in (launch, server):
            if p is not None:
                p.kill()
                p.wait()


def watch(web, ckpt):
    expected = ["DtrainLossNotFinite", "DtrainStalled"] + (
        ["DtrainCheckpointDiskNearlyFull"] if ckpt else [])
    fired = {}     # alert -> its labels when first seen firing
    resolved = set()
    filler = None
    swap_free = swap_total_bytes() == 0
    checked_swap = False
    while time.time() < DEADLINE and len(resolved) < len(expected):
        time.sleep(0.5)
        try:
            alerts = api(web, "alerts")["alerts"]
        except OSError:
            continue  # Prometheus is starting
        firing = {a["labels"]["alertname"]: a for a in alerts if a["state"] == "firing"}
        for name, a in firing.items():
            if name not in fired:
                print(f"{time.time() - START:5.1f} s: {name} fires: {a['annotations']['summary']}")
                fired[name] = a["labels"]
        for name in fired:
            if name not in firing and name not in resolved:
                print(f"{time.time() - START:5.1f} s: {name} resolved")
                resolved.add(name)
        if swap_free:
            if "DtrainSwapInUse" in firing:
                fail("DtrainSwapInUse fires on a machine without swap")
            used = api(web, "query", query="dtrain_swap_used_bytes")["result"]
            if used:
                if float(used[0]["value"][1]) != 0:
                    fail(f"dtrain_swap_used_bytes is {used} on a machine without swap")
                checked_swap = True
        # The checkpoint filesystem: filled once Prometheus sees it, emptied once it fires.
        if ckpt and filler is None:
            if api(web, "query", query="dtrain_disk_checkpoints == 1")["result"]:
                filler = os.path.join(os.path.dirname(ckpt), "filler")
                with open(filler, "wb") as f:
                    f.write(b"\0" * (3686 * 1024))  # 90 % of 4 MiB
        if ckpt and "DtrainCheckpointDiskNearlyFull" in fired and os.path.exists(filler):
            os.remove(filler)
    missing = [a for a in expected if a not in fired]
    if missing:
        fail(f"never fired: {missing}; fired: {sorted(fired)}")
    unresolved = [a for a in expected if a not in resolved]
    if unresolved:
        fail(f"fired but never resolved: {unresolved}")
    if fired["DtrainLossNotFinite"].get("rank") not in ("0", "1"):
        fail(f"DtrainLossNotFinite names no rank: {fired['DtrainLossNotFinite']}")
    if fired["DtrainStalled"].get("rank") not in ("0", "1"):
        fail(f"DtrainStalled names no rank: {fired['DtrainStalled']}")
    if ckpt and not fired["DtrainCheckpointDiskNearlyFull"].get("mount"):
        fail(f"DtrainCheckpointDiskNearlyFull names no mount: {fired}")
    if swap_free and not checked_swap:
        fail("Prometheus never had dtrain_swap_used_bytes")
    print(f"prometheus_alerts_test: ok ({', '.join(expected)} fired and resolved"
          f"{'; no swap: 0 and quiet' if swap_free else ''})")


START = time.time()

if __name__ == "__main__":
    main()
