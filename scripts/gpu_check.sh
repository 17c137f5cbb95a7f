#!/usr/bin/env bash
# Builds dtrain against a CUDA libtorch and runs the GPU tests (CTest label gpu), the GPU
# allreduce benchmark, train_bench --gpu (ResNet-50 with AMP beside PyTorch eager with AMP) and
# recompute_bench --gpu (ResNet-50 with AMP, with and without activation recompute), and
# checks launch's GPU sampling while a GPU test runs, within 10 minutes, on a machine with an
# NVIDIA GPU.
#
#   scripts/gpu_check.sh [--dry-run [--check-build DIR]] [--deps DIR] [--build DIR]
#                        [--python PYTHON] [--jobs N]
#
# Where things come from:
#   libtorch    the pip `torch` of PYTHON (default python3): torch.utils.cmake_prefix_path
#   NCCL        the pip `nvidia-nccl` wheel beside torch (site-packages/nvidia/nccl/{include,lib}),
#               else NCCL_ROOT from the environment, else the CUDA toolkit
#   CUDA        the toolkit of the `nvcc` on PATH (else CUDAToolkit_ROOT, else /usr/local/cuda)
#   small deps  fmt, cxxopts, nlohmann-json, libuv, xxhash, gtest, openssl headers, cpp-httplib:
#               Debian packages unpacked by scripts/gpu_deps.sh into DIR (default .deps/root);
#               Gloo is off
#   peer        train_bench's PyTorch side needs torchvision in PYTHON; without it the peer is
#               skipped and said so
# --dry-run prints every step with what it found and runs nothing; it exits 3 when an input of a
# real run is missing on this machine (no CUDA torch, no deps), else 0. --check-build DIR also
# checks the script against an existing build of this tree: the targets it builds exist, every
# benchmark flag it passes is one allreduce_bench takes, and tests labelled gpu exist; any
# mismatch exits 1. Missing machine inputs do not fail that check: a CTest (label unit) runs
# `--dry-run --check-build <build>` on every machine.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dry=0
check_build=""
deps="$root/.deps/root"
build="$root/build-gpu"
python="${PYTHON:-python3}"
jobs="$(nproc)"
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry=1 ;;
    --check-build) check_build="$2"; shift ;;
    --deps) deps="$2"; shift ;;
    --build) build="$2"; shift ;;
    --python) python="$2"; shift ;;
    --jobs) jobs="$2"; shift ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

[ -z "$check_build" ] || [ "$dry" = 1 ] || { echo "gpu_check.sh: --check-build needs --dry-run" >&2; exit 2; }

# What a real run builds and runs: one list, used by the run and checked by --check-build.
gpu_targets=(dtrain_gpu_tests allreduce_bench launch dtrain_gpu_monitor_tests)
torch_target=dtrain_gpu_torch_tests
bench_args=(--backend nccl --world 1 --no-peer --warmup 5 --iters 20
            --sizes 4K,16K,64K,256K,1M,4M,16M,64M,256M)

start=$(date +%s)
step=0
problems=0
say() { echo "gpu_check.sh: $*"; }
note() {  # a missing input: fatal for a real run, reported by a dry run
  if [ "$dry" = 1 ]; then say "  (dry run) would fail here: $*"; problems=$((problems + 1))
  else say "error: $*" >&2; exit 1; fi
}
run() {  # prints and runs one step (prints only, in a dry run)
  step=$((step + 1))
  say "step $step: $*"
  [ "$dry" = 1 ] || "$@"
}

# The script's own inputs must exist everywhere.
for f in CMakeLists.txt tests/gpu/gpu.cmake tests/gpu/nccl_gpu_test.cpp \
         tests/gpu/process_group_cuda_test.cpp benchmarks/allreduce/allreduce_bench.cpp \
         tests/gpu/monitor_gpu_test.cpp benchmarks/train/train_bench.cpp \
         benchmarks/train/train_peer.py benchmarks/recompute/recompute_bench.cpp \
         benchmarks/recompute/recompute_peer.py scripts/gpu_deps.sh; do
  [ -e "$root/$f" ] || { say "error: $f is missing from the source tree" >&2; exit 1; }
done

