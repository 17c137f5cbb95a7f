#!/usr/bin/env bash
# scripts/plot_metrics.py: two runs' JSONL files (trainer records, and launch records without a
# step) make one PNG of the expected size; a real `launch --metrics-file` of a two-rank job (the
# test worker recording its figures with dtrain::metrics) makes one with a line per rank in every
# panel; a malformed line is exit 2 naming file and line. All with the build's DTRAIN_PYTHON.
# Usage: plot_metrics_test.sh <source-dir> <build-dir> <python>
set -uo pipefail
src="$1"
build="$2"
python="$3"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT

# A PNG: the signature, then IHDR with width and height (900 x 300 per panel at 100 dpi).
check_png() {  # <file> <panels>
  "$python" - "$1" "$2" <<'PY' || { echo "FAIL: $1 is not the expected PNG"; exit 1; }
import struct, sys
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n", "no PNG signature"
assert data[12:16] == b"IHDR", "no IHDR chunk"
width, height = struct.unpack(">II", data[16:24])
assert (width, height) == (900, 300 * int(sys.argv[2])), (width, height)
assert len(data) > 5000 * int(sys.argv[2]), f"only {len(data)} bytes: empty panels?"
PY
}

"$python" - "$dir" <<'PY'
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
out="$("$python" "$src/scripts/plot_metrics.py" -o "$dir/plot.png" "$dir/run-a.jsonl" "$dir/run-b.jsonl" 2>&1)"
rc=$?
echo "$out"
[ "$rc" -eq 0 ] || { echo "FAIL: plot_metrics.py exited $rc"; exit 1; }
# A line per run; accuracy has two fields; launch's rank-1 record of each run is its own line.
expected="2 run(s), 246 records; panels: loss: 2 line(s); accuracy: 4 line(s); samples/s: 2 line(s)"
expected+="; resident memory (bytes), per rank: 2 line(s))"
grep -qF "$expected" <<<"$out" || { echo "FAIL: summary line"; exit 1; }
check_png "$dir/plot.png" 4
# Launch records plot against time when asked for their field.
"$python" "$src/scripts/plot_metrics.py" --fields rss_bytes -o "$dir/rss.png" "$dir/run-a.jsonl" >/dev/null ||
  { echo "FAIL: --fields rss_bytes"; exit 1; }
check_png "$dir/rss.png" 1

# A real launch file: two ranks' samples and their trainer records, side by side.
"$build/launch" --nproc-per-node 2 --sample-interval 0.2 --metrics-file "$dir/launch.jsonl" \
  "$build/testing/worker/worker" --steps 12 --step-ms 100 --publish-figures >"$dir/launch.out" 2>&1 ||
  { cat "$dir/launch.out"; echo "FAIL: the launch job failed"; exit 1; }
out="$("$python" "$src/scripts/plot_metrics.py" -o "$dir/job.png" "$dir/launch.jsonl" 2>&1)"
rc=$?
echo "$out"
[ "$rc" -eq 0 ] || { echo "FAIL: plot_metrics.py on launch's file exited $rc"; exit 1; }
for panel in "loss" "samples/s" "CPU % of a core, per rank" "resident memory (bytes), per rank"; do
  grep -qF "$panel: 2 line(s)" <<<"$out" ||
    { echo "FAIL: launch's file does not give panel '$panel' a line per rank"; exit 1; }
done
# (On a machine with GPUs, GPU panels come on top, a line per GPU.)
check_png "$dir/job.png" "$(grep -o "line(s)" <<<"$out" | wc -l)"

printf '{"time": 1, "source": "trainer", "step": 1, "loss": 1}\n{"time": oops\n' >"$dir/bad.jsonl"
out="$("$python" "$src/scripts/plot_metrics.py" -o "$dir/bad.png" "$dir/bad.jsonl" 2>&1)"
rc=$?
[ "$rc" -eq 2 ] || { echo "FAIL: malformed file gave exit $rc: $out"; exit 1; }
grep -q "bad.jsonl:2: not JSON" <<<"$out" || { echo "FAIL: message: $out"; exit 1; }
[ ! -e "$dir/bad.png" ] || { echo "FAIL: wrote a PNG for a malformed file"; exit 1; }
echo "plot_metrics_test: ok"
