#!/usr/bin/env bash
# scripts/gpu_check.sh on a fake GPU machine, so its logic is tested where there is no GPU: a
# pip-style site-packages tree (torch/share/cmake, nvidia/nccl/{include,lib}) whose torch is a
# stand-in answering the script's questions from FAKE_TORCH_* variables, run by a fake python; a
# fake nvcc (FAKE_NVCC) and a fake folder of small dependencies.
#
#   gpu_check_fake_test.sh SOURCE_DIR pip-layout
#       dry runs: the paths resolved from the tree (CMAKE_PREFIX_PATH, NCCL_ROOT,
#       CMAKE_CUDA_COMPILER, CUDAToolkit_ROOT) and the one-line refusals (nvcc's major version
#       against torch.version.cuda, unsupported torch versions, the pre-C++11 ABI, a CPU torch),
#       the last also in a real run, which must stop before configuring.
#   gpu_check_fake_test.sh SOURCE_DIR budget
#       real runs with fake cmake, ctest and benchmarks: a failed row does not stop the next, a row
#       is cut to the budget left and killed with its children, rows past the budget are reported
#       as not run, a row whose target is out of date is skipped, a configure that found no
#       libtorch stops the run after the build row, and the summary comes last.
set -euo pipefail
src="$1"
mode="$2"
script="$src/scripts/gpu_check.sh"
tmp="$(mktemp -d)"
trap '[ -n "${KEEP_TMP:-}" ] || rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# ---- The fake machine --------------------------------------------------------------------------
site="$tmp/site-packages"
mkdir -p "$site/torch/share/cmake/Torch" "$site/torch/utils" "$site/nvidia/nccl/include" \
         "$site/nvidia/nccl/lib" "$tmp/bin" "$tmp/deps/usr/include/fmt"
touch "$site/torch/share/cmake/Torch/TorchConfig.cmake" "$site/nvidia/nccl/lib/libnccl.so.2"
printf '#define NCCL_MAJOR 2\n#define NCCL_MINOR 27\n#define NCCL_PATCH 7\n' \
  >"$site/nvidia/nccl/include/nccl.h"
cat >"$site/torch/__init__.py" <<'PY'
# A stand-in for pip's torch: what scripts/gpu_check.sh asks, answered from FAKE_TORCH_*.
import os
from . import utils, version
__version__ = os.environ.get("FAKE_TORCH_VERSION", "2.11.0+cu130")
def compiled_with_cxx11_abi():
    return os.environ.get("FAKE_TORCH_ABI", "1") == "1"
PY
cat >"$site/torch/version.py" <<'PY'
import os
cuda = os.environ.get("FAKE_TORCH_CUDA", "13.0") or None
PY
cat >"$site/torch/utils/__init__.py" <<'PY'
import os
cmake_prefix_path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "share", "cmake")
PY
real_python="$(command -v python3)"
printf '#!/bin/sh\nPYTHONPATH=%q exec %q "$@"\n' "$site" "$real_python" >"$tmp/bin/python"
cat >"$tmp/bin/nvcc" <<'SH'
#!/bin/sh
echo "nvcc: NVIDIA (R) Cuda compiler driver"
echo "Cuda compilation tools, release ${FAKE_NVCC:-13.0}, V${FAKE_NVCC:-13.0}.88"
SH
chmod +x "$tmp/bin/python" "$tmp/bin/nvcc"
export PATH="$tmp/bin:$PATH"
unset CUDACXX CUDAToolkit_ROOT NCCL_ROOT TORCH_CUDA_ARCH_LIST || true
common=(--python "$tmp/bin/python" --deps "$tmp/deps" --build "$tmp/build")

