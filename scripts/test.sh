#!/usr/bin/env bash
# Installs what is missing, configures, builds (all cores) and runs every test; then builds the
# CPU-only configuration (libtorch 2.13.0+cpu from .venv-cpu: docs/building.md, "Which libtorch")
# and runs its tests that link libtorch, label unit. Exits non-zero on any failure. Environment:
# BUILD_DIR (default build), CTEST_ARGS (extra ctest arguments, e.g. "-L unit"), CPU_BUILD_DIR
# (default BUILD_DIR-cpu), DTRAIN_CPU_CONFIG=0 (skip the CPU-only configuration).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD_DIR:-$root/build}"
jobs="$(nproc)"
start=$(date +%s)

"$root/scripts/setup.sh"
setup_done=$(date +%s)

generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
configure() {  # configure BUILD [CMAKE ARGS...]: the first time with the arguments, then as it is
  local dir="$1"; shift
  if [ ! -f "$dir/CMakeCache.txt" ]; then
    cmake -S "$root" -B "$dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
  else
    cmake "$dir" >/dev/null
  fi
}
configure "$build"
cmake --build "$build" -j "$jobs"
built=$(date +%s)
# Seconds each step may take on a fresh machine of CI's kind (docs/building.md has the figures).
declare -A step_budget=([setup]=420 [build]=1080 [cpu]=480)
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
tested=$(date +%s)

# The CPU-only configuration: libtorch without CUDA (no NCCL backend, no benchmarks), the targets
# that link libtorch and hold unit tests, and those tests. The torch-free tests of the label are
# the default build's again (they link no libtorch) and are not repeated.
if [ "${DTRAIN_CPU_CONFIG:-1}" != 0 ]; then
  cpu_build="${CPU_BUILD_DIR:-$build-cpu}"
  cpu_torch=("$root"/.venv-cpu/lib/python3*/site-packages/torch)
  echo
  echo "test.sh: the CPU-only configuration (${cpu_torch[0]#"$root"/}) in $cpu_build"
  configure "$cpu_build" "-DDTRAIN_LIBTORCH=${cpu_torch[0]}" -DDTRAIN_WITH_NCCL=OFF \
    -DDTRAIN_WITH_BENCHMARKS=OFF
  cmake --build "$cpu_build" -j "$jobs" --target dtrain_torch_tests dtrain_examples_tests
  ( cd "$cpu_build" && ctest --output-on-failure -j "$jobs" -L unit \
      -R '^(dtrain_torch_tests|dtrain_examples_tests|gloo)[.]' ) 2>&1 |
    tee "$cpu_build/ctest.log" || status=$?
  step cpu $(($(date +%s) - tested))
fi
end=$(date +%s)
echo "test.sh: total $((end - start)) s (setup $((setup_done - start)) s, build $((built - setup_done)) s," \
     "tests $((tested - built)) s, CPU-only configuration $((end - tested)) s)"
exit $status
