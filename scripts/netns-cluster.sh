#!/usr/bin/env bash
# A simulated cluster on this machine, for the e2e tests and benchmarks of multi-node launch.
#
#   netns-cluster.sh up N [NAME]        N hosts NAME-0 .. NAME-(N-1); prints the state directory
#   netns-cluster.sh down [NAME]        removes everything of NAME (also after a failed test)
#   netns-cluster.sh exec NAME K CMD... runs CMD on host K (its network and mount namespace)
#   netns-cluster.sh kill NAME K        SIGKILLs every process on host K (sshd included)
#   netns-cluster.sh link NAME K up|down  takes host K's cable out (a silent partition) or back
#
# Each host is a network namespace on a bridge (NAME-br, in this namespace, which also gets an
# address: the "login host" outside the cluster), with its own sshd (a host key and an authorized
# key made per run) started in a mount namespace of its own with a private /tmp, /dev/shm and
# work directory ($STATE/work: the same path on every host, a different directory behind it), so
# "no shared filesystem" is real there. Clients use $STATE/ssh_config (through --ssh-config):
# BatchMode, StrictHostKeyChecking yes, its own known_hosts. sshd keeps Debian's default
# AcceptEnv (LANG LC_*), so nothing may depend on SendEnv. Addresses: 10.231.S.0/24 with S picked
# from NAME (the bridge .254, host K .K+1); only these and loopback are used. Needs root.
#
# The state directory ($DTRAIN_CLUSTER_ROOT, default /var/tmp, + /dtrain-cluster-NAME; not under
# /tmp, which every host replaces) holds: env (shell variables: CLUSTER_HOSTS, CLUSTER_BRIDGE_IP,
# CLUSTER_SSH_CONFIG, ...), hosts (one address a line), ssh_config, known_hosts, keys, logs.
set -euo pipefail

die() { echo "netns-cluster.sh: $*" >&2; exit 1; }

name_of() {
  local name="${1:-dtc}"
  [[ "$name" =~ ^[a-z][a-z0-9]{0,7}$ ]] || die "cluster name \"$name\": 1-8 of [a-z0-9], a letter first"
  echo "$name"
}

state_of() { echo "${DTRAIN_CLUSTER_ROOT:-/var/tmp}/dtrain-cluster-$1"; }

require_root() {
  [ "$(id -u)" = 0 ] || die "needs root (network namespaces, bridges, sshd)"
  command -v ip >/dev/null || die "ip (iproute2) not found"
  [ -x /usr/sbin/sshd ] || die "/usr/sbin/sshd (openssh-server) not found"
}

# A process in the host's namespaces (its sshd and every session share them).
holder_pid() {
  local state="$1" k="$2"
  [ -f "$state/host$k/holder.pid" ] && cat "$state/host$k/holder.pid"
}

cmd_down() {
  local name state
  name="$(name_of "${1:-}")"
  state="$(state_of "$name")"
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${name}-[0-9]+$" || true); do
    # Everything running in the namespace (sshd, agents, workers), then the namespace.
    for pid in $(ip netns pids "$ns" 2>/dev/null || true); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
  for link in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' |
                grep -E "^${name}-(br|v[0-9]+)$" || true); do
    ip link del "$link" 2>/dev/null || true
  done
  rm -rf "$state"
}

