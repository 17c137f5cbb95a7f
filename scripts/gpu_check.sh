#!/usr/bin/env bash
# Builds dtrain against the CUDA libtorch of a GPU machine and runs what matters most first, within
# a time budget (default 300 s of rows, configure and build included; the checks before them take
# a few seconds more, mostly importing torch): one priority list of rows, each with its own time
# limit. A row runs only while budget is left, and never past what is left; the rows after the
# budget is spent are reported as not run. A summary of every row is printed last, whatever
# happened.
#
#   scripts/gpu_check.sh [--dry-run [--check-build DIR]] [--budget SECONDS] [--rows NAME,...]
#                        [--deps DIR] [--build DIR] [--python PYTHON] [--jobs N]
#
# The rows are listed below (search "The priority list"): build (configure + Ninja build of the
# targets the chosen rows need), gpu_tests (every CTest test labelled gpu: NCCL at world size 1,
# the torch layer and DDP on CUDA, launch's GPU sampling parsers; their targets are those CMake
# lists in BUILD/gpu_test_targets.txt), allreduce (allreduce_bench --backend nccl, 4 KiB -
# 256 MiB), resnet_amp (train_bench --gpu: ResNet-50 AMP beside PyTorch eager AMP), launch_gpu
# (launch's GPU sampling while a GPU test runs), zero_memory (train_resnet --zero 0-3, and 2-3
# with --offload: ZeRO's peak GPU memory and samples/s against DDP's), recompute (recompute_bench --gpu: ResNet-50 AMP, peak CUDA memory and
# samples/s with and without activation recompute, beside PyTorch's checkpoint_sequential), gpt2
# (train_gpt's GPT-2-sized model: ZeRO-3 + float16 + recompute, then DDP), then the rows other
# features add. --rows runs only the named rows (and the build of what they need).
#
# Before configuring it checks, and stops with one line on the first that fails: PYTHON's torch is
# a CUDA build of a version dtrain supports (2.11 - 2.14: docs/design.md#libraries), built
# with the C++11 ABI, and nvcc's major version is torch.version.cuda's. Right after configuring:
# DTRAIN_WITH_TORCH, DTRAIN_WITH_TORCH_CUDA and DTRAIN_WITH_NCCL are 1 in dtrain/config.h.
#
# Where things come from:
#   libtorch    the pip `torch` of PYTHON (default python3): its folder (the one above
#               torch.utils.cmake_prefix_path), passed as DTRAIN_LIBTORCH as the default build
#               passes the .venv's
#   NCCL        the pip `nvidia-nccl` wheel beside torch (site-packages/nvidia/nccl/{include,lib}),
#               else NCCL_ROOT from the environment, else the CUDA toolkit
#   CUDA        the toolkit of nvcc: CUDACXX, else the nvcc on PATH, else CUDAToolkit_ROOT/bin,
#               else /usr/local/cuda/bin; passed as CMAKE_CUDA_COMPILER (libtorch 2.x's CMake
#               package enables the CUDA language) and as the toolkit root
#   small deps  fmt, cxxopts, nlohmann-json, libuv, xxhash, gtest, openssl headers, cpp-httplib:
#               Debian packages unpacked by scripts/gpu_deps.sh into DIR (default .deps/root);
#               Gloo is off
#   peer        train_bench's PyTorch side needs torchvision in PYTHON; without it the peer is
#               skipped and said so
# Each row's output goes to BUILD/gpu_check/<row>.log and its command to BUILD/gpu_check/<row>.sh
# (rerun one by hand with `bash BUILD/gpu_check/<row>.sh`); the summary to
# BUILD/gpu_check/summary.txt. Give whatever runs this script a limit above the budget (a signal is
# handled only once the row running then has ended).
#
# --dry-run prints the checks and every row with its limit, targets and command, and runs nothing;
# it exits 3 when an input of a real run is missing on this machine, else 0. --check-build DIR
# also checks the script against an existing build of this tree: the targets the rows need exist,
# every flag a row passes to a benchmark is one the benchmark's --help lists, and tests labelled
# gpu exist; any mismatch exits 1. Missing machine inputs do not fail that check: a CTest (label
# unit) runs `--dry-run --check-build <build>` on every machine.
#
# Exit status: 0 every chosen row ran and passed; 1 a check or a row failed (or hit its limit);
# 2 usage; 3 a dry run found an input missing; 4 the budget ran out before every row ran (the rows
# that ran passed).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dry=0
check_build=""
deps="$root/.deps/root"
build="$root/build-gpu"
python="${PYTHON:-python3}"
jobs="$(nproc)"
budget=300
only_rows=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry=1 ;;
    --check-build) check_build="$2"; shift ;;
    --budget) budget="$2"; shift ;;
    --rows) only_rows="$2"; shift ;;
    --deps) deps="$2"; shift ;;
    --build) build="$2"; shift ;;
    --python) python="$2"; shift ;;
    --jobs) jobs="$2"; shift ;;
    -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
