#!/usr/bin/env bash
# Opt-in (not CI): libFuzzer with ASan + UBSan over the two parsers that meet untrusted bytes:
#   store       the store's frame parser and key-value table (tests/fuzz/store_frame_fuzz.cpp)
#   checkpoint  the checkpoint reader (tests/fuzz/checkpoint_reader_fuzz.cpp; seeds in
#               tests/fuzz/corpus/checkpoint, which the normal test suite also replays)
# Needs clang with libFuzzer (Debian: apt-get install clang).
#   scripts/fuzz.sh [seconds per target, default 60] [extra libFuzzer flags...]
# Environment: BUILD_DIR (default build-fuzz), CXX (default clang++), JOBS (parallel fuzz jobs,
# default 1), TARGETS (default "store checkpoint"). Crashes are written to
# $BUILD_DIR/crashes/<target>/ and the script exits non-zero.
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
targets="${TARGETS:-store checkpoint}"
mkdir -p "$build/corpus/store" "$build/corpus/checkpoint"
cxxflags=(-std=c++17 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
          -I "$root/runtime/include" -I "$root/runtime/base")

# Store seeds: the golden frames of tests/base/store/store_wire_test.cpp, one request per file.
seed() { printf '%b' "$(echo "$2" | tr -d ' ' | sed 's/\(..\)/\\x\1/g')" > "$build/corpus/store/$1"; }
seed set      "1500000000000000 01 01 0000 0200000000000000 6162 0300000000000000 78797a"
seed get      "1100000000000000 01 02 0000 e803000000000000 0100000000000000 6b"
seed add      "1100000000000000 01 03 0000 0100000000000000 63 feffffffffffffff"
seed cas      "1c00000000000000 01 04 0000 0100000000000000 6b 0100000000000000 61 0200000000000000 6263"
seed wait     "2300000000000000 01 05 0000 0500000000000000 0200000000000000 0100000000000000 61 0200000000000000 6263"
seed check    "1100000000000000 01 06 0000 0100000000000000 0100000000000000 61"
seed delete   "0900000000000000 01 07 0000 0100000000000000 61"
seed numkeys  "0000000000000000 01 08 0000"
cp "$root"/tests/fuzz/corpus/checkpoint/* "$build/corpus/checkpoint/"

build_target() {
  case "$1" in
    store)
      "$cxx" "${cxxflags[@]}" "$root/tests/fuzz/store_frame_fuzz.cpp" \
        "$root/runtime/base/store/wire.cpp" "$root/runtime/base/store/kv_table.cpp" \
        "$root/runtime/base/parse_int.cpp" -lfmt -o "$build/store_fuzz" ;;
    checkpoint)
      "$cxx" "${cxxflags[@]}" "$root/tests/fuzz/checkpoint_reader_fuzz.cpp" \
        "$root/runtime/base/checkpoint/format.cpp" "$root/runtime/base/error.cpp" \
        -lxxhash -lfmt -o "$build/checkpoint_fuzz" ;;
    *) echo "fuzz.sh: unknown target $1 (store, checkpoint)" >&2; exit 2 ;;
  esac
}

parallel=()
if [ "${JOBS:-1}" -gt 1 ]; then parallel=(-jobs="$JOBS" -workers="$JOBS"); fi
for target in $targets; do
  build_target "$target"
  mkdir -p "$build/crashes/$target" "$build/logs/$target"
  echo "fuzz.sh: fuzzing the $target parser for ${seconds} s"
  # Parallel jobs write their fuzz-N.log files into the current directory.
  (cd "$build/logs/$target" && "$build/${target}_fuzz" "$build/corpus/$target" \
    -max_total_time="$seconds" -max_len=65536 "${parallel[@]}" \
    -artifact_prefix="$build/crashes/$target/" -print_final_stats=1 "$@")
done