say "1. libtorch from $python"
torch_prefix=""
if command -v "$python" >/dev/null 2>&1; then
  torch_prefix="$("$python" -c 'import torch;print(torch.utils.cmake_prefix_path)' 2>/dev/null || true)"
  torch_cuda="$("$python" -c 'import torch;print(torch.version.cuda or "")' 2>/dev/null || true)"
fi
if [ -z "$torch_prefix" ]; then
  note "$python has no torch (pip install torch with CUDA, or --python PATH)"
elif [ -z "${torch_cuda:-}" ]; then
  note "the torch of $python is a CPU build (torch.version.cuda is None)"
else
  say "   torch cmake prefix $torch_prefix (CUDA $torch_cuda)"
fi

say "2. NCCL"
nccl_root="${NCCL_ROOT:-}"
if [ -n "$torch_prefix" ]; then
  site="$("$python" -c 'import os,torch;print(os.path.dirname(os.path.dirname(torch.__file__)))')"
  [ -f "$site/nvidia/nccl/include/nccl.h" ] && nccl_root="$site/nvidia/nccl"
fi
if [ -n "$nccl_root" ]; then say "   NCCL_ROOT=$nccl_root"
else say "   no nvidia-nccl wheel and no NCCL_ROOT: CMake looks in the CUDA toolkit"; fi

say "3. CUDA toolkit"
cuda_root="${CUDAToolkit_ROOT:-}"
if command -v nvcc >/dev/null 2>&1; then cuda_root="$(cd "$(dirname "$(command -v nvcc)")/.." && pwd)"; fi
[ -z "$cuda_root" ] && [ -d /usr/local/cuda ] && cuda_root=/usr/local/cuda
if [ -n "$cuda_root" ]; then say "   CUDAToolkit_ROOT=$cuda_root"; else note "no nvcc on PATH and no CUDA toolkit"; fi

say "4. small dependencies from $deps"
if [ -d "$deps/usr" ]; then
  say "   found $(ls "$deps/usr/include" 2>/dev/null | wc -l) include entries"
else
  note "$deps/usr does not exist: run scripts/gpu_deps.sh on a Debian machine and copy .deps along"
fi
multiarch="$deps/usr/lib/x86_64-linux-gnu"
prefix_path="$torch_prefix;$deps/usr"
export LD_LIBRARY_PATH="$multiarch${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
[ -n "$nccl_root" ] && export LD_LIBRARY_PATH="$nccl_root/lib:$LD_LIBRARY_PATH"

generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
command -v cmake >/dev/null 2>&1 || note "cmake (>= 3.22) is not on PATH (pip install cmake ninja)"

say "5. configure, build, test, benchmark"
run cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  "-DCMAKE_PREFIX_PATH=$prefix_path" ${nccl_root:+"-DNCCL_ROOT=$nccl_root"} \
  ${cuda_root:+"-DCUDAToolkit_ROOT=$cuda_root"} -DDTRAIN_WITH_GLOO=OFF \
  -DDTRAIN_WITH_EXAMPLES=ON -DDTRAIN_WITH_TESTS=ON -DDTRAIN_WITH_BENCHMARKS=ON
if [ "$dry" = 0 ] && ! grep -q 'DTRAIN_WITH_NCCL 1' "$build/generated/dtrain/config.h"; then
  say "error: CMake did not find NCCL and CUDA (see the configure output)" >&2
  exit 1
fi
run cmake --build "$build" -j "$jobs" --target "${gpu_targets[@]}"
# The torch layer against this libtorch: its failure is reported, the torch-free checks still run.
torch_ok=1
step=$((step + 1))
say "step $step: cmake --build $build -j $jobs --target $torch_target"
if [ "$dry" = 0 ] && ! cmake --build "$build" -j "$jobs" --target "$torch_target"; then
  torch_ok=0
  say "FAILED: the torch layer does not build against this libtorch; continuing without it"
fi
run ctest --test-dir "$build" -L gpu --output-on-failure --timeout 180
run "$build/allreduce_bench" "${bench_args[@]}"
# ResNet-50 at 224x224, batch 64, float16 autocast + GradScaler, world size 1 (NCCL), in turns with
# PyTorch eager AMP on the same GPU. Needs the torch layer.
if [ "$torch_ok" = 1 ]; then
  run cmake --build "$build" -j "$jobs" --target train_bench
  run "$build/train_bench" --gpu --python "$python" --rounds 3 --steps 20 --warmup 5
  # Activation recompute: ResNet-50 with AMP (batch 64), peak CUDA memory and samples/s with and
  # without dtrain::recompute, beside checkpoint_sequential on the same GPU.
  run cmake --build "$build" -j "$jobs" --target recompute_bench
  run "$build/recompute_bench" --gpu --models resnet50 --python "$python" --reps 3 --steps 10 --warmup 3
