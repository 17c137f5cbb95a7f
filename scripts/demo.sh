#!/usr/bin/env bash
# The first command to run: installs what is missing, builds, writes a small synthetic CIFAR-10,
# and trains ResNet-18 on 2 data-parallel ranks (DDP over Gloo) under `launch` for about a minute,
# with checkpoints. Midway rank 1 is SIGKILLed (DTRAIN_FAULT); launch tears the job down and
# restarts it (--max-restarts 1), and the ranks resume from their last checkpoint. launch writes
# its samples and every rank's figures as JSONL and as TensorBoard event files. At the end: the
# test accuracy, and where the metrics, their plot and the TensorBoard files are.
#
# Environment: BUILD_DIR (default build), DEMO_DIR (default $BUILD_DIR/demo), DEMO_EPOCHS (3),
# DEMO_IMAGES (synthetic training images, 8000).
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
rm -rf "$out/checkpoints" "$out/metrics.jsonl" "$out/metrics.png" "$out/launch.jsonl" \
  "$out/tensorboard"
mkdir -p "$out"

# The size fits a minute on two cores: 8,000 synthetic training images, a ResNet-18 of width 16
# (0.7M parameters), 64 images per rank per step, 3 epochs = 186 steps. A checkpoint every 23
# steps (an eighth of the run); rank 1 dies halfway, at step 93 of the first attempt.
epochs="${DEMO_EPOCHS:-3}"
images="${DEMO_IMAGES:-8000}"
steps=$((epochs * (images / 2 / 64)))
save_every=$((steps / 8 > 0 ? steps / 8 : 1))
kill_at=$((steps / 2))
args=(--arch resnet18 --width 16 --synthetic "$images" --data-dir "$out/data"
      --epochs "$epochs" --batch-size 64 --lr 0.8 --warmup-steps 20 --log-every 10
      --checkpoint-dir "$out/checkpoints" --save-every "$save_every"
      --metrics-file "$out/metrics.jsonl")
watch=(--metrics-file "$out/launch.jsonl" --tensorboard-dir "$out/tensorboard")

echo
echo "demo.sh: launch --nproc-per-node 2 --max-restarts 1 ${watch[*]} train_resnet ${args[*]}"
echo "demo.sh: DTRAIN_FAULT kills rank 1 at step $kill_at of the first attempt: rank 0's next collective"
echo "         fails naming it, launch stops the job and starts it again, and both ranks resume from"
echo "         their last checkpoint"
echo
start=$(date +%s)
DTRAIN_FAULT="signal:KILL@rank=1,step=$kill_at,attempt=0" \
  "$build/launch" --nproc-per-node 2 --max-restarts 1 "${watch[@]}" "$build/train_resnet" "${args[@]}"
end=$(date +%s)

echo
echo "demo.sh: trained in $((end - start)) s, including the restart"
# The build's Python (CMake's DTRAIN_PYTHON: the project's .venv, which has matplotlib).
python="$(sed -n 's/^DTRAIN_PYTHON:FILEPATH=//p' "$build/CMakeCache.txt")"
if [ -n "$python" ] && "$python" -c 'import matplotlib' 2>/dev/null; then
  "$python" "$root/scripts/plot_metrics.py" -o "$out/metrics.png" "$out/metrics.jsonl"
  echo "demo.sh: plot:    $out/metrics.png"
fi
echo "demo.sh: metrics: $out/metrics.jsonl (rank 0: one JSON record per step), $out/launch.jsonl"
echo "         (launch: every rank's records and its samples of CPU, memory and GPUs)"
echo "demo.sh: TensorBoard: $out/tensorboard (the same as launch.jsonl; on your machine:"
echo "         pip install tensorboard && tensorboard --logdir $out/tensorboard)"
echo "demo.sh: checkpoints: $out/checkpoints"
