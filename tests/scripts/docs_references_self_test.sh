#!/usr/bin/env bash
# docs_references_test.sh on small trees of its own. The check of names (part 5): it passes while
# every name resolves, and fails, naming file:line and the name, once a Note and a document cite
# names the tree does not define, and once a Note is defined twice (part 9). The guides (parts
# 6-8): a README, docs/launch.md and a troubleshooting entry pass; a broken link, an unlinked
# guide, a missing path, an option or exit code launch.md lacks, a message the sources no longer
# print (or the example does not show), and a test that does not exist are each reported. The
# installed headers (part 10): they pass while they cite Notes of installed headers and headings
# of the guides, wrapped or not; a Note of a file that is not installed, a Note defined nowhere
# and a heading the guide lacks are each reported. Without this, a check that resolved
# everything would pass too.
# Usage: docs_references_self_test.sh
# shellcheck disable=SC2016  # the backticks below are Markdown, not command substitutions
set -euo pipefail
check="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/docs_references_test.sh"
tree="$(mktemp -d)"
guides="$(mktemp -d)"
headers="$(mktemp -d)"
out="$(mktemp)"
trap 'rm -rf "$tree" "$guides" "$headers" "$out"' EXIT

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

run() {  # [tree] -> the check's exit status; its output in $out
  local status=0
  bash "$check" "${1:-$tree}" >"$out" 2>&1 || status=$?
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

# A Note defined twice (part 9); a "See Note" and a "Note [Title]: ..." line are not definitions.
cat >"$tree/src/wait.cpp" <<'EOF'
// See Note [Waiting].
// Note [Waiting]: what connect() waits for.

// Note [Waiting]
// The store's wait, explained a second time.
EOF
if run; then fail "the check passed although Note [Waiting] is defined twice"; fi
expected='src/wait.cpp:4: Note [Waiting] is defined again (first at src/store.h:6)'
grep -qF -- "$expected" "$out" || fail "the check did not report: $expected"
[[ "$(grep -c 'is defined again' "$out")" == 1 ]] ||
  fail "the check took a See Note or a \"Note [Title]: ...\" line for a definition"

# The guides: a tree whose links, paths, options, exit codes, messages and tests all hold.
mkdir -p "$guides/docs" "$guides/src" "$guides/launcher/config"
cp "$tree/docs/reliability.md" "$guides/docs/reliability.md"
cp "$tree/tests.cmake" "$guides/tests.cmake"
echo '# Design' >"$guides/docs/design.md"
cat >"$guides/README.md" <<'EOF'
# Demo

Options: [launch](docs/launch.md#options); problems: [troubleshooting](docs/troubleshooting.md).
Design: [design](docs/design.md), [reliability](docs/reliability.md).
EOF
cat >"$guides/docs/launch.md" <<'EOF'
# launch

## Options

`--steps N` (`launcher/config/launch_args.cpp`), see [below](#exit-codes).

## Exit codes

| code | meaning |
|---|---|
| 2 | usage |
EOF
cat >"$guides/launcher/config/launch_args.cpp" <<'EOF'
const OptionSpec kOptions[] = {
    {"steps", 0, "N", "steps to run"},
};
EOF
echo 'constexpr int kExitUsage = 2;' >"$guides/launcher/exit_codes.h"
echo 'void run() { throw Error("worker: the store at 10.0.0.1 did not answer"); }' \
  >"$guides/src/worker.cpp"
cat >"$guides/docs/troubleshooting.md" <<'EOF'
# Troubleshooting

## The store does not answer

```
worker: the store at 10.0.0.1 did not
answer
```

**Checked:** message `the store at 10.0.0.1 did not answer` in `src/worker.cpp`; test
`plain_test`.
EOF
run "$guides" || fail "the check failed on guides whose every link, path, message and test holds"

# ... then broken in every way the check knows.
echo 'See [nowhere](docs/nowhere.md), [a heading](docs/launch.md#nothing) and `launcher/job/gone.cpp`.' \
  >>"$guides/README.md"
echo '# Orphan' >"$guides/docs/orphan.md"
echo 'constexpr int kExitDeadline = 124;' >>"$guides/launcher/exit_codes.h"
sed -i 's/^    {"steps"/    {"retries", 0, "N", "x"},\n    {"steps"/' "$guides/launcher/config/launch_args.cpp"
cat >>"$guides/docs/troubleshooting.md" <<'EOF'

## A rank is slow

```
rank 1 is slow
```

**Checked:** message `is slow to answer` in `src/worker.cpp`; test `plain_test.Nope`.

## No check

Nothing.
EOF
if run "$guides"; then fail "the check passed although the guides are broken"; fi
for expected in 'README.md:5: links to docs/nowhere.md, which does not exist' \
                'README.md:5: #nothing is not a heading of docs/launch.md' \
                'README.md:5: names `launcher/job/gone.cpp`, which is not in the repository' \
                'README.md does not link to the guide docs/orphan.md' \
                'docs/launch.md does not name --retries' \
                'docs/launch.md has no exit-code row for 124' \
                '"A rank is slow": the message "is slow to answer" no longer occurs in src/worker.cpp' \
                '"A rank is slow": the example does not show "is slow to answer"' \
                '"A rank is slow": no test plain_test.Nope in the sources' \
                'docs/troubleshooting.md: "No check" has no **Checked:** line'; do
  grep -qF -- "$expected" "$out" || fail "the check did not report: $expected"
done
if grep -qF '"The store does not answer"' "$out"; then
  fail "the check reported the entry whose message, example and test hold"
fi
# The installed headers (part 10): a tree whose headers cite an installed Note and two headings.
mkdir -p "$headers/docs" "$headers/src" "$headers/runtime/include/demo"
cp "$tree/docs/reliability.md" "$headers/docs/reliability.md"
cp "$tree/tests.cmake" "$headers/tests.cmake"
printf '# Design\n\n## Waiting\n\n- **Zero timeouts.** The default deadline.\n' \
  >"$headers/docs/design.md"
cat >"$headers/runtime/include/demo/timeout.h" <<'EOF'
#pragma once
// Note [Zero means the default]
// A timeout of zero is the default deadline.
EOF
cat >"$headers/src/store.cpp" <<'EOF'
// Note [Store internals]
// How the store keeps its keys.
EOF
cat >"$headers/runtime/include/demo/store.h" <<'EOF'
#pragma once
// A store. Its waits (docs/design.md "Waiting") end at a deadline; zero is the default one (Note
// [Zero means the default], docs/design.md, "Zero timeouts").
int wait();  // see docs/design.md
             // "Waiting"
EOF
run "$headers" || fail "the check failed on installed headers that cite what is installed"
echo '// Keys: Note [Store internals]; Note [Gone]; docs/design.md "Keys".' \
  >>"$headers/runtime/include/demo/store.h"
if run "$headers"; then fail "the check passed although an installed header cites what is not"; fi
h='runtime/include/demo/store.h:6: an installed header cites Note'
for expected in "$h [Store internals], defined in src/store.cpp:1, which is not installed" \
                "$h [Gone], defined nowhere" \
                "store.h:6: cites docs/design.md \"Keys\", which is not a heading of docs/design.md"; do
  grep -qF -- "$expected" "$out" || fail "the check did not report: $expected"
done
[[ "$(grep -cE 'installed header cites|not a heading of' "$out")" == 3 ]] ||
  fail "the check reported a citation of the installed headers that holds"

echo "docs_references_self_test: ok"
