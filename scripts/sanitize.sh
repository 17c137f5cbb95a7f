#!/usr/bin/env bash
# Opt-in (not CI): builds the torch-free targets with AddressSanitizer + UndefinedBehaviorSanitizer
# in their own build directory and runs the torch-free unit tests there.
# Environment: CXX and CC (default g++ and gcc, the compilers CI builds with; clang++ and clang
# work too), BUILD_DIR (default build-sanitize-<compiler>), JOBS (default: all cores), CTEST_ARGS
# (extra ctest arguments, e.g. "-R Store").
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CXX="${CXX:-g++}"
if [ -z "${CC:-}" ]; then
  case "$CXX" in *clang++*) CC="${CXX/clang++/clang}" ;; *) CC="${CXX/g++/gcc}" ;; esac
fi
build="${BUILD_DIR:-$root/build-sanitize-$(basename "$CXX")}"
jobs="${JOBS:-$(nproc)}"

"$root/scripts/setup.sh"

flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g"
generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
# libtorch is not instrumented and the NCCL backend cannot run without a GPU: both stay out.
cmake -S "$root" -B "$build" "${generator[@]}" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER="$CC" -DCMAKE_CXX_COMPILER="$CXX" \
  -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
  -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" \
  -DDTRAIN_WITH_TORCH=OFF -DDTRAIN_WITH_NCCL=OFF -DDTRAIN_WITH_EXAMPLES=OFF >/dev/null
cmake --build "$build" -j "$jobs"

# A small quarantine: ASan keeps freed memory resident for a while to catch use-after-free, and
# the store tests assert that resident memory did not grow by what hostile clients announce.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1:quarantine_size_mb=16}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
cd "$build"
# Sanitized code runs several times slower: the time-bound tests are left to the normal build.
ctest --output-on-failure -j "$jobs" -L unit -E '^dtrain_store_timing_tests\.' ${CTEST_ARGS:-}
echo "sanitize.sh: ASan + UBSan unit tests passed ($CXX)"