run_check() {  # run_check EXPECTED_RC ARGS...: runs the script, output in $out
  local want="$1" rc=0
  shift
  out="$("$script" "${common[@]}" "$@" 2>&1)" || rc=$?
  [ -z "${VERBOSE:-}" ] || printf '$ gpu_check.sh %s\n%s\n(exit %s)\n' "$*" "$out" "$rc"
  [ "$rc" = "$want" ] || { echo "$out" >&2; fail "gpu_check.sh $* exited $rc, expected $want"; }
}
expect() {  # expect TEXT: $out holds TEXT (fixed string)
  grep -qF -- "$1" <<<"$out" || { echo "$out" >&2; fail "no line with: $1"; }
}
expect_re() {  # expect_re REGEX: $out has a line matching REGEX (extended)
  grep -qE -- "$1" <<<"$out" || { echo "$out" >&2; fail "no line matching: $1"; }
}
expect_one_refusal() {  # expect_one_refusal TEXT: exactly one refusal line, and it holds TEXT
  local lines
  lines="$(grep -cE 'a real run stops here|error:' <<<"$out" || true)"
  [ "$lines" = 1 ] || { echo "$out" >&2; fail "expected one refusal line, got $lines"; }
  expect "$1"
}

pip_layout() {
  run_check 0 --dry-run
  expect "torch 2.11.0+cu130, CUDA 13.0, C++11 ABI 1, CMake prefix $site/torch/share/cmake"
  expect "NCCL_ROOT=$site/nvidia/nccl"
  expect "nvcc 13.0 ($tmp/bin/nvcc), toolkit $tmp"
  expect "-DDTRAIN_LIBTORCH=$site/torch -DCMAKE_PREFIX_PATH=$tmp/deps/usr"
  expect "-DNCCL_ROOT=$site/nvidia/nccl"
  expect "-DCMAKE_CUDA_COMPILER=$tmp/bin/nvcc"
  expect "-DCUDAToolkit_ROOT=$tmp "
  expect "-DDTRAIN_WITH_GLOO=OFF"
  expect "0 input(s) missing"
  echo "ok: the pip layout resolves"

  FAKE_NVCC=12.8 run_check 3 --dry-run
  expect_one_refusal "nvcc 12.8 ($tmp/bin/nvcc) and torch.version.cuda 13.0 are different CUDA major versions"
  FAKE_TORCH_VERSION=2.15.0 run_check 3 --dry-run
  expect_one_refusal "torch 2.15.0 is not a version dtrain supports (2.11 - 2.14"
  for v in 1.13.1 2.10.0+cu130; do
    FAKE_TORCH_VERSION=$v run_check 3 --dry-run
    expect_one_refusal "torch $v is not a version dtrain supports (2.11 - 2.14"
  done
  FAKE_TORCH_ABI=0 run_check 3 --dry-run
  expect_one_refusal "built with the pre-C++11 ABI"
  FAKE_TORCH_CUDA="" FAKE_TORCH_VERSION=2.11.0+cpu run_check 3 --dry-run
  expect_one_refusal "is a CPU build"
  for v in 2.11.0+cu130 2.14.0+cu132; do
    FAKE_TORCH_VERSION=$v run_check 0 --dry-run
  done
  echo "ok: one line per refusal; 1.13 and 2.10 refused, 2.11 and 2.14 accepted"

  # A real run refuses before configuring anything.
  FAKE_NVCC=12.8 run_check 1
  expect_one_refusal "are different CUDA major versions"
  [ ! -e "$tmp/build" ] || fail "the refused run created $tmp/build"
  echo "ok: a real run stops before configuring"
}

