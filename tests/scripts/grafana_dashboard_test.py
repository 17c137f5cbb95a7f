#!/usr/bin/env python3
"""docs/grafana/dtrain.json asks only for what launch serves: every query of the dashboard (each
panel's expressions and legends, each template variable's label_values) names a series, with the
labels it selects on, groups by or prints, that a real scrape of a running job serves. The job:
launch --metrics-port 0 over two test workers that record loss and samples/s, with a stand-in
nvidia-smi (tests/data/nvidia_smi: four GPUs, the workers on GPU 0), so the GPU series are there
as on a GPU node, a checkpoint directory (DTRAIN_CHECKPOINT_DIR, in the temporary directory) and a
data directory (DTRAIN_DATA_DIR, the source tree: most likely on a block device, whose read and
write rates /proc/diskstats has, where /tmp may be a tmpfs) for the filesystem series, and
NCCL_SOCKET_IFNAME=lo, so that an interface's series are there on a machine whose only interface
is loopback. A series inside rate() or increase() must be a counter. A query of Prometheus' own
ALERTS series must select alerts that docs/prometheus/dtrain-alerts.yml defines.

Usage: grafana_dashboard_test.py <source-dir> <build-dir>
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request

SOURCE = os.path.abspath(sys.argv[1])
BUILD = os.path.abspath(sys.argv[2])
DASHBOARD = os.path.join(SOURCE, "docs", "grafana", "dtrain.json")
RULES = os.path.join(SOURCE, "docs", "prometheus", "dtrain-alerts.yml")
ALERTS = re.compile(r'^ALERTS\{[^}]*alertname=~"([^"]*)"[^}]*\}$')


def fail(message):
    print("FAIL: " + message)
    sys.exit(1)


def queries(dashboard):
    """(where, expression, legend) of every query: panels (rows' nested ones too) and
    template variables."""
    found = []

    def walk(panels):
        for p in panels:
            for t in p.get("targets", []):
                found.append((f"panel {p['title']!r} {t['refId']}", t["expr"],
                              t.get("legendFormat", "")))
            walk(p.get("panels", []))

    walk(dashboard["panels"])
    for v in dashboard.get("templating", {}).get("list", []):
        if v["type"] == "query":
            q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            found.append((f"variable ${v['name']}", q, ""))
    return found


SELECTOR = re.compile(r'\b(dtrain_[A-Za-z0-9_]+)\s*(\{[^}]*\})?')
MATCHER = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"]*)"')
LABEL_VALUES = re.compile(r'label_values\(\s*(dtrain_[A-Za-z0-9_]+)[^,]*,\s*([A-Za-z_]\w*)\s*\)')
GROUPING = re.compile(r'\b(?:by|without)\s*\(([^)]*)\)')
COUNTER_FUNCTION = re.compile(r'\b(?:rate|irate|increase)\(\s*(dtrain_[A-Za-z0-9_]+)')


def requirements(expression, legend, variables):
    """[(metric, {label: (operator, value)})]: what each selector of the query needs served.
    Labels printed in the legend or grouped by must be on every selector's series."""
    needed = set(re.findall(r'\{\{\s*([A-Za-z_]\w*)\s*\}\}', legend))
    for group in GROUPING.findall(expression):
        needed.update(l.strip() for l in group.split(",") if l.strip())
    out = []
    m = LABEL_VALUES.search(expression)
    if m:
        return [(m.group(1), {m.group(2): ("=~", ".+")})]
    for name, braces in SELECTOR.findall(expression):
        matchers = {label: (op, value) for label, op, value in MATCHER.findall(braces or "")}
        for label, (op, value) in list(matchers.items()):
            for var, replacement in variables.items():
                value = value.replace("$" + var, replacement)
            matchers[label] = (op, value)
        for label in needed:
            matchers.setdefault(label, ("=~", ".+"))
        out.append((name, matchers))
    if not out:
        fail(f"no dtrain_ series in {expression!r}")
    return out


def parse_prometheus(text):
    """[(name, {labels})] and {name: type} of a text exposition."""
    series, types = [], {}
    sample = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            types[name] = kind
        elif line and not line.startswith("#"):
            m = sample.match(line)
            if not m:
                fail(f"not a sample line: {line!r}")
            series.append((m.group(1),
                           {k: v for k, _, v in MATCHER.findall(m.group(2) or "")}))
    return series, types


def served(series, name, matchers):
    for n, labels in series:
        if n != name:
            continue
        ok = True
        for label, (op, value) in matchers.items():
            have = labels.get(label)
            if op in ("=", "=~"):
                ok = have is not None and (have == value if op == "=" else
                                           re.fullmatch(value, have) is not None)
            elif op == "!=":
                ok = have != value
            else:
                ok = have is None or re.fullmatch(value, have) is None
            if not ok:
                break
        if ok:
            return True
    return False


def stand_in_nvidia_smi(tmp):
    data = os.path.join(SOURCE, "tests", "data", "nvidia_smi")
    bin_dir = os.path.join(tmp, "bin")
    os.makedirs(bin_dir)
    path = os.path.join(bin_dir, "nvidia-smi")
    with open(path, "w") as f:
        f.write("#!/bin/sh\n"
                'case "$1" in\n'
                f"  --query-gpu=*) exec cat '{data}/query_gpu.csv' ;;\n"
                "  --query-compute-apps=*)\n"
                "    for g in $(pgrep -P $PPID); do for w in $(pgrep -P $g); do\n"
                '      echo "$w, GPU-8c3e1a52-4f0b-2d6e-91a7-5b2f0c7d9e13, 1024"\n'
                "    done; done ;;\n"
                "  *) exit 9 ;;\n"
                "esac\n")
    os.chmod(path, 0o755)
    return bin_dir


def main():
    with open(DASHBOARD) as f:
        dashboard = json.load(f)
    host = os.uname().nodename
    with open(RULES) as f:
        alerts = re.findall(r"^\s*- alert: (\w+)$", f.read(), re.M)
    for where, expr, _ in queries(dashboard):
        m = ALERTS.match(expr)
        if m and not any(re.fullmatch(m.group(1), a) for a in alerts):
            fail(f"{where}: {expr!r} selects none of the alerts of {RULES}: {alerts}")
    wanted = [(where, expr, req) for where, expr, legend in queries(dashboard)
              if not ALERTS.match(expr) for req in requirements(expr, legend, {"node": host})]
    counters = {m for _, expr, _ in queries(dashboard) for m in COUNTER_FUNCTION.findall(expr)}
    print(f"{DASHBOARD}: {len(queries(dashboard))} queries, "
          f"{len({r[0] for _, _, r in wanted})} series")

    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, PATH=stand_in_nvidia_smi(tmp) + ":" + os.environ["PATH"],
                   DTRAIN_CHECKPOINT_DIR=os.path.join(tmp, "ckpt"), DTRAIN_DATA_DIR=SOURCE,
                   NCCL_SOCKET_IFNAME="lo")
        proc = subprocess.Popen([os.path.join(BUILD, "launch"), "--nproc-per-node", "2",
                                 "--sample-interval", "0.2", "--metrics-port", "127.0.0.1:0",
                                 os.path.join(BUILD, "testing", "worker", "worker"), "--steps",
                                 "300", "--step-ms", "100", "--publish-figures"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                env=env)
        try:
            port = None
            for line in proc.stderr:
                m = re.search(r"launch: metrics on http://[^ ]*:([0-9]+)/metrics", line)
                if m:
                    port = int(m.group(1))
                    break
            if port is None:
                fail("launch did not print its metrics port")
            deadline = time.time() + 30
            missing = wanted
            while time.time() < deadline:
                time.sleep(0.5)
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                                timeout=5) as r:
                        series, types = parse_prometheus(r.read().decode())
                except OSError:
                    continue
                missing = [w for w in wanted if not served(series, *w[2])]
                if not missing:
                    break
        finally:
            proc.kill()
            proc.wait()
    for where, expr, (name, matchers) in missing:
        print(f"FAIL: {where}: {expr!r} needs {name} with {matchers}: no such series served")
    if missing:
        sys.exit(1)
    for name in counters:
        if types.get(name) != "counter":
            fail(f"{name} is inside rate()/increase() but served as a {types.get(name)}")
    print("grafana_dashboard_test: ok (every query names a served series)")


if __name__ == "__main__":
    main()
