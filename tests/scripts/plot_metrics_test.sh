#!/usr/bin/env bash
# scripts/plot_metrics.py: two runs' JSONL files (trainer records, and launch records without a
# step) make one PNG of the expected size; a malformed line is exit 2 naming file and line.
# Usage: plot_metrics_test.sh <source-dir>
set -uo pipefail
src="$1"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
/usr/bin/python3 - "$dir" <<'PY'
import json, math, sys
d = sys.argv[1]
for run in ("run-a", "run-b"):
    with open(f"{d}/{run}.jsonl", "w") as f:
        for step in range(1, 121):
            f.write(json.dumps({"time": 1e9 + step, "source": "trainer", "run_id": run, "node": "n",
                                "rank": 0, "step": step, "loss": 2.3 * math.exp(-step / 50),
                                "accuracy": step / 150, "samples_per_s": 900.0}) + "\n")
        f.write(json.dumps({"time": 1e9 + 121, "source": "trainer", "run_id": run, "node": "n",
                            "rank": 0, "step": 120, "test_accuracy": 0.7}) + "\n")
        f.write(json.dumps({"time": 1e9 + 122, "source": "trainer", "run_id": run, "node": "n",
                            "rank": 0, "step": 60, "resumed": 1}) + "\n")
        f.write(json.dumps({"time": 1e9 + 5, "source": "launch", "run_id": run, "node": "n",
                            "rank": 1, "rss_bytes": 1.5e8}) + "\n")
PY
out="$("$src/scripts/plot_metrics.py" -o "$dir/plot.png" "$dir/run-a.jsonl" "$dir/run-b.jsonl" 2>&1)"
rc=$?
echo "$out"
[ "$rc" -eq 0 ] || { echo "FAIL: plot_metrics.py exited $rc"; exit 1; }
grep -q "2 run(s), 246 records" <<<"$out" || { echo "FAIL: summary line"; exit 1; }
# A PNG: the signature, then IHDR with width and height (900 x 300 per panel at 100 dpi).
/usr/bin/python3 - "$dir/plot.png" <<'PY' || { echo "FAIL: not the expected PNG"; exit 1; }
import struct, sys
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n", "no PNG signature"
assert data[12:16] == b"IHDR", "no IHDR chunk"
width, height = struct.unpack(">II", data[16:24])
assert (width, height) == (900, 900), (width, height)
assert len(data) > 20000, f"only {len(data)} bytes: empty panels?"
PY
# Launch records plot against time when asked for their field.
"$src/scripts/plot_metrics.py" --fields rss_bytes -o "$dir/rss.png" "$dir/run-a.jsonl" >/dev/null ||
  { echo "FAIL: --fields rss_bytes"; exit 1; }

printf '{"time": 1, "source": "trainer", "step": 1, "loss": 1}\n{"time": oops\n' >"$dir/bad.jsonl"
out="$("$src/scripts/plot_metrics.py" -o "$dir/bad.png" "$dir/bad.jsonl" 2>&1)"
rc=$?
[ "$rc" -eq 2 ] || { echo "FAIL: malformed file gave exit $rc: $out"; exit 1; }
grep -q "bad.jsonl:2: not JSON" <<<"$out" || { echo "FAIL: message: $out"; exit 1; }
[ ! -e "$dir/bad.png" ] || { echo "FAIL: wrote a PNG for a malformed file"; exit 1; }
echo "plot_metrics_test: ok"
