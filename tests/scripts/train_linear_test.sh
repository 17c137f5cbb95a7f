#!/usr/bin/env bash
# The sample trainer under launch: 2 ranks train to the known solution; with --checkpoint-dir a
# rank killed in epoch 2 is restarted by launch and the job resumes after epoch 1, still reaching
# the solution; --amp (bfloat16 on the CPU) trains too; --help is exit 0 and lists every flag; a
# bad or unknown flag is exit 2.
# Usage: train_linear_test.sh <build-dir>
set -uo pipefail
build="$1"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT

weight_error_below() {  # output, bound
  local err
  err=$(sed -nE 's/.*largest weight error ([0-9.]+).*/\1/p' <<<"$1")
  awk -v e="${err:-9}" -v b="$2" 'BEGIN{exit !(e < b)}' || { echo "FAIL: weight error ${err:-none}"; exit 1; }
}

# MALLOC_PERTURB_ poisons freed memory: a background thread (the progress publisher) that read a
# table the exit handlers had already destroyed crashed every worker at exit under it.
out="$(MALLOC_PERTURB_=165 "$build/launch" --nproc-per-node 2 "$build/train_linear" --epochs 3 2>&1)"
rc=$?
echo "$out"
[ "$rc" -eq 0 ] || { echo "FAIL: launch exited $rc"; exit 1; }
grep -q "over 2 ranks" <<<"$out" || { echo "FAIL: no epoch line from 2 ranks"; exit 1; }
weight_error_below "$out" 0.02

out="$(DTRAIN_FAULT="signal:KILL@rank=1,step=2,attempt=0" "$build/launch" --nproc-per-node 2 \
  --max-restarts 1 "$build/train_linear" --epochs 4 --checkpoint-dir "$dir/ckpt" 2>&1)"
rc=$?
echo "$out"
[ "$rc" -eq 0 ] || { echo "FAIL: the restarted job exited $rc"; exit 1; }
grep -q "resumed at epoch 2" <<<"$out" || { echo "FAIL: no resume from the checkpoint of epoch 1"; exit 1; }
grep -q "epoch 1: mean loss" <<<"$(sed -n '/resumed at epoch 2/,$p' <<<"$out")" &&
  { echo "FAIL: the restart trained epoch 1 again"; exit 1; }
weight_error_below "$out" 0.02

out="$("$build/launch" --nproc-per-node 2 "$build/train_linear" --epochs 3 --amp 2>&1)"
rc=$?
echo "$out"
[ "$rc" -eq 0 ] || { echo "FAIL: --amp exited $rc"; exit 1; }
weight_error_below "$out" 0.05  # bfloat16 forward: 8 bits of mantissa

out="$("$build/train_linear" --help 2>&1)"
rc=$?
[ "$rc" -eq 0 ] || { echo "FAIL: --help gave exit $rc, expected 0: $out"; exit 1; }
for flag in --epochs --batch-size --lr --samples --checkpoint-dir --amp --tensorboard-dir; do
  grep -q -- "$flag" <<<"$out" || { echo "FAIL: --help does not list $flag: $out"; exit 1; }
done
out="$("$build/train_linear" --bogus 2>&1)"
rc=$?
[ "$rc" -eq 2 ] || { echo "FAIL: an unknown flag gave exit $rc, expected 2: $out"; exit 1; }
grep -q "unknown flag --bogus" <<<"$out" || { echo "FAIL: message: $out"; exit 1; }

out="$("$build/launch" --nproc-per-node 1 "$build/train_linear" --epochs x 2>&1)"
rc=$?
[ "$rc" -eq 2 ] || { echo "FAIL: --epochs x gave exit $rc, expected 2: $out"; exit 1; }
grep -q "needs a positive number" <<<"$out" || { echo "FAIL: message: $out"; exit 1; }
echo "train_linear_test: ok"
