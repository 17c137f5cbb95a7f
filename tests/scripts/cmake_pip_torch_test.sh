#!/usr/bin/env bash
# dtrain's CMake against a fake pip libtorch (TorchConfig.cmake in torch/share/cmake/Torch, fmt 12
# headers in torch/include/fmt, a libtorch_cpu.so without Gloo), configured only, so what the
# configure decides is tested without libtorch 2.x:
#   - DTRAIN_LIBTORCH names the libtorch to build against;
#   - the fmt dtrain links is read ahead of libtorch's bundled one (Note [Two fmts]), checked by a
#     compile at configure time, also when that fmt is in /usr/include (through a folder of the
#     build that links to it);
#   - libtorch 2.13 and 2.14 make the build C++20;
#   - libtorch's package sees CMAKE_CUDA_COMPILER set to the CUDA toolkit's nvcc, when the build
#     found a toolkit;
#   - the c10d Gloo peer of allreduce_bench is skipped, saying why, for a libtorch with its own Gloo.
#
#   cmake_pip_torch_test.sh SOURCE_DIR
set -euo pipefail
src="$1"
tmp="$(mktemp -d)"
trap '[ -n "${KEEP_TMP:-}" ] || rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# ---- A fake pip torch ----------------------------------------------------------------------
torch="$tmp/site-packages/torch"
mkdir -p "$torch/share/cmake/Torch" "$torch/include/fmt" "$torch/include/torch/csrc/api/include" \
         "$torch/lib"
cat >"$torch/share/cmake/Torch/TorchConfig.cmake" <<'CMAKE'
# A stand-in for pip libtorch's TorchConfig.cmake: what dtrain's CMake reads of it.
get_filename_component(TORCH_INSTALL_PREFIX "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
set(TORCH_INCLUDE_DIRS ${TORCH_INSTALL_PREFIX}/include
    ${TORCH_INSTALL_PREFIX}/include/torch/csrc/api/include)
file(WRITE "${CMAKE_BINARY_DIR}/fake_torch_saw.txt" "CMAKE_CUDA_COMPILER=${CMAKE_CUDA_COMPILER}\n")
if(NOT TARGET torch)
  add_library(torch INTERFACE IMPORTED)
  set_target_properties(torch PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${TORCH_INCLUDE_DIRS}"
                        INTERFACE_COMPILE_OPTIONS "-D_GLIBCXX_USE_CXX11_ABI=1")
endif()
set(TORCH_LIBRARIES torch "${TORCH_INSTALL_PREFIX}/lib/libc10_cuda.so")
set(TORCH_FOUND TRUE)
CMAKE
printf '#pragma once\n#include "base.h"\n' >"$torch/include/fmt/core.h"
printf '#pragma once\n#define FMT_VERSION 120000\n' >"$torch/include/fmt/base.h"
echo 'int torch_cpu_stand_in;' >"$tmp/empty.c"
cc -shared -o "$torch/lib/libtorch_cpu.so" "$tmp/empty.c"
torch_version() {
  printf 'set(PACKAGE_VERSION "%s")\nset(PACKAGE_VERSION_COMPATIBLE TRUE)\n' "$1" \
    >"$torch/share/cmake/Torch/TorchConfigVersion.cmake"
}

# ---- The system's fmt package, copied outside the compiler's search path ----------------------
fmt_config="$( (ls /usr/lib/*/cmake/fmt/fmt-config.cmake /usr/lib/cmake/fmt/fmt-config.cmake \
                 2>/dev/null || true) | head -n1)"
[ -n "$fmt_config" ] || fail "no fmt CMake package under /usr/lib (apt-get install libfmt-dev)"
libdir="$(dirname "$(dirname "$(dirname "$fmt_config")")")"  # /usr/lib/<arch> or /usr/lib
fmt="$tmp/fmt"
mkdir -p "$fmt/include" "$fmt/${libdir#/usr/}/cmake"
cp -r /usr/include/fmt "$fmt/include/"
cp -r "$(dirname "$fmt_config")" "$fmt/${libdir#/usr/}/cmake/"
cp -P "$libdir"/libfmt.so* "$fmt/${libdir#/usr/}/"

configure() {  # configure NAME PREFIX_PATH: output in $out, exit status in $rc
  rc=0
  out="$(cmake -S "$src" -B "$tmp/$1" -G Ninja -DCMAKE_BUILD_TYPE=Release \
           "-DCMAKE_PREFIX_PATH=$2" "-DDTRAIN_LIBTORCH=$torch" -DDTRAIN_WITH_TESTS=OFF -DDTRAIN_WITH_EXAMPLES=OFF \
           -DDTRAIN_WITH_BENCHMARKS=ON 2>&1)" || rc=$?
  [ -z "${VERBOSE:-}" ] || printf '%s\n(exit %s)\n' "$out" "$rc"
}
expect() {  # expect TEXT: $out holds TEXT, however CMake wrapped it
  grep -qF -- "$1" <<<"$(tr -s '[:space:]' ' ' <<<"$out")" || { echo "$out" >&2; fail "no: $1"; }
}
std_of() {  # std_of BUILD: the -std= of dtrain's own sources in BUILD
  grep -o -- '-std=c++[0-9a-z]*' "$tmp/$1/compile_commands.json" | sort -u | tr '\n' ' '
}

torch_version 2.14.0
configure b214 "$torch/share/cmake;$fmt"
[ "$rc" = 0 ] || { echo "$out" >&2; fail "configure against the fake libtorch 2.14 failed"; }
expect "fmt $(sed -n 's/.*PACKAGE_VERSION "\(.*\)".*/\1/p' "$(dirname "$fmt_config")/fmt-config-version.cmake" | head -n1) ($fmt/include) is read ahead of the fmt 12.0.0 libtorch bundles"
# Every compile that sees libtorch's include directory sees fmt's first.
python3 - "$tmp/b214/compile_commands.json" "$fmt/include" "$torch/include" <<'PY' ||
import json, shlex, sys
commands, fmt, torch = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3]
seen = 0
for c in commands:
    args = shlex.split(c["command"])
    dirs = [a[2:] if a.startswith("-I") else args[i + 1]
            for i, a in enumerate(args) if a.startswith("-I") or a == "-isystem"]
    if torch not in dirs:
        continue
    seen += 1
    if fmt not in dirs or dirs.index(fmt) > dirs.index(torch):
        sys.exit(f"{c['file']}: libtorch's include directory comes before fmt's: {dirs}")