usage_error() { echo "gpu_check.sh: $*" >&2; exit 2; }
[ -z "$check_build" ] || [ "$dry" = 1 ] || usage_error "--check-build needs --dry-run"
[[ "$budget" =~ ^[0-9]+$ ]] || usage_error "--budget takes whole seconds, got $budget"

# The libtorch versions dtrain supports (docs/design.md#libraries): 2.11 (this machine kind's) to
# 2.14 (CI's; 2.13 and later need C++20, which cmake/dependencies.cmake then asks for).
torch_min2=11
torch_max2=14
bench_args=(--backend nccl --world 1 --no-peer --warmup 5 --iters 20
            --sizes 4K,16K,64K,256K,1M,4M,16M,64M,256M)
# ResNet-50 at 224x224, batch 64, float16 autocast + GradScaler, world size 1 (NCCL), in turns with
# PyTorch eager AMP on the same GPU.
train_args=(--rounds 3 --steps 20 --warmup 5)
logdir="$build/gpu_check"

say() { echo "gpu_check.sh: $*"; }
problems=0
refuse() {  # refuse WORDS...: a missing or wrong input: fatal for a real run, counted by a dry run
  if [ "$dry" = 1 ]; then say "  (dry run) a real run stops here: $*"; problems=$((problems + 1))
  else say "error: $*" >&2; exit 1; fi
}

# ---- Rows ------------------------------------------------------------------------------------
row_names=(); row_limits=(); row_targets=(); row_cmds=(); row_shown=()
row() {  # row NAME LIMIT_S "TARGETS" COMMAND...   (TARGETS: @gpu-tests = every gpu test's target)
  row_names+=("$1"); row_limits+=("$2"); row_targets+=("$3"); shift 3
  row_cmds+=("$(printf '%q ' "$@")")  # for eval
  row_shown+=("$*")                    # for people
}

# The priority list. One line per row: name, time limit in seconds, the CMake targets it needs
# (the build row builds those of the chosen rows), the command (a program or a function below).
# Rows run in this order while the budget lasts. To add a row, add a line.
row build      180 ""                configure_and_build
row gpu_tests   75 "@gpu-tests"      ctest --test-dir "$build" -L gpu --output-on-failure --timeout 60
row allreduce   30 "allreduce_bench" "$build/allreduce_bench" "${bench_args[@]}"
row resnet_amp  90 "train_bench"     "$build/train_bench" --gpu --python "$python" "${train_args[@]}"
row launch_gpu  40 "launch dtrain_gpu_tests" launch_gpu_sampling
row zero_memory 120 "launch train_resnet" zero_peak_memory
row recompute  100 "recompute_bench" "$build/recompute_bench" --gpu --models resnet50 --python "$python" --reps 3 --steps 10 --warmup 3
row gpt2        90 "launch train_gpt" gpt2_steps

# ---- What the rows call (each row runs in BUILD/gpu_check/<row>.sh, which carries every function
# of this script and the variables it resolved) ---------------------------------------------------

# The targets of every test labelled gpu: CMake lists them in BUILD/gpu_test_targets.txt.
expand_targets() {  # expand_targets BUILD "SPEC": SPEC with @gpu-tests replaced
  local t
  for t in $2; do
    if [ "$t" = "@gpu-tests" ]; then cat "$1/gpu_test_targets.txt" 2>/dev/null || echo "@gpu-tests"
    else echo "$t"; fi
  done | sort -u | tr '\n' ' '
}

