#!/usr/bin/env bash
# The sample trainer under launch: 2 ranks train to the known solution; a bad flag is exit 2.
# Usage: train_linear_test.sh <build-dir>
set -uo pipefail
build="$1"
out="$("$build/launch" --nproc-per-node 2 "$build/train_linear" --epochs 3 2>&1)"
rc=$?
echo "$out"
[ "$rc" -eq 0 ] || { echo "FAIL: launch exited $rc"; exit 1; }
grep -q "over 2 ranks" <<<"$out" || { echo "FAIL: no epoch line from 2 ranks"; exit 1; }
err=$(sed -nE 's/.*largest weight error ([0-9.]+).*/\1/p' <<<"$out")
awk -v e="${err:-9}" 'BEGIN{exit !(e < 0.02)}' || { echo "FAIL: weight error ${err:-none}"; exit 1; }

out="$("$build/launch" --nproc-per-node 1 "$build/train_linear" --epochs x 2>&1)"
rc=$?
[ "$rc" -eq 2 ] || { echo "FAIL: --epochs x gave exit $rc, expected 2: $out"; exit 1; }
grep -q "needs a positive number" <<<"$out" || { echo "FAIL: message: $out"; exit 1; }
echo "train_linear_test: ok"