cmd_up() {
  local n="${1:-}" name state subnet
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 32 ] || die "up N: N must be 1..32"
  name="$(name_of "${2:-}")"
  require_root
  # One `up` at a time picks a subnet and creates links (parallel tests). The hosts' daemons do
  # not inherit the lock (9>&- below).
  exec 9>"${DTRAIN_CLUSTER_ROOT:-/var/tmp}/dtrain-cluster.lock"
  flock 9
  cmd_down "$name"
  state="$(state_of "$name")"
  mkdir -p "$state/work"
  echo "${DTRAIN_CLUSTER_OWNER:-$PPID}" > "$state/owner"
  # A /24 of its own: 10.231.S.0, S from the name, moved on while another cluster holds it.
  local s=$(( $(echo -n "$name" | cksum | cut -d' ' -f1) % 250 + 1 ))
  for _ in $(seq 250); do
    ip -o -4 addr show | grep -q " 10\.231\.$s\." || break
    s=$(( s % 250 + 1 ))
  done
  subnet="10.231.$s"

  ip link add "$name-br" type bridge
  ip addr add "$subnet.254/24" dev "$name-br"
  ip link set "$name-br" up

  ssh-keygen -q -t ed25519 -N '' -C "$name-host" -f "$state/host_key"
  ssh-keygen -q -t ed25519 -N '' -C "$name-client" -f "$state/id_ed25519"
  cp "$state/id_ed25519.pub" "$state/authorized_keys"
  chmod 600 "$state/authorized_keys"
  mkdir -p /run/sshd
  : > "$state/known_hosts"
  : > "$state/hosts"

  local repo keep=""
  repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
  case "$repo/" in /tmp/*) keep="$repo" ;; esac
  for k in $(seq 0 $((n - 1))); do
    local ns="$name-$k" ip="$subnet.$((k + 1))" h="$state/host$k"
    mkdir -p "$h/work"
    ip netns add "$ns"
    ip link add "$name-v$k" type veth peer name eth0 netns "$ns"
    ip link set "$name-v$k" master "$name-br" up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add "$ip/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" route add default via "$subnet.254"
    cat > "$h/sshd_config" <<EOF
ListenAddress $ip
Port 22
HostKey $state/host_key
AuthorizedKeysFile $state/authorized_keys
PidFile $h/sshd.pid
StrictModes no
UsePAM no
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
AcceptEnv LANG LC_*
LogLevel ERROR
MaxStartups 100:30:200
EOF
    # A mount namespace of its own: private /tmp, /dev/shm and work directory; the login
    # account's ~/.bashrc is Debian's default (/etc/skel), as on a freshly installed host -- bash
    # reads it for every ssh command, and this machine's own may take seconds (pyenv init).
    # A checkout under /tmp (a CI runner's, say) stays visible on every host, as it is when it
    # lies elsewhere: it is set aside before /tmp is replaced and moved back into the new one.
    ip netns exec "$ns" unshare --mount --propagation private /bin/sh -c '
      if [ -n "$7" ]; then mkdir -p "$8" && mount --bind "$7" "$8" || exit 1; fi
      mount -t tmpfs -o mode=1777 tmpfs /tmp &&
      mount -t tmpfs -o mode=1777 tmpfs /dev/shm &&
      mount --bind "$1" "$2" || exit 1
      if [ -n "$7" ]; then mkdir -p "$7" && mount --move "$8" "$7" || exit 1; fi
      if [ -f "$6/.bashrc" ]; then
        mount --bind "$(if [ -f /etc/skel/.bashrc ]; then echo /etc/skel/.bashrc; else echo /dev/null; fi)" "$6/.bashrc" || exit 1
      fi
      # Holds the host'"'"'s namespaces for `exec` while its sshd may be stopped by a test.
      sleep infinity </dev/null >/dev/null 2>&1 &
      echo $! > "$5"
      exec /usr/sbin/sshd -f "$3" -E "$4"' sh "$h/work" "$state/work" "$h/sshd_config" "$h/sshd.log" \
      "$h/holder.pid" "$(getent passwd root | cut -d: -f6)" "$keep" "$h/checkout" 9>&-
    echo "$ip $(cut -d' ' -f1,2 "$state/host_key.pub")" >> "$state/known_hosts"
    echo "$ip" >> "$state/hosts"
  done

  cat > "$state/ssh_config" <<EOF
Host *
  User root
  IdentityFile $state/id_ed25519
  IdentitiesOnly yes
  UserKnownHostsFile $state/known_hosts
  GlobalKnownHostsFile /dev/null
  StrictHostKeyChecking yes
  BatchMode yes
  ConnectTimeout 3
  ServerAliveInterval 1
  ServerAliveCountMax 3
  LogLevel ERROR
EOF

  # Wait until every sshd answers.
  for k in $(seq 0 $((n - 1))); do
    local ok=0
    for _ in $(seq 100); do
      if ssh -F "$state/ssh_config" "$subnet.$((k + 1))" true 2>/dev/null; then ok=1; break; fi
      sleep 0.05
    done
    [ "$ok" = 1 ] || { cat "$state/host$k/sshd.log" >&2 || true; die "sshd on $name-$k did not answer"; }
  done

  {
    echo "CLUSTER_NAME=$name"
    echo "CLUSTER_DIR=$state"
    echo "CLUSTER_WORK=$state/work"
    echo "CLUSTER_SSH_CONFIG=$state/ssh_config"
    echo "CLUSTER_BRIDGE_IP=$subnet.254"
    echo "CLUSTER_HOSTS=\"$(tr '\n' ' ' < "$state/hosts" | sed 's/ $//')\""
  } > "$state/env"
  echo "$state"
}

cmd_exec() {
  local name state k pid
  name="$(name_of "${1:-}")"
  k="${2:-}"
  shift 2 || die "exec NAME K CMD..."
  state="$(state_of "$name")"
  pid="$(holder_pid "$state" "$k")" || die "no host $k in cluster $name"
  exec nsenter --target "$pid" --net --mount -- "$@"
}

cmd_kill() {
  local name k
  name="$(name_of "${1:-}")"
  k="${2:-}"
  for pid in $(ip netns pids "$name-$k" 2>/dev/null || true); do kill -9 "$pid" 2>/dev/null || true; done
}

cmd_link() {
  local name k state
  name="$(name_of "${1:-}")"
  k="${2:-}"
  state="${3:-}"
  [ "$state" = up ] || [ "$state" = down ] || die "link NAME K up|down"
  [ -n "$k" ] || die "link NAME K up|down"
  ip link set "$name-v$k" "$state"
}

case "${1:-}" in
  up) shift; cmd_up "$@" ;;
  down) shift; cmd_down "$@" ;;
  exec) shift; cmd_exec "$@" ;;
  kill) shift; cmd_kill "$@" ;;
  link) shift; cmd_link "$@" ;;
  *) sed -n '2,8p' "$0" >&2; exit 2 ;;
esac