if not seen:
    sys.exit("no compile sees libtorch's include directory")
print(f"ok: fmt's include directory precedes libtorch's in all {seen} compiles that see both")
PY
  fail "the include order of some compile lets libtorch's fmt win"
expect "libtorch 2.14.0 needs C++20: building as C++20"
[ "$(std_of b214)" = "-std=c++20 " ] || fail "libtorch 2.14: sources compiled with $(std_of b214), not -std=c++20"
expect "allreduce_bench: the c10d Gloo peer is not built: libtorch ($torch/lib/libtorch_cpu.so) does not link the system Gloo"
if grep -q "CUDAToolkit_NVCC_EXECUTABLE:FILEPATH=" "$tmp/b214/CMakeCache.txt"; then
  nvcc="$(sed -n 's/^CUDAToolkit_NVCC_EXECUTABLE:FILEPATH=//p' "$tmp/b214/CMakeCache.txt")"
  grep -qxF "CMAKE_CUDA_COMPILER=$nvcc" "$tmp/b214/fake_torch_saw.txt" ||
    fail "libtorch's package saw $(cat "$tmp/b214/fake_torch_saw.txt"), not the toolkit's $nvcc"
  echo "ok: libtorch's package is handed the toolkit's nvcc ($nvcc)"
else
  echo "(no CUDA toolkit here: CMAKE_CUDA_COMPILER not checked)"
fi
echo "ok: libtorch 2.14: fmt order checked, C++20, no c10d Gloo peer"

torch_version 2.13.0
configure b213 "$torch/share/cmake;$fmt"
[ "$rc" = 0 ] || { echo "$out" >&2; fail "configure against the fake libtorch 2.13 failed"; }
[ "$(std_of b213)" = "-std=c++20 " ] || fail "libtorch 2.13: sources compiled with $(std_of b213), not -std=c++20"
echo "ok: libtorch 2.13: C++20"

configure bsys "$torch/share/cmake"
[ "$rc" = 0 ] || { echo "$out" >&2; fail "configure with fmt in /usr/include failed"; }
expect "($tmp/bsys/dtrain_fmt_include) is read ahead of the fmt 12.0.0 libtorch bundles"
[ "$(readlink "$tmp/bsys/dtrain_fmt_include/fmt")" = /usr/include/fmt ] ||
  fail "the build's fmt folder does not link to /usr/include/fmt"
echo "ok: an fmt in /usr/include is read, through the build's link to it, ahead of libtorch's"

# Outside the supported range: one message naming the version found and the range.
for v in 2.10.0 2.15.0; do
  torch_version "$v"
  configure "bv$v" "$torch/share/cmake;$fmt"
  [ "$rc" != 0 ] || fail "configure against libtorch $v succeeded"
  expect "libtorch $v ($torch) is not a version dtrain supports (2.11 - 2.14"
done
echo "ok: libtorch 2.10 and 2.15 are refused, naming the version and the supported range"
