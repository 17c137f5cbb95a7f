#!/usr/bin/env bash
# Installs what is missing, builds, and launches real multi-process jobs: the sample trainer
# train_linear as 2 data-parallel ranks (DDP over Gloo), then the test worker (joins the job's
# store, passes barriers, steps) with an injected crash on rank 1 that `launch` restarts.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD_DIR:-$root/build}"

"$root/scripts/setup.sh"
generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
[ -f "$build/CMakeCache.txt" ] || cmake -S "$root" -B "$build" "${generator[@]}" >/dev/null
cmake --build "$build" -j "$(nproc)"

launch="$build/launch"
worker="$build/tests/worker/worker"

echo
echo "demo.sh: launch --nproc-per-node 2 train_linear --epochs 5"
"$launch" --nproc-per-node 2 "$build/train_linear" --epochs 5

echo
echo "demo.sh: the test worker, rank 1 crashing at step 1 of the first attempt, --max-restarts 1"
DTRAIN_FAULT="signal:SEGV@rank=1,step=1,attempt=0" \
  "$launch" --nproc-per-node 2 --max-restarts 1 "$worker" --steps 3 --step-ms 100 --end-barrier
echo "demo.sh: done (launch exited $?)"
