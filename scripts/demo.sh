#!/usr/bin/env bash
# The first command to run: installs what is missing, builds, writes a small synthetic CIFAR-10,
# and trains ResNet-18 on 2 data-parallel ranks (DDP over Gloo) under `launch` for about a minute,
# with checkpoints. Midway rank 1 is SIGKILLed (DTRAIN_FAULT); launch tears the job down and
# restarts it (--max-restarts 1), and the ranks resume from their last checkpoint. At the end:
# the test accuracy, and where the metrics file and its plot are.
#
# Environment: BUILD_DIR (default build), DEMO_DIR (default $BUILD_DIR/demo), DEMO_EPOCHS.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD_DIR:-$root/build}"
out="${DEMO_DIR:-$build/demo}"

"$root/scripts/setup.sh"
generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
[ -f "$build/CMakeCache.txt" ] || cmake -S "$root" -B "$build" "${generator[@]}" \
  -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j "$(nproc)" --target launch train_resnet

# A fresh run: old checkpoints would be resumed from, and old metrics appended to.
rm -rf "$out/checkpoints" "$out/metrics.jsonl" "$out/metrics.png"
mkdir -p "$out"

# The size fits a minute on two cores: 8,000 synthetic training images, a ResNet-18 of width 16
# (0.7M parameters), 64 images per rank per step, 3 epochs = 186 steps. A checkpoint every 25
# steps; rank 1 dies at step 100 of the first attempt.
epochs="${DEMO_EPOCHS:-3}"
args=(--arch resnet18 --width 16 --synthetic 8000 --data-dir "$out/data"
      --epochs "$epochs" --batch-size 64 --lr 0.8 --warmup-steps 20 --log-every 10
      --checkpoint-dir "$out/checkpoints" --save-every 25
      --metrics-file "$out/metrics.jsonl")

echo
echo "demo.sh: launch --nproc-per-node 2 --max-restarts 1 train_resnet ${args[*]}"
echo "demo.sh: DTRAIN_FAULT kills rank 1 at step 100 of the first attempt: rank 0's next collective"
echo "         fails naming it, launch stops the job and starts it again, and both ranks resume from"
echo "         their last checkpoint"
echo
start=$(date +%s)
DTRAIN_FAULT="signal:KILL@rank=1,step=100,attempt=0" \
  "$build/launch" --nproc-per-node 2 --max-restarts 1 "$build/train_resnet" "${args[@]}"
end=$(date +%s)

echo
echo "demo.sh: trained in $((end - start)) s, including the restart"
if /usr/bin/python3 -c 'import matplotlib' 2>/dev/null; then
  "$root/scripts/plot_metrics.py" -o "$out/metrics.png" "$out/metrics.jsonl"
  echo "demo.sh: plot:    $out/metrics.png"
fi
echo "demo.sh: metrics: $out/metrics.jsonl (one JSON record per step)"
echo "demo.sh: checkpoints: $out/checkpoints"