# Fake cmake and ctest for real runs. cmake -S ... -B DIR writes what gpu_check.sh reads
# (dtrain/config.h, gpu_test_targets.txt) and fake programs; --build builds nothing and, asked
# with -n, reports every target up to date but FAKE_STALE.
fake_tools() {
  cat >"$tmp/bin/cmake" <<'SH'
#!/bin/bash
if [[ " $* " == *" --build "* ]]; then
  if [[ " $* " == *" -n "* ]]; then
    [[ " $* " == *" --target ${FAKE_STALE:-none} "* ]] && echo "[1/1] Linking" || echo "ninja: no work to do."
  fi
  exit 0
fi
while [ $# -gt 0 ]; do [ "$1" = -B ] && b="$2"; shift; done
mkdir -p "$b/generated/dtrain"
printf '#define DTRAIN_WITH_%s 1\n' TORCH_CUDA NCCL >"$b/generated/dtrain/config.h"
echo "#define DTRAIN_WITH_TORCH ${FAKE_WITH_TORCH:-1}" >>"$b/generated/dtrain/config.h"
echo dtrain_gpu_tests >"$b/gpu_test_targets.txt"
for p in dtrain_gpu_tests launch train_bench; do printf '#!/bin/sh\nexit 0\n' >"$b/$p"; done
# allreduce_bench outlives any budget, with a child that must die with it.
printf '#!/bin/sh\nsleep 300 &\necho $! >%q/child.pid\nwait\n' "$b" >"$b/allreduce_bench"
chmod +x "$b"/dtrain_gpu_tests "$b"/launch "$b"/train_bench "$b"/allreduce_bench
SH
  cat >"$tmp/bin/ctest" <<'SH'
#!/bin/sh
sleep "${FAKE_CTEST_SECONDS:-0}"
echo "fake ctest: exit ${FAKE_CTEST_RC:-0}"
exit "${FAKE_CTEST_RC:-0}"
SH
  chmod +x "$tmp/bin/cmake" "$tmp/bin/ctest"
}

budget() {
  fake_tools
  # A failing row, then one cut to the budget left and killed with its child, then rows past it.
  FAKE_CTEST_RC=1 run_check 1 --budget 8
  expect_re "gpu_tests +[01] s  FAILED \(exit 1\)"
  expect_re "allreduce +[0-9]+ s  TIMEOUT: stopped at [5-8] s \(the budget left\)"
  expect "resnet_amp   not run: the budget is spent"
  expect "launch_gpu   not run: the budget is spent"
  [ "$(tail -n 1 <<<"$out")" = "gpu_check.sh:   logs: $tmp/build/gpu_check/<row>.log" ] ||
    { echo "$out" >&2; fail "the summary is not last"; }
  sleep 0.5
  # Killed, or a zombie not yet reaped by whoever inherited it.
  case "$(ps -o stat= -p "$(cat "$tmp/build/child.pid")" || true)" in
    "" | Z*) ;;
    *) fail "allreduce_bench's child outlived its row" ;;
  esac
  echo "ok: a failed row, a row cut to the budget (its child killed), rows past the budget"

  # A row whose target did not build is skipped; the others run.
  FAKE_STALE=train_bench run_check 1 --rows gpu_tests,resnet_amp
  expect_re "gpu_tests +[01] s  ok"
  expect "resnet_amp   skipped: train_bench was not built"
  [ -f "$tmp/build/gpu_check/gpu_tests.sh" ] || fail "no rerunnable script for the gpu_tests row"
  echo "ok: a row whose target is out of date is skipped"

  # A quiet wrong prefix: CMake found no libtorch. The build row says so; nothing else runs.
  FAKE_WITH_TORCH=0 run_check 1
  expect "FAILED: $tmp/build/generated/dtrain/config.h has DTRAIN_WITH_TORCH 0"
  expect_re "build +[01] s  FAILED \(exit 1\)"
  expect "gpu_tests    skipped: the build row did not configure a build with a CUDA libtorch and NCCL"
  expect "launch_gpu   skipped: the build row did not configure"
  echo "ok: a configure without libtorch stops the run after the build row"

  # Every row that ran passed, but the budget ran out first: exit 4.
  FAKE_CTEST_SECONDS=5 run_check 4 --budget 9
  expect_re "gpu_tests +[5-7] s  ok"
  expect "allreduce    not run: the budget is spent"
  echo "ok: the budget spent before every row ran exits 4"
}

case "$mode" in
  pip-layout) pip_layout ;;
  budget) budget ;;
  *) fail "unknown mode $mode (pip-layout or budget)" ;;
esac
