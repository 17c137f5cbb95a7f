#!/usr/bin/env bash
# Installs the build tree into a scratch prefix, then builds and runs a tiny out-of-tree program
# that does find_package(dtrain) and links dtrain::dtrain; checks the installed launch runs.
# Usage: install_test.sh <build-dir> <source-dir>
set -euo pipefail
build="$1"
src="$2"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT

cmake --install "$build" --prefix "$scratch/prefix" >/dev/null
source "$src/tests/scripts/nccl_library_path.sh"
generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
cmake -S "$src/tests/consumer" -B "$scratch/consumer" "${generator[@]}" \
  -DCMAKE_PREFIX_PATH="$scratch/prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$scratch/consumer" >/dev/null

out="$("$scratch/consumer/consumer")"
echo "$out"
grep -q "store says world" <<<"$out"
version="$("$scratch/prefix/bin/launch" --version)"
echo "$version"
grep -q "launch (dtrain)" <<<"$version"
# The installed tree holds the package files and headers a user needs.
test -f "$scratch/prefix/include/dtrain/config.h"
for dir in base comm torch; do test -d "$scratch/prefix/include/dtrain/$dir"; done
# Internal headers stay out of the installed set; fault injection (fault.h) is a test seam.
for internal in env_contract.h torch_compat.h fault.h collective_faults.h; do
  if find "$scratch/prefix/include" -name "$internal" | grep -q .; then
    echo "install_test: internal header $internal was installed" >&2
    exit 1
  fi
done
ls "$scratch"/prefix/lib*/cmake/dtrain/dtrainConfig.cmake >/dev/null
echo "install_test: ok"