configure_and_build() {
  local t0=$SECONDS
  cmake "${cmake_args[@]}" || { echo "gpu_check.sh: FAILED: configure (output above)"; return 1; }
  local config="$build/generated/dtrain/config.h" f bad=0
  for f in TORCH TORCH_CUDA NCCL; do
    grep -q "^#define DTRAIN_WITH_$f 1" "$config" ||
      { echo "gpu_check.sh: FAILED: $config has DTRAIN_WITH_$f 0: CMake did not find it (HINT:" \
             "the libtorch, NCCL and CUDA lines of the configure output above)"; bad=1; }
  done
  [ "$bad" = 0 ] || return 1
  touch "$build/gpu_check/configured"  # the other rows run only after this
  echo "gpu_check.sh: configured in $((SECONDS - t0)) s"
  local targets
  targets="$(expand_targets "$build" "$build_targets")"
  echo "gpu_check.sh: building $targets"
  t0=$SECONDS
  # -k 0: a target that fails does not stop the others; rows whose targets built still run.
  # shellcheck disable=SC2086
  cmake --build "$build" -j "$jobs" --target $targets -- -k 0
  local rc=$?
  echo "gpu_check.sh: built in $((SECONDS - t0)) s$([ "$rc" = 0 ] || echo ' (some targets FAILED)')"
  return "$rc"
}

# launch samples the GPU while a GPU test runs under it: GPU records in the metrics file, and the
# test's GPU memory attributed to its rank (nvidia-smi / NVML list its pid).
launch_gpu_sampling() {
  local metrics="$build/gpu_check/metrics.jsonl"
  rm -f "$metrics"
  "$build/launch" --nproc-per-node 1 --sample-interval 0.5 --metrics-file "$metrics" \
    -- "$build/dtrain_gpu_tests" || return 1
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
print(f"gpu_check.sh: {len(records)} records, {len(gpus)} GPU samples, "
      f"GPU util up to {util:.0f} %, rank 0 used up to {used / 2**20:.0f} MiB of GPU memory")
for p in problems:
    print("gpu_check.sh: FAILED: " + p)
sys.exit(1 if problems else 0)
PY
}

