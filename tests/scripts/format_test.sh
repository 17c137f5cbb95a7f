#!/usr/bin/env bash
# docs.format: the C/C++ sources are formatted as .clang-format says (clang-format 14, Debian 12's
# clang-format package) and no line of them is longer than 100 columns: scripts/format.sh --check.
# Fails, naming the package, where clang-format 14 is not installed.
# Usage: format_test.sh <source-dir>
#        format_test.sh --self-test   (on a small tree with the repository's .clang-format: a
#                                      formatted file passes; a planted misformat, a long comment
#                                      line and a missing clang-format each fail, saying so)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
if [[ "${1:-}" != --self-test ]]; then
  exec bash "$1/scripts/format.sh" --check "$1"
fi

tree="$(mktemp -d)"
out="$(mktemp)"
trap 'rm -rf "$tree" "$out"' EXIT
cp "$repo/.clang-format" "$tree/"
mkdir -p "$tree/src"
cat >"$tree/src/queue.h" <<'EOF'
#pragma once
#include <string>
#include <vector>

namespace demo {

// A queue of names; push() and pop() are not thread-safe.
class Queue {
 public:
  void push(const std::string& name) { names_.push_back(name); }
  bool empty() const { return names_.empty(); }

 private:
  std::vector<std::string> names_;
};

}  // namespace demo
EOF
run() {  # -> the check's exit status; its output in $out
  local status=0
  bash "$repo/scripts/format.sh" --check "$tree" >"$out" 2>&1 || status=$?
  return $status
}
fail() {
  echo "format self-test: $*" >&2
  cat "$out" >&2
  exit 1
}
expect() {  # TEXT: the last run's output has it
  grep -qF -- "$1" "$out" || fail "the check did not say: $1"
}

run || fail "the check failed on a formatted file"

cp "$tree/src/queue.h" "$tree/queue.h.orig"
sed -i 's/  bool empty() const/  bool   empty( ) const/' "$tree/src/queue.h"
if run; then fail "the check passed a misformatted file"; fi
expect "1 of 1 files are not formatted"
expect "  src/queue.h"
expect "HINT: run scripts/format.sh"

cp "$tree/queue.h.orig" "$tree/src/queue.h"
rm "$tree/queue.h.orig"
long="//$(printf ' word%.0s' {1..20})"
sed -i "s|^// A queue of names.*|$long|" "$tree/src/queue.h"
if run; then fail "the check passed a comment line of ${#long} columns"; fi
expect "lines longer than 100 columns: 1"
expect "src/queue.h:7:"

if CLANG_FORMAT=clang-format-missing run; then fail "the check passed without clang-format"; fi
expect "apt-get install clang-format"
echo "format self-test: a misformat, a long line and a missing clang-format are each reported"
