#!/usr/bin/env bash
# Installs the Debian packages listed in scripts/packages.txt that are not installed yet, then
# the project's Python environment (.venv, pinned in scripts/requirements.txt) and the CPU-only
# libtorch of CI's second configuration (.venv-cpu, scripts/requirements-cpu.txt). Idempotent;
# quiet when everything is present. Needs root or sudo when a package is missing.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
list="$here/packages.txt"

# A Python environment: made again only when its requirements file changed since (its copy in
# the environment says what it holds). pip takes the wheels from the local disk it is set up to
# read; a pip that would download several GB of PyTorch is what the pins prevent.
setup_venv() {  # setup_venv VENV REQUIREMENTS
  local venv="$root/$1" requirements="$here/$2" python="${DTRAIN_VENV_PYTHON:-python3}" log
  if cmp -s "$requirements" "$venv/requirements.txt" 2>/dev/null; then
    return 0
  fi
  if ! "$python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
    echo "setup.sh: the Python environment needs Python 3.11 (the local PyTorch wheels are" \
         "cp311); '$python' is $("$python" --version 2>&1 || echo missing)." \
         "HINT: set DTRAIN_VENV_PYTHON to a Python 3.11" >&2
    exit 1
  fi
  echo "setup.sh: installing the Python environment $venv (scripts/$2)"
  log="$(mktemp)"
  rm -rf "$venv"
  if ! { "$python" -m venv "$venv" &&
         "$venv/bin/python" -m pip install --disable-pip-version-check -q \
           -r "$requirements"; } >"$log" 2>&1; then
    tail -20 "$log" >&2
    rm -f "$log"
    echo "setup.sh: could not install the Python environment (above: pip's last lines)" >&2
    exit 1
  fi
  rm -f "$log"
  cp "$requirements" "$venv/requirements.txt"
}
setup_venvs() {
  setup_venv .venv requirements.txt
  setup_venv .venv-cpu requirements-cpu.txt
}

missing=()
while read -r pkg; do
  pkg="${pkg%%#*}"; pkg="${pkg//[[:space:]]/}"
  [ -n "$pkg" ] || continue
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done < "$list"

if [ ${#missing[@]} -eq 0 ]; then
  setup_venvs
  exit 0
fi

if [ "$(id -u)" -eq 0 ]; then
  sudo=()
elif command -v sudo >/dev/null 2>&1; then
  sudo=(sudo)
else
  echo "setup.sh: missing packages: ${missing[*]}" >&2
  echo "setup.sh: not root and no sudo: HINT: run as root, or install them with apt-get" >&2
  exit 1
fi

echo "setup.sh: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
setup_venvs