# train_gpt's GPT-2-sized model (12 x 768, 1024 positions, 86.0M parameters with byte tokens) on
# CUDA: 8 steps of ZeRO-3 with float16 autocast (the blocks gathered in float16 with float32
# masters, a GradScaler), recompute and a checkpoint, then the same under DDP; the corpus is the
# repository's docs (the fortunes package may be missing here). The row fails unless both train
# (a finite loss, a sample at the end); it prints each run's tokens/s and peak GPU memory.
gpt2_steps() {
  local run metrics
  for run in zero3 ddp; do
    local flags=(--zero 3 --recompute --checkpoint-dir "$build/gpu_check/gpt2-ckpt")
    [ "$run" = ddp ] && flags=(--zero 0)
    metrics="$build/gpu_check/gpt2-$run.jsonl"
    rm -rf "$metrics" "$build/gpu_check/gpt2-ckpt"
    "$build/launch" --nproc-per-node 1 --sample-interval 0.5 --metrics-file "$metrics" \
      -- "$build/train_gpt" --device cuda --preset gpt2 --amp "${flags[@]}" --steps 8 \
      --batch-size 8 --warmup-steps 2 --eval-every 0 --eval-batches 4 --log-every 2 \
      --sample-tokens 64 --data "$root/docs" > "$build/gpu_check/gpt2-$run.out" 2>&1 || {
      cat "$build/gpu_check/gpt2-$run.out"; return 1; }
    cat "$build/gpu_check/gpt2-$run.out"
    grep -q "sample:" "$build/gpu_check/gpt2-$run.out" || return 1
  done
  "$python" - "$build/gpu_check" <<'PY'
import json, math, sys
for run in ("zero3", "ddp"):
    records = [json.loads(line) for line in open(f"{sys.argv[1]}/gpt2-{run}.jsonl") if line.strip()]
    peak = max((r.get("gpu_process_mem_bytes", 0) for r in records if "rank" in r), default=0)
    steps = [r for r in records if "loss" in r and "tokens_per_s" in r]
    if not steps or not all(math.isfinite(r["loss"]) for r in steps):
        sys.exit(f"gpu_check.sh: gpt2 {run}: no finite loss")
    rate = sorted(r["tokens_per_s"] for r in steps[2:] or steps)[len(steps[2:] or steps) // 2]
    print(f"gpu_check.sh: gpt2 {run}: loss {steps[0]['loss']:.3f} -> {steps[-1]['loss']:.3f}, "
          f"{rate:.0f} tokens/s (median), peak GPU memory {peak / 2**20:.0f} MiB")
PY
}

# ZeRO on CUDA: train_resnet --zero 0, 1, 2 and 3, then 2 and 3 with --offload, on the one GPU,
# launch sampling its memory. At one rank every stage holds what DDP holds (the shard is the
# whole), so the row checks that the sharded path trains on CUDA -- stage 3 swapping each block's
# storage in and out on the device -- and that its peak memory stays within 10 % of DDP's (stage
# 2's buckets, stage 3's gathered block). With --offload the momentum and the float32 master
# copies live in pinned host memory and SGD steps on the CPU: the row prints each run's peak and
# samples/s against DDP's and fails when an offloaded run holds more GPU memory than the same
# stage without offload (the master copy went to the device) or does not train.
zero_peak_memory() {
  local run z flags metrics
  for run in 0 1 2 3 2o 3o; do
    z="${run%o}"
    flags=(--zero "$z")
    [ "$run" != "$z" ] && flags+=(--offload)
    metrics="$build/gpu_check/zero$run.jsonl"
    rm -f "$metrics"
    "$build/launch" --nproc-per-node 1 --sample-interval 0.5 --metrics-file "$metrics" \
      -- "$build/train_resnet" --device cuda "${flags[@]}" --arch resnet50 --synthetic 2048 \
      --data-dir "$build/gpu_check/cifar" --epochs 1 --batch-size 128 --eval-every 0 \
      --log-every 8 > "$build/gpu_check/zero$run.out" 2>&1
    local rc=$?
    cat "$build/gpu_check/zero$run.out"
    [ "$rc" = 0 ] || return 1
  done
  "$python" - "$build/gpu_check" <<'PY'
import json, re, sys
runs = ["0", "1", "2", "3", "2o", "3o"]
peaks, rates = {}, {}
for run in runs:
    records = [json.loads(line) for line in open(f"{sys.argv[1]}/zero{run}.jsonl") if line.strip()]
    peaks[run] = max((r.get("gpu_process_mem_bytes", 0) for r in records if "rank" in r), default=0)
    found = re.findall(r"([0-9.]+) samples/s", open(f"{sys.argv[1]}/zero{run}.out").read())
    rates[run] = float(found[-1]) if found else 0.0
for run in runs:
    name = f"--zero {run[0]}" + (" --offload" if run.endswith("o") else "")
    ddp = f" ({peaks[run] / peaks['0']:.3f}x DDP's" if run != "0" and peaks["0"] else ""
    speed = f", {rates[run] / rates['0']:.2f}x its samples/s)" if ddp and rates["0"] and rates[run] else (")" if ddp else "")
    print(f"gpu_check.sh: {name}: peak GPU memory {peaks[run] / 2**20:.0f} MiB, "
          f"{rates[run]:.0f} samples/s{ddp}{speed}")
bad = [r for r in ("1", "2", "3") if peaks["0"] == 0 or peaks[r] > 1.10 * peaks["0"]]
bad += [r for r in ("2o", "3o") if peaks[r] == 0 or peaks[r] > peaks[r[0]]]
if bad:
    print(f"gpu_check.sh: FAILED: {bad}: --zero above DDP's peak by more than 10 %, an offloaded "
          "run above the same stage without offload, or no samples")
sys.exit(1 if bad else 0)
PY
}

# ---- The chosen rows -------------------------------------------------------------------------
chosen=()
for i in "${!row_names[@]}"; do
  if [ -z "$only_rows" ] || [ "$i" = 0 ] || [[ ",$only_rows," == *",${row_names[$i]},"* ]]; then
    chosen+=("$i")
  fi
done
if [ -n "$only_rows" ]; then
  for name in ${only_rows//,/ }; do
    [[ " ${row_names[*]} " == *" $name "* ]] ||
      { echo "gpu_check.sh: --rows: no row named $name (rows: ${row_names[*]})" >&2; exit 2; }
  done
fi
build_targets=""
for i in "${chosen[@]}"; do build_targets+=" ${row_targets[$i]}"; done

# ---- Inputs, checked before anything is configured -------------------------------------------
for f in CMakeLists.txt tests/comm/nccl/nccl.cmake benchmarks/allreduce/allreduce_bench.cpp \
         benchmarks/train/train_bench.cpp benchmarks/train/train_peer.py scripts/gpu_deps.sh; do
  [ -e "$root/$f" ] || { say "error: $f is missing from the source tree" >&2; exit 1; }
done

say "1. libtorch from $python"
torch_version="" torch_cuda="" torch_abi="" torch_prefix="" site=""
if command -v "$python" >/dev/null 2>&1; then
  # One import of torch (seconds) answers every question.
  answers="$("$python" - 2>/dev/null <<'PY' || true
import os, torch
print("version", torch.__version__)
print("cuda", torch.version.cuda or "")
print("abi", int(bool(torch.compiled_with_cxx11_abi())))
print("prefix", torch.utils.cmake_prefix_path)
print("site", os.path.dirname(os.path.dirname(torch.__file__)))
PY
)"
  answer() { awk -v k="$1" '$1 == k { sub(/^[^ ]+ /, ""); print; exit }' <<<"$answers"; }
  torch_version="$(answer version)"; torch_cuda="$(answer cuda)"; torch_abi="$(answer abi)"
  torch_prefix="$(answer prefix)"; site="$(answer site)"
fi
if [ -z "$torch_version" ]; then
  refuse "$python cannot import torch (pip install torch with CUDA, or --python PATH)"
else
  say "   torch $torch_version, CUDA ${torch_cuda:-none}, C++11 ABI ${torch_abi}," \
      "CMake prefix $torch_prefix"
  IFS=. read -r tmaj tmin _ <<<"${torch_version%%+*}"
  tmin="${tmin%%[!0-9]*}"
  [[ "$tmin" =~ ^[0-9]+$ ]] || tmin=-1
  if ! { [ "$tmaj" = 2 ] && [ "$tmin" -ge "$torch_min2" ] && [ "$tmin" -le "$torch_max2" ]; }; then
    refuse "torch $torch_version is not a version dtrain supports" \
           "(2.$torch_min2 - 2.$torch_max2; docs/design.md#libraries)"
  fi
  [ -n "$torch_cuda" ] || refuse "the torch of $python is a CPU build (torch.version.cuda is None)"
  [ "$torch_abi" = 1 ] ||
    refuse "torch $torch_version was built with the pre-C++11 ABI" \
           "(torch.compiled_with_cxx11_abi() is False): dtrain and its dependencies use the C++11" \
           "ABI and would not link against it (HINT: pip's torch uses the C++11 ABI from 2.7 on)"
fi

say "2. NCCL"
nccl_root="${NCCL_ROOT:-}"
[ -n "$site" ] && [ -f "$site/nvidia/nccl/include/nccl.h" ] && nccl_root="$site/nvidia/nccl"
if [ -n "$nccl_root" ]; then say "   NCCL_ROOT=$nccl_root"
else say "   no nvidia-nccl wheel beside torch, no NCCL_ROOT: CMake looks in the CUDA toolkit"; fi

say "3. CUDA compiler"
nvcc="${CUDACXX:-}"
[ -z "$nvcc" ] && nvcc="$(command -v nvcc || true)"
for candidate in "${CUDAToolkit_ROOT:-/nonexistent}/bin/nvcc" /usr/local/cuda/bin/nvcc; do
  [ -z "$nvcc" ] && [ -x "$candidate" ] && nvcc="$candidate"
done
cuda_root=""
if [ -z "$nvcc" ]; then
  refuse "no nvcc (CUDACXX, PATH, CUDAToolkit_ROOT/bin, /usr/local/cuda/bin):" \
         "libtorch's CMake package compiles with it"
else
  cuda_root="$(cd "$(dirname "$(readlink -f "$nvcc")")/.." && pwd)"  # nvcc may be a link
  nvcc_version="$("$nvcc" --version 2>/dev/null |
                  sed -n 's/.*release \([0-9][0-9.]*\).*/\1/p' | head -n1)"
  say "   nvcc $nvcc_version ($nvcc), toolkit $cuda_root"
  if [ -n "$torch_cuda" ] && [ "${nvcc_version%%.*}" != "${torch_cuda%%.*}" ]; then
    refuse "nvcc $nvcc_version ($nvcc) and torch.version.cuda $torch_cuda are different CUDA" \
           "major versions (HINT: put a CUDA ${torch_cuda%%.*} nvcc first on PATH, or set CUDACXX)"
  fi
