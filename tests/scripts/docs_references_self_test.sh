#!/usr/bin/env bash
# docs_references_test.sh's check of names (part 5) on a small tree of its own: it passes while
# every name resolves, and fails, naming file:line and the name, once a Note and a document cite
# names the tree does not define. Without this, a check that resolved everything would pass too.
# Usage: docs_references_self_test.sh
# shellcheck disable=SC2016  # the backticks below are Markdown, not command substitutions
set -euo pipefail
check="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/docs_references_test.sh"
tree="$(mktemp -d)"
out="$(mktemp)"
trap 'rm -rf "$tree" "$out"' EXIT

mkdir -p "$tree/docs" "$tree/src"
cat >"$tree/docs/design.md" <<'EOF'
# Design

`Store::wait(keys, timeout)` waits; `Store::Kind::kTcp` is the default; `connect()` builds one;
an `Options` alias has `Options::timeout`; `std::vector` and `poll()` come from outside the tree.
EOF
cat >"$tree/docs/reliability.md" <<'EOF'
# Reliability

| id | scenario | what happens | bound | tests | status |
|----|----------|--------------|-------|-------|--------|
| L1 | a store is slow | the wait times out | 1 s | `plain_test` | covered |
EOF
cat >"$tree/tests.cmake" <<'EOF'
add_test(NAME plain_test COMMAND true)
EOF
cat >"$tree/src/store.h" <<'EOF'
#pragma once
#include <chrono>

namespace demo {

// Note [Waiting]
// Store::wait() blocks until the keys exist, or throws after `StoreOptions::timeout`; see
// connect().
struct StoreOptions {
  std::chrono::milliseconds timeout{1000};
};
using Options = StoreOptions;

class Store {
 public:
  enum class Kind { kTcp, kHash };
  void wait(const char* keys, std::chrono::milliseconds timeout);
};

Store connect(const Options& options);

}  // namespace demo
EOF

run() {  # -> the check's exit status; its output in $out
  local status=0
  bash "$check" "$tree" >"$out" 2>&1 || status=$?
  return $status
}
fail() {
  echo "docs_references_self_test: $*" >&2
  cat "$out" >&2
  exit 1
}

run || fail "the check failed on a tree whose every name is defined"

cat >>"$tree/src/store.h" <<'EOF'

// Note [Closing]
// Store::close() is not declared.
EOF
echo 'A later `Store::Kind::kShm` and `reconnect(store)` are not defined.' >>"$tree/docs/design.md"
if run; then fail "the check passed although a Note and docs/design.md cite undefined names"; fi
for expected in 'src/store.h:25: `Store::close()` is not defined in the tree' \
                'docs/design.md:5: `Store::Kind::kShm` is not defined in the tree' \
                'docs/design.md:5: `reconnect(store)` is not defined in the tree'; do
  grep -qF -- "$expected" "$out" || fail "the check did not report: $expected"
done
[[ "$(grep -c 'is not defined in the tree' "$out")" == 3 ]] ||
  fail "the check reported names other than the three undefined ones"
echo "docs_references_self_test: ok"
