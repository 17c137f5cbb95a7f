#!/usr/bin/env bash
# Formats the C/C++ sources (.h, .cpp, .c, .cu; in a git checkout the tracked and new ones) in
# place with clang-format 14 and .clang-format, then lists the lines still longer than 100
# columns: comments, which the format keeps as written (rewrap them by hand).
#   scripts/format.sh [DIR]            format the tree DIR (default: this repository)
#   scripts/format.sh --check [DIR]    change nothing; exit 1 naming every file the format would
#                                      change and every line over 100 columns
#                                      (tests/scripts/format_test.sh, CTest docs.format)
# CLANG_FORMAT names the binary (default clang-format-14, else clang-format); it must be version
# 14, Debian 12's: another version formats some constructs differently.
set -euo pipefail
check=0
if [[ "${1:-}" == --check ]]; then
  check=1
  shift
fi
root="${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
cd "$root"
name="format"
((check)) && name="format check"
hint_install="HINT: apt-get install clang-format (Debian 12's is version 14; scripts/setup.sh"
hint_install+=" installs it), or set CLANG_FORMAT to a clang-format 14"

clang_format="${CLANG_FORMAT:-}"
if [[ -z "$clang_format" ]]; then
  clang_format=clang-format
  command -v clang-format-14 >/dev/null 2>&1 && clang_format=clang-format-14
fi
if ! command -v "$clang_format" >/dev/null 2>&1; then
  echo "$name: $clang_format is not installed. $hint_install" >&2
  exit 1
fi
version="$("$clang_format" --version 2>/dev/null || true)"
if ! grep -qE 'version 14\.' <<<"$version"; then
  echo "$name: $clang_format is not clang-format 14 (it says: ${version:-nothing})." \
       "$hint_install" >&2
  exit 1
fi
[[ -f .clang-format ]] || { echo "$name: $root has no .clang-format" >&2; exit 1; }

# The files: as docs_references_test.sh takes them (tracked and new ones in a git checkout, else
# every file outside build trees and Python environments).
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t listed < <(git ls-files --cached --others --exclude-standard -- \
                          '*.h' '*.cpp' '*.c' '*.cu' | sort -u)
else
  mapfile -t listed < <(find . \( -name 'build*' -o -name '.venv*' -o -name .git -o -name .deps \) \
                          -prune -o -type f \( -name '*.h' -o -name '*.cpp' -o -name '*.c' \
                          -o -name '*.cu' \) -print | sed 's|^\./||' | sort)
fi
files=()
for f in "${listed[@]}"; do [[ -f "$f" ]] && files+=("$f"); done
if [[ ${#files[@]} -eq 0 ]]; then
  echo "$name: no C/C++ files under $root" >&2
  exit 1
fi

# Lines over 100 columns, counted in characters (UTF-8), as clang-format counts them.
long_lines() {
  LC_ALL=C.UTF-8 grep -HnP '^.{101,}$' "${files[@]}" | cut -c1-140 || true
}

if ((check == 0)); then
  printf '%s\0' "${files[@]}" | xargs -0 -n 50 "$clang_format" -i
  long="$(long_lines)"
  echo "format: formatted ${#files[@]} files with $clang_format"
  if [[ -n "$long" ]]; then
    echo "format: lines still longer than 100 columns (comments are kept as written), to rewrap" \
         "by hand: $(wc -l <<<"$long")" >&2
    echo "$long" >&2
    exit 1
  fi
  exit 0
fi

# Without -Werror a violation is a warning and clang-format exits 0, so a failure of its own (a
# bad .clang-format, a crash) cannot pass for a list of files.
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
if ! printf '%s\0' "${files[@]}" | xargs -0 -n 50 "$clang_format" --dry-run >"$log" 2>&1; then
  echo "$name: $clang_format failed:" >&2
  tail -20 "$log" >&2
  exit 1
fi
status=0
mapfile -t unformatted < <(
  sed -nE 's/^(.*):[0-9]+:[0-9]+: warning: code should be clang-formatted.*/\1/p' "$log" | sort -u)
if [[ ${#unformatted[@]} -gt 0 ]]; then
  status=1
  echo "$name: ${#unformatted[@]} of ${#files[@]} files are not formatted as .clang-format" \
       "says:" >&2
  printf '  %s\n' "${unformatted[@]:0:30}" >&2
  [[ ${#unformatted[@]} -le 30 ]] || echo "  ... and $((${#unformatted[@]} - 30)) more" >&2
  echo "$name: what it would change in ${unformatted[0]}:" >&2
  "$clang_format" "${unformatted[0]}" | diff -u "${unformatted[0]}" - | head -30 >&2 || true
fi
long="$(long_lines)"
if [[ -n "$long" ]]; then
  status=1
  count="$(wc -l <<<"$long")"
  echo "$name: lines longer than 100 columns: $count" >&2
  head -30 <<<"$long" >&2
  [[ $count -le 30 ]] || echo "  ... and $((count - 30)) more" >&2
fi
if ((status)); then
  echo "$name: HINT: run scripts/format.sh (it formats every file in place and lists the long" \
       "lines left to rewrap by hand), then review the diff" >&2
  exit 1
fi
echo "$name: ok (${#files[@]} files, clang-format 14)"