fi

say "4. small dependencies from $deps"
if [ -d "$deps/usr" ]; then
  say "   found $(ls "$deps/usr/include" 2>/dev/null | wc -l) include entries"
else
  refuse "$deps/usr does not exist: run scripts/gpu_deps.sh on a Debian machine and copy .deps" \
         "along"
fi
command -v cmake >/dev/null 2>&1 || refuse "cmake (>= 3.22) is not on PATH (pip install cmake)"
command -v ninja >/dev/null 2>&1 || refuse "ninja is not on PATH (pip install ninja)"

export LD_LIBRARY_PATH="$deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
[ -n "$nccl_root" ] && export LD_LIBRARY_PATH="$nccl_root/lib:$LD_LIBRARY_PATH"
# The GPU's architecture spares libtorch's CMake package a probe compile.
if [ -z "${TORCH_CUDA_ARCH_LIST:-}" ] && command -v nvidia-smi >/dev/null 2>&1; then
  TORCH_CUDA_ARCH_LIST="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null |
                          head -n1 || true)"
  [ -n "$TORCH_CUDA_ARCH_LIST" ] && export TORCH_CUDA_ARCH_LIST
fi
cmake_args=(-S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
            "-DDTRAIN_LIBTORCH=${torch_prefix%/share/cmake}" "-DCMAKE_PREFIX_PATH=$deps/usr"
            ${nccl_root:+"-DNCCL_ROOT=$nccl_root"}
            ${nvcc:+"-DCMAKE_CUDA_COMPILER=$nvcc"} ${cuda_root:+"-DCUDAToolkit_ROOT=$cuda_root"}
            ${cuda_root:+"-DCUDA_TOOLKIT_ROOT_DIR=$cuda_root"}
            -DDTRAIN_WITH_GLOO=OFF -DDTRAIN_WITH_EXAMPLES=ON -DDTRAIN_WITH_TESTS=ON
            -DDTRAIN_WITH_BENCHMARKS=ON)

