# Sourced by the package and install tests: NCCL from a pip wheel belongs to no package, so a
# program linked against the installed libraries finds it on the loader's path, as
# docs/building.md says (a toolkit's NCCL in the loader's configuration needs nothing). Reads the
# build's CMake cache ($build).
nccl="$(sed -n 's/^NCCL_LIBRARY:[A-Z]*=//p' "$build/CMakeCache.txt")"
if [[ -n "$nccl" && "$nccl" != *NOTFOUND && -f "$nccl" ]] && ! ldconfig -p | grep -qF "$nccl"; then
  export LD_LIBRARY_PATH="$(dirname "$nccl")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
