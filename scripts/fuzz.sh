#!/usr/bin/env bash
# Opt-in (not CI): libFuzzer over the store's frame parser and key-value table
# (tests/fuzz/store_frame_fuzz.cpp), with ASan + UBSan. Needs clang with libFuzzer
# (Debian: apt-get install clang).
#   scripts/fuzz.sh [seconds, default 60] [extra libFuzzer flags...]
# Environment: BUILD_DIR (default build-fuzz), CXX (default clang++), JOBS (parallel fuzz jobs,
# default 1). Crashes are written to $BUILD_DIR/crashes/ and the script exits non-zero.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD_DIR:-$root/build-fuzz}"
seconds="${1:-60}"
shift || true
cxx="${CXX:-clang++}"
if ! command -v "$cxx" >/dev/null 2>&1; then
  echo "fuzz.sh: $cxx not found. HINT: apt-get install clang (libFuzzer comes with it)" >&2
  exit 2
fi
mkdir -p "$build/corpus" "$build/crashes"

# Seeds: the golden frames of tests/unit/store_wire_test.cpp, one request per file.
seed() { printf '%b' "$(echo "$2" | tr -d ' ' | sed 's/\(..\)/\\x\1/g')" > "$build/corpus/$1"; }
seed set      "1500000000000000 01 01 0000 0200000000000000 6162 0300000000000000 78797a"
seed get      "1100000000000000 01 02 0000 e803000000000000 0100000000000000 6b"
seed add      "1100000000000000 01 03 0000 0100000000000000 63 feffffffffffffff"
seed cas      "1c00000000000000 01 04 0000 0100000000000000 6b 0100000000000000 61 0200000000000000 6263"
seed wait     "2300000000000000 01 05 0000 0500000000000000 0200000000000000 0100000000000000 61 0200000000000000 6263"
seed check    "1100000000000000 01 06 0000 0100000000000000 0100000000000000 61"
seed delete   "0900000000000000 01 07 0000 0100000000000000 61"
seed numkeys  "0000000000000000 01 08 0000"

"$cxx" -std=c++17 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -I "$root/runtime/include" -I "$root/runtime/base" \
  "$root/tests/fuzz/store_frame_fuzz.cpp" \
  "$root/runtime/base/store/wire.cpp" "$root/runtime/base/store/kv_table.cpp" \
  "$root/runtime/base/parse_int.cpp" -lfmt -o "$build/store_frame_fuzz"

echo "fuzz.sh: fuzzing the store frame parser for ${seconds} s"
cd "$build"  # parallel jobs write their fuzz-N.log files here
parallel=()
if [ "${JOBS:-1}" -gt 1 ]; then parallel=(-jobs="$JOBS" -workers="$JOBS"); fi
"$build/store_frame_fuzz" "$build/corpus" -max_total_time="$seconds" -max_len=4096 \
  "${parallel[@]}" -artifact_prefix="$build/crashes/" -print_final_stats=1 "$@"
