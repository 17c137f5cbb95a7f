#!/usr/bin/env bash
# Prepares the small build dependencies of scripts/gpu_check.sh for a GPU machine that has a CUDA
# libtorch (pip torch) and the CUDA toolkit but no Debian development packages and possibly no
# network: downloads the Debian packages (no root needed) and unpacks them with `dpkg -x` into a
# folder that gpu_check.sh puts on CMAKE_PREFIX_PATH and LD_LIBRARY_PATH. Run it here, on a
# Debian 12 machine with apt; copy the folder along with the source tree.
#
#   scripts/gpu_deps.sh [DIR]        (default: .deps in the source tree, git-ignored)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="${1:-$root/.deps}"

# Header-only or small libraries, with the runtime libraries the -dev packages link to.
packages=(
  libfmt-dev libfmt9
  libcxxopts-dev
  nlohmann-json3-dev
  libuv1-dev libuv1
  libxxhash-dev libxxhash0
  libgtest-dev libgmock-dev
  libssl-dev libssl3
  libcpp-httplib-dev libcpp-httplib0.11 libbrotli1
  libisal-dev libisal2
)

command -v apt-get >/dev/null && command -v dpkg >/dev/null || {
  echo "gpu_deps.sh: needs apt-get and dpkg (a Debian or Ubuntu machine)" >&2
  exit 1
}
mkdir -p "$dir/debs" "$dir/root"
cd "$dir/debs"
echo "gpu_deps.sh: downloading ${#packages[@]} packages into $dir/debs"
# As root, apt drops to its sandbox user, which cannot write here; downloads need no sandbox.
apt-get download -o APT::Sandbox::User=root "${packages[@]}" >/dev/null
for deb in ./*.deb; do
  dpkg -x "$deb" "$dir/root"
done
# What no build reads: documentation, and OpenSSL's static archives (dtrain links libcrypto.so).
# Halves what travels to the GPU machine (27 MB -> 13 MB).
rm -rf "$dir/root/usr/share/doc" "$dir/root/usr/share/man"
rm -f "$dir"/root/usr/lib/*/libcrypto.a "$dir"/root/usr/lib/*/libssl.a
echo "gpu_deps.sh: unpacked into $dir/root ($(du -sh "$dir/root" | cut -f1)); pass it to"
echo "  scripts/gpu_check.sh --deps $dir/root"
