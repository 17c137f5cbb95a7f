#!/usr/bin/env bash
# The Debian packages of the build (cmake/package.cmake), checked without installing them on this
# machine: `cpack -G DEB` builds dtrain and dtrain-dev; their control fields say what they must
# (the runtime's dependencies from dpkg-shlibdeps: Debian's libtorch runtime library when built
# against it, none for a pip wheel's, whose folder the libraries' RUNPATH names instead; never a -dev
# package; the -dev package depends on the runtime of its version); `apt-get install --simulate`
# of the two .deb files resolves every dependency from this machine's package lists;
# `dpkg-deb -x` unpacks both into a temporary root, whose launch runs a two-rank job of its
# train_linear with nothing of the build tree on any path, then (as root, where network namespaces
# and sshd are at hand) a job of it over two nodes of scripts/netns-cluster.sh, fanned out over
# ssh with the unpacked launch on both; and the installed-package consumer (tests/consumer) builds
# against that root's -dev files and runs.
# Usage: deb_package_test.sh <build-dir> <source-dir>
set -euo pipefail
build="$(cd "$1" && pwd)"
src="$(cd "$2" && pwd)"
# Not under /tmp: the simulated nodes below each have a /tmp of their own.
scratch="$(mktemp -d -p /var/tmp dtrain-deb.XXXXXX)"
cluster=""
cleanup() {
  [ -z "$cluster" ] || bash "$src/scripts/netns-cluster.sh" down "$cluster" >/dev/null 2>&1 || true
  rm -rf "$scratch"
}
trap cleanup EXIT
fail() { echo "deb_package_test: FAIL: $*" >&2; exit 1; }

for tool in cpack dpkg-deb dpkg-shlibdeps apt-get; do
  command -v "$tool" >/dev/null ||
    fail "$tool is missing (HINT: scripts/setup.sh installs dpkg-dev, file and cmake)"
done

# 1. Build the packages (from the build's own CPack configuration, into the scratch directory).
cpack --config "$build/CPackConfig.cmake" -G DEB -B "$scratch/pkg" >"$scratch/cpack.log" 2>&1 ||
  { cat "$scratch/cpack.log"; fail "cpack -G DEB failed"; }
runtime=("$scratch"/pkg/dtrain_*.deb)
dev=("$scratch"/pkg/dtrain-dev_*.deb)
[[ -f "${runtime[0]}" && -f "${dev[0]}" ]] ||
  { ls -l "$scratch/pkg"; fail "no dtrain / dtrain-dev .deb"; }
echo "deb_package_test: built $(cd "$scratch/pkg" && ls ./*.deb | tr '\n' ' ')"

# 2. Their control fields.
field() { dpkg-deb -f "$1" "$2"; }
version="$(field "${runtime[0]}" Version)"
depends="$(field "${runtime[0]}" Depends)"
echo "deb_package_test: dtrain $version Depends: $depends"
[[ "$depends" == *libc6* ]] ||
  fail "the runtime's Depends has no libc6: not from dpkg-shlibdeps? ($depends)"
# A libtorch from a pip wheel or zip (DTRAIN_LIBTORCH) belongs to no package: the installed
# libraries name its folder in their RUNPATH instead (checked once unpacked, below).
libtorch_root="$(sed -n 's/^DTRAIN_LIBTORCH:PATH=//p' "$build/CMakeCache.txt")"
if grep -q '^#define DTRAIN_WITH_TORCH 1' "$build/generated/dtrain/config.h"; then
  if [ -z "$libtorch_root" ]; then
    [[ "$depends" =~ libtorch[0-9] ]] ||
      fail "libdtrain links libtorch, but Depends names no libtorch runtime ($depends)"
  elif [[ "$depends" =~ libtorch ]]; then
    fail "libdtrain links the libtorch of $libtorch_root, which no package owns, but Depends names one ($depends)"
  fi
fi
if grep -qE '(^|[ ,])[a-z0-9.+-]+-dev([ ,(]|$)' <<<"$depends"; then
  fail "the runtime package depends on a -dev package ($depends): a worker node would pull it"
fi
dev_depends="$(field "${dev[0]}" Depends)"
echo "deb_package_test: dtrain-dev Depends: $dev_depends"
[[ "$dev_depends" == *"dtrain (= $version)"* ]] ||
  fail "dtrain-dev does not depend on dtrain (= $version)"

# 3. What each holds: the runtime no headers, the -dev package no programs or real libraries.
dpkg-deb -c "${runtime[0]}" | awk '{print $6}' >"$scratch/runtime.list"
dpkg-deb -c "${dev[0]}" | awk '{print $6}' >"$scratch/dev.list"
for want in ./usr/bin/launch ./usr/bin/checkpoint ./usr/share/dtrain/prometheus/dtrain-alerts.yml \
            ./usr/share/dtrain/grafana/dtrain.json; do
  grep -qxF "$want" "$scratch/runtime.list" || fail "the runtime package lacks $want"
done
for lib in dtrain_base dtrain_comm; do
  grep -qE "/lib$lib\.so\.[0-9]+\.[0-9]+\.[0-9]+$" "$scratch/runtime.list" ||
    fail "the runtime package lacks lib$lib.so.<version>"
done
grep -q '/include/' "$scratch/runtime.list" && fail "the runtime package holds headers"
grep -q '/include/dtrain/base/tensorboard.h$' "$scratch/dev.list" ||
  fail "dtrain-dev lacks the headers"