# ---- The script against an existing build (--check-build) ------------------------------------
help_lists() {  # help_lists HELP FLAG: the --help text names FLAG as an option
  grep -qE -- "(^|[[:space:][])$2([][:space:]=,]|$)" <<<"$1"
}
check_against_build() {
  local dir="$1" bad=0 i t exe a help
  if [ ! -f "$dir/gpu_test_targets.txt" ]; then
    say "error: $dir has no gpu_test_targets.txt (CMake lists the gpu tests' targets there)"; bad=1
  fi
  for i in "${chosen[@]}"; do
    for t in $(expand_targets "$dir" "${row_targets[$i]}"); do
      [ -x "$dir/$t" ] || { say "error: $dir has no $t, which row ${row_names[$i]} needs"; bad=1; }
    done
    eval "local -a cmd=(${row_cmds[$i]})"
    exe="${cmd[0]}"
    [[ "$exe" == "$build"/* ]] || continue
    exe="$dir/${exe#"$build"/}"
    [ -x "$exe" ] || continue
    help="$("$exe" --help 2>&1 || true)"
    for a in "${cmd[@]:1}"; do
      case "$a" in
        --*) help_lists "$help" "$a" || {
               say "error: $(basename "$exe") takes no $a (see $exe --help; row ${row_names[$i]})"
               bad=1; } ;;
      esac
    done
  done
  if ! grep -q 'Test *#' <<<"$(ctest --test-dir "$dir" -N -L gpu 2>/dev/null || true)"; then
    say "error: no test labelled gpu in $dir (ctest -L gpu runs nothing)"; bad=1
  fi
  [ "$bad" = 0 ] && say "check-build: every row's targets, benchmark flags, gpu tests are in $dir"
  return "$bad"
}

# ---- Run -------------------------------------------------------------------------------------
say "5. rows, in priority order, within a budget of $budget s"
for i in "${chosen[@]}"; do
  say "   ${row_names[$i]} (limit ${row_limits[$i]} s;" \
      "needs ${row_targets[$i]:-what the rows below need}): ${row_shown[$i]}"
done
if [ "$dry" = 1 ]; then
  say "   build: cmake $(printf '%q ' "${cmake_args[@]}")"
  say "   build: cmake --build $build -j $jobs --target" \
      "$(expand_targets "$build" "$build_targets")-- -k 0"
  say "   (@gpu-tests: the targets CMake lists in $build/gpu_test_targets.txt once configured)"
  say "dry run: ${#chosen[@]} rows printed, $problems input(s) missing on this machine"
  if [ -n "$check_build" ]; then
    check_against_build "$check_build" || exit 1
    exit 0
  fi
  [ "$problems" = 0 ] || exit 3
  exit 0
fi

mkdir -p "$logdir"
rm -f "$logdir/configured"
statuses=()
summary() {  # also in BUILD/gpu_check/summary.txt
  {
    say "summary (budget $budget s for the rows, $((SECONDS - rows_start)) s used;" \
        "$rows_start s of checks before them):"
    local i
    for i in "${!statuses[@]}"; do say "  ${statuses[$i]}"; done
    say "  logs: $logdir/<row>.log"
  } | tee "$logdir/summary.txt"
}
rows_start=$SECONDS  # the budget counts from here: the checks above take seconds (importing torch)
trap summary EXIT
trap 'statuses+=("interrupted (signal)"); exit 130' INT TERM
ran_out=0
failed=0
for i in "${chosen[@]}"; do
  name="${row_names[$i]}"
  left=$((budget - (SECONDS - rows_start)))
  if [ "$left" -lt 5 ]; then
    statuses+=("$(printf '%-12s not run: the budget is spent' "$name")"); ran_out=1; continue
  fi
  missing=""
  if [ "$i" != 0 ]; then
    [ -f "$logdir/configured" ] ||
      missing="the build row did not configure a build with a CUDA libtorch and NCCL"
    for t in $(expand_targets "$build" "${row_targets[$i]}"); do
      [ -n "$missing" ] && break
      if [ "$t" = "@gpu-tests" ] || [ ! -x "$build/$t" ] ||
         ! cmake --build "$build" --target "$t" -- -n 2>/dev/null | grep -q "no work to do"; then
        missing="$t was not built"
      fi
    done
  fi
  if [ -n "$missing" ]; then
    statuses+=("$(printf '%-12s skipped: %s' "$name" "$missing")"); failed=1; continue
  fi
  limit="${row_limits[$i]}"
  why="its limit"
  if [ "$limit" -gt "$left" ]; then limit=$left; why="the budget left"; fi
  script="$logdir/$name.sh"
  {
    echo "# gpu_check.sh row $name: rerun with bash $script"
    echo "set -uo pipefail"
    declare -p root build python jobs deps site nccl_root nvcc cuda_root torch_version torch_cuda \
               logdir cmake_args build_targets LD_LIBRARY_PATH
    declare -f  # every function of this script: a row may call any
    echo "${row_cmds[$i]}"
  } >"$script"
  say "== $name: up to $limit s ($why): ${row_shown[$i]}"
  t0=$SECONDS
  set +e
  timeout -k 10 "$limit" bash "$script" 2>&1 | tee "$logdir/$name.log"
  rc=${PIPESTATUS[0]}
  set -e
  took=$((SECONDS - t0))
  if [ "$rc" = 0 ]; then result="ok"
  elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    result="TIMEOUT: stopped at $limit s ($why)"; failed=1
  else result="FAILED (exit $rc)"; failed=1; fi
  statuses+=("$(printf '%-12s %4d s  %s' "$name" "$took" "$result")")
done
[ "$failed" = 0 ] || exit 1
[ "$ran_out" = 0 ] || exit 4
exit 0