fi

# The script against an existing build: what it would build and pass must exist there.
check_against_build() {
  local dir="$1" bad=0 help
  for t in "${gpu_targets[@]}"; do
    [ -x "$dir/$t" ] || { say "error: $dir has no $t, a target this script builds"; bad=1; }
  done
  if grep -q 'DTRAIN_WITH_TORCH 1' "$dir/generated/dtrain/config.h" 2>/dev/null &&
     [ ! -x "$dir/$torch_target" ]; then
    say "error: $dir has no $torch_target, a target this script builds"; bad=1
  fi
  if [ -x "$dir/allreduce_bench" ]; then
    help="$("$dir/allreduce_bench" --help 2>&1 || true)"
    for a in "${bench_args[@]}"; do
      case "$a" in
        --*) grep -qE -- "(^|[[:space:]])$a([[:space:]]|$)" <<<"$help" ||
               { say "error: allreduce_bench takes no $a (see $dir/allreduce_bench --help)"; bad=1; } ;;
      esac
    done
  fi
  local listed
  listed="$(ctest --test-dir "$dir" -N -L gpu 2>/dev/null || true)"
  if ! grep -q 'Test *#' <<<"$listed"; then
    say "error: no test labelled gpu in $dir (ctest -L gpu runs nothing)"; bad=1
  fi
  [ "$bad" = 0 ] && say "check-build: targets, benchmark flags and gpu tests all found in $dir"
  return "$bad"
}

# launch samples the GPU while a GPU test runs under it: GPU records in the metrics file, and the
# test's GPU memory attributed to its rank (nvidia-smi / NVML list its pid).
say "6. launch's GPU sampling while a GPU test runs"
metrics="$build/gpu_check_metrics.jsonl"
run rm -f "$metrics"
run "$build/launch" --nproc-per-node 1 --sample-interval 0.5 --metrics-file "$metrics" \
  -- "$build/dtrain_gpu_tests"
step=$((step + 1))
say "step $step: check $metrics (GPU records; rank 0's GPU memory attributed)"
if [ "$dry" = 0 ]; then
  "$python" - "$metrics" <<'PY'
import json, sys
records = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
gpus = [r for r in records if "gpu" in r and "rank" not in r]
ranks = [r for r in records if "gpu" in r and "rank" in r]
problems = []
if not gpus:
    problems.append("no GPU records: launch sampled no GPU")
if any(r.get("source") != "launch" for r in records):
    problems.append("a record whose source is not launch")
if gpus and not any(r.get("gpu_mem_total_bytes", 0) > 0 for r in gpus):
    problems.append("no GPU memory total in any GPU record")
if not any(r.get("gpu_process_mem_bytes", 0) > 0 for r in ranks):
    problems.append("the GPU test's memory was never attributed to rank 0 (another pid namespace?)")
util = max((r.get("gpu_util") or 0 for r in gpus), default=0)
used = max((r.get("gpu_process_mem_bytes", 0) for r in ranks), default=0)
print(f"gpu_check.sh:   {len(records)} records, {len(gpus)} GPU samples, GPU util up to {util:.0f} %, "
      f"rank 0 used up to {used / 2**20:.0f} MiB of GPU memory")
for p in problems:
    print("gpu_check.sh:   FAILED: " + p)
sys.exit(1 if problems else 0)
PY
fi

end=$(date +%s)
if [ "$dry" = 1 ]; then
  say "dry run: $step steps printed, $problems input(s) missing on this machine ($((end - start)) s)"
  if [ -n "$check_build" ]; then
    check_against_build "$check_build" || exit 1
    exit 0
  fi
  [ "$problems" = 0 ] || exit 3
  exit 0
fi
say "done in $((end - start)) s$([ "$torch_ok" = 0 ] && echo ' (torch layer FAILED to build)')"
[ "$torch_ok" = 1 ]