grep -q '/cmake/dtrain/dtrainConfig.cmake$' "$scratch/dev.list" ||
  fail "dtrain-dev lacks dtrainConfig.cmake"
grep -qE '/bin/|\.so\.[0-9]' "$scratch/dev.list" && fail "dtrain-dev holds programs or libraries"

# 4. Would apt install them here? Every dependency resolves from the package lists.
apt-get install --simulate --no-install-recommends "${runtime[0]}" "${dev[0]}" \
  >"$scratch/apt.log" 2>&1 || { cat "$scratch/apt.log"; fail "apt-get install --simulate failed"; }
grep -qE '^(Inst|Conf) dtrain ' "$scratch/apt.log" ||
  { cat "$scratch/apt.log"; fail "apt would not install dtrain"; }
echo "deb_package_test: apt-get install --simulate: ok" \
     "($(grep -c '^Inst ' "$scratch/apt.log") to install)"

# 5. Unpacked into a root of its own: launch and a sample trainer run from it alone.
root="$scratch/root"
dpkg-deb -x "${runtime[0]}" "$root"
dpkg-deb -x "${dev[0]}" "$root"
"$root/usr/bin/launch" --version | grep -q "launch (dtrain)" ||
  fail "the unpacked launch does not run"
if ldd "$root/usr/bin/launch" | grep -F "$build"; then
  fail "the unpacked launch loads libraries of the build tree"
fi
if [ -n "$libtorch_root" ] && grep -q '^#define DTRAIN_WITH_TORCH 1' "$build/generated/dtrain/config.h"; then
  library="$(find "$root/usr/lib" -name 'libdtrain.so.*.*' | head -n1)"
  readelf -d "$library" | grep -E 'RUNPATH|RPATH' | grep -qF "$libtorch_root/lib" ||
    fail "the unpacked libdtrain's RUNPATH does not name $libtorch_root/lib: $(readelf -d "$library" | grep -E 'RUNPATH|RPATH')"
fi
trainer="$root/usr/libexec/dtrain/train_linear"
source "$src/tests/scripts/nccl_library_path.sh"
if [[ -x "$trainer" ]]; then
  out="$(cd "$scratch" && "$root/usr/bin/launch" --nproc-per-node 2 "$trainer" --epochs 1 2>&1)" ||
    { echo "$out"; fail "the unpacked launch could not run the unpacked train_linear"; }
  grep -q "over 2 ranks" <<<"$out" ||
    { echo "$out"; fail "no epoch line from the unpacked train_linear"; }
  if ldd "$trainer" | grep -F "$build"; then
    fail "the unpacked train_linear loads libraries of the build tree"
  fi
fi

# 5b. Two nodes, from the unpacked files alone: launch fans out over ssh into two network
# namespaces and runs the unpacked launch and train_linear on each (the same path on every node).
if [[ -x "$trainer" ]] && [ "$(id -u)" = 0 ] && [ -x /usr/sbin/sshd ] && command -v ip >/dev/null; then
  cluster="deb$(( $$ % 100000 ))"
  state="$(bash "$src/scripts/netns-cluster.sh" up 2 "$cluster" 2>"$scratch/cluster.log")" ||
    { cat "$scratch/cluster.log"; fail "scripts/netns-cluster.sh up 2 failed"; }
  # shellcheck disable=SC1091
  source "$state/env"
  port="$(python3 -c 'import socket, sys; s = socket.socket(); s.bind((sys.argv[1], 0)); print(s.getsockname()[1])' "$CLUSTER_BRIDGE_IP")"
  out="$(cd "$CLUSTER_WORK" &&
         "$root/usr/bin/launch" --hosts "${CLUSTER_HOSTS// /,}" --ssh-config "$CLUSTER_SSH_CONFIG" \
           --rdzv-endpoint "$CLUSTER_BRIDGE_IP:$port" --nproc-per-node 1 --rdzv-timeout 30 \
           "$trainer" --epochs 1 2>&1)" ||
    { echo "$out"; fail "the unpacked launch could not run the unpacked train_linear on two nodes"; }
  # One rank per node: two ranks are the two nodes.
  grep -q "^\[node0 rank0\]: epoch 0: .* over 2 ranks" <<<"$out" ||
    { echo "$out"; fail "no epoch line over 2 ranks from the two-node job"; }
  echo "deb_package_test: a two-node job of the unpacked launch and train_linear: ok"
  bash "$src/scripts/netns-cluster.sh" down "$cluster" >/dev/null 2>&1 || true
  cluster=""
else
  echo "deb_package_test: the two-node job is not run (needs root, sshd and ip for network namespaces)"
fi

# 6. The installed-package consumer, built against the unpacked -dev files.
generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
cmake -S "$src/tests/consumer" -B "$scratch/consumer" "${generator[@]}" \
  -DCMAKE_PREFIX_PATH="$root/usr" -DCMAKE_BUILD_TYPE=Release >"$scratch/consumer.log" 2>&1 ||
  { cat "$scratch/consumer.log"; fail "the consumer does not configure against the unpacked -dev"; }
grep -q "$root/usr/lib/cmake/dtrain" "$scratch/consumer/CMakeCache.txt" ||
  fail "the consumer found another dtrain than the unpacked one"
cmake --build "$scratch/consumer" >>"$scratch/consumer.log" 2>&1 ||
  { cat "$scratch/consumer.log"; fail "the consumer does not build against the unpacked -dev"; }
"$scratch/consumer/consumer" | grep -q "store says world" || fail "the consumer does not run"
echo "deb_package_test: ok"
