#!/usr/bin/env bash
# Installs what is missing, builds, and launches a real multi-process training run.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD_DIR:-$root/build}"

"$root/scripts/setup.sh"
generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
[ -f "$build/CMakeCache.txt" ] || cmake -S "$root" -B "$build" "${generator[@]}" >/dev/null
cmake --build "$build" -j "$(nproc)"

echo "demo.sh: built; the launcher cannot start a job yet (see the README's status)."
