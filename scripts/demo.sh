#!/usr/bin/env bash
# Installs what is missing, builds, and launches a real multi-process job: `launch` runs the test
# worker (joins the job's store, passes barriers, steps) as 2 ranks with prefixed output, then
# once more with an injected crash on rank 1 that `launch` restarts.
# (The sample trainers replace the test worker here once they exist.)
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
echo "demo.sh: launch --nproc-per-node 2 tests/worker/worker --steps 3 --step-ms 100 --end-barrier"
"$launch" --nproc-per-node 2 "$worker" --steps 3 --step-ms 100 --end-barrier

echo
echo "demo.sh: the same with rank 1 crashing at step 1 of the first attempt, --max-restarts 1"
DTRAIN_FAULT="signal:SEGV@rank=1,step=1,attempt=0" \
  "$launch" --nproc-per-node 2 --max-restarts 1 "$worker" --steps 3 --step-ms 100 --end-barrier
echo "demo.sh: done (launch exited $?)"
