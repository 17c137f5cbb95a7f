#!/usr/bin/env bash
# Installs what is missing, configures, builds (all cores) and runs every test.
# Exits non-zero on any failure. Environment: BUILD_DIR (default build), CTEST_ARGS (extra ctest
# arguments, e.g. "-L unit").
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD_DIR:-$root/build}"
jobs="$(nproc)"
start=$(date +%s)

"$root/scripts/setup.sh"
setup_done=$(date +%s)

generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release >/dev/null
else
  cmake "$build" >/dev/null
fi
cmake --build "$build" -j "$jobs"
built=$(date +%s)
# Seconds each step may take on a fresh machine of CI's kind (docs/building.md has the figures).
declare -A step_budget=([setup]=420 [build]=1080)
step() {  # step NAME SECONDS
  printf 'test.sh: %-6s took %5s s of %5s s budget\n' "$1" "$2" "${step_budget[$1]}"
  [ "$2" -le "${step_budget[$1]}" ] || echo "  WARNING: step $1 is over its budget"
}
step setup $((setup_done - start))
step build $((built - setup_done))

# Seconds each label may take (sum of its tests' time); printed against what they took.
declare -A budget=([unit]=120 [integration]=600 [e2e]=420 [gpu]=300)

status=0
log="$build/ctest.log"
( cd "$build" && ctest --output-on-failure -j "$jobs" ${CTEST_ARGS:-} ) 2>&1 | tee "$log" || status=$?

echo
echo "test.sh: time per label (budget):"
for label in unit integration e2e gpu; do
  line=$(grep -E "^ *$label +=" "$log" || true)
  secs=$(echo "$line" | sed -nE 's/.*= *([0-9.]+) sec.*/\1/p')
  tests=$(echo "$line" | sed -nE 's/.*\(([0-9]+) tests?\).*/\1/p')
  printf '  %-12s %8s s of %4s s budget  (%s tests)\n' "$label" "${secs:-0}" "${budget[$label]}" "${tests:-0}"
  if [ -n "$secs" ] && awk -v s="$secs" -v b="${budget[$label]}" 'BEGIN{exit !(s>b)}'; then
    echo "  WARNING: label $label is over its budget"
  fi
done
end=$(date +%s)
echo "test.sh: total $((end - start)) s (setup $((setup_done - start)) s, build $((built - setup_done)) s, tests $((end - built)) s)"
exit $status
