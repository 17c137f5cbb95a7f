#!/usr/bin/env bash
# The repository's references to its own design hold (docs/design.md, docs/reliability.md):
#   1. no file cites a design document that is not in the repository;
#   2. every anchor cited as design.md#<anchor> or reliability.md#<anchor>, and every (#<anchor>)
#      link inside docs/, names a heading of that file;
#   3. every row id cited after "reliability.md" on a line, or at the start of a comment
#      ("// L1: ..."), is a row of docs/reliability.md;
#   4. row ids are unique; a row's status is covered..., planned (issue N) or retired; a covered
#      row names a test; every test in the tests column exists (CTest's name: executable.Suite.Test,
#      executable.Prefix/Suite.Test/param, or a plain add_test name);
#   5. every backticked `name()`, `Type::name` or `Type::name()` in a Note of the sources (from the
#      "// Note [Title]" line to the first line that is not a comment; bare name() and Type::name
#      count there too) or in a Markdown document names a function, method, type, enum value,
#      constant, macro or member defined in the tree (docs_names.awk), or is on the allowlist of
#      names from outside it below;
#   6. the guides (README.md and every docs/*.md): every relative link names a file that exists
#      and, with #anchor, a heading of it (or of the same document); every docs/*.md guide is
#      linked from README.md; every repository path a guide names in backticks (launcher/...,
#      runtime/..., tests/..., dtrain/... for the installed headers) exists;
#   7. docs/launch.md names every option of launch's option table (launcher/config/launch_args.cpp)
#      and has a row for every exit code of launcher/exit_codes.h;
#   8. every entry (## heading) of docs/troubleshooting.md has a **Checked:** line; each message
#      `TEXT` in `PATH` it names occurs in that source file and, whitespace aside, in the entry's
#      example output; each test it names exists (as in 4).
#   9. every Note is defined once: no two "// Note [Title]" lines ("# Note [Title]" in Python,
#      shell and CMake), the whole line, name the same Note; the others say "See Note [Title]".
#  10. the installed headers (runtime/include/: all of the tree a user gets) cite only what a user
#      has: every Note they cite is defined in an installed header, and every docs/<guide>.md
#      "Heading" they cite is a heading of that guide (or the bold lead of one of its paragraphs).
# Usage: docs_references_test.sh <source-dir>
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$1"

failures=0
fail() {
  echo "docs_references: $*" >&2
  failures=$((failures + 1))
}

# The files to check: tracked and new (not ignored) ones in a git checkout, else every file
# outside build trees.
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files --cached --others --exclude-standard | sort -u)
else
  mapfile -t files < <(find . -type f -not -path './build*' -not -path './.git/*' | sed 's|^\./||')
fi
existing=()
for f in "${files[@]}"; do [[ -f "$f" ]] && existing+=("$f"); done
files=("${existing[@]}")

# GitHub's anchors of a Markdown file's headings: lower case, punctuation dropped, spaces to '-'.
anchors_of() {
  grep -E '^#{1,6} ' "$1" | sed -E 's/^#+ +//' | tr 'A-Z' 'a-z' | sed -E 's/[^a-z0-9 _-]//g; s/ /-/g'
}

# 1. Design documents from outside the repository (the pattern is split so this file does not
# match itself).
outside='(DESIGN|RELIABILITY|STYLE)''\.md'
while IFS= read -r hit; do
  fail "$hit: cites a document that is not in the repository; cite docs/design.md or docs/reliability.md"
done < <(grep -nIE "$outside" "${files[@]}" 2>/dev/null || true)

# 2. Anchors.
design_anchors="$(anchors_of docs/design.md)"
reliability_anchors="$(anchors_of docs/reliability.md)"
check_anchor() {  # where, document, anchor
  local known
  if [[ "$2" == design.md ]]; then known="$design_anchors"; else known="$reliability_anchors"; fi
  grep -qxF -- "$3" <<<"$known" || fail "$1: $2#$3 is not a heading of docs/$2"
}
while IFS= read -r hit; do
  where="${hit%%:*}:$(cut -d: -f2 <<<"$hit")"
  while IFS= read -r ref; do
    check_anchor "$where" "${ref%%#*}" "${ref#*#}"
  done < <(grep -oE '(design|reliability)\.md#[A-Za-z0-9_-]+' <<<"${hit#*:*:}")
done < <(grep -nIE '(design|reliability)\.md#' "${files[@]}" 2>/dev/null || true)
for doc in design.md reliability.md; do
  while IFS= read -r hit; do
    anchor="$(grep -oE '\]\(#[A-Za-z0-9_-]+\)' <<<"${hit#*:}" | sed -E 's/^\]\(#//; s/\)$//')"
    while IFS= read -r a; do
      [[ -n "$a" ]] && check_anchor "docs/$doc:${hit%%:*}" "$doc" "$a"
    done <<<"$anchor"
  done < <(grep -nE '\]\(#' "docs/$doc" || true)
done

# 4. The rows of docs/reliability.md: | id | scenario | what happens | bound | tests | status |
rows="$(grep -E '^\| *[A-Z][0-9]+ *\|' docs/reliability.md || true)"
ids="$(awk -F'|' '{gsub(/ /, "", $2); print $2}' <<<"$rows")"
[[ -n "$ids" ]] || fail "docs/reliability.md has no rows"
while IFS= read -r dup; do
  [[ -n "$dup" ]] && fail "docs/reliability.md: row id $dup is used twice"
done < <(sort <<<"$ids" | uniq -d)

# What the sources define, gathered once: Suite.Test of every TEST/TEST_F/TEST_P,
# Prefix/Suite of every instantiation, every identifier-like string literal (parameter names),
# the gtest executables and plain add_test names.
declare -A defined=() instantiated=() literal=() binary=() plain=()
mapfile -t test_sources < <(printf '%s\n' "${files[@]}" | grep -E '^tests/.*\.cpp$' || true)
flat="$(cat "${test_sources[@]}" | tr '\n' ' ')"
while read -r kind suite test; do
  defined["$kind $suite.$test"]=1
done < <(grep -oE 'TEST(_F|_P)?\( *[A-Za-z0-9_]+, *[A-Za-z0-9_]+ *\)' <<<"$flat" |
         sed -E 's/^(TEST(_F|_P)?)\( *([A-Za-z0-9_]+), *([A-Za-z0-9_]+) *\)$/\1 \3 \4/')
while read -r prefix suite; do
  instantiated["$prefix/$suite"]=1
done < <(grep -oE 'INSTANTIATE_TEST_SUITE_P\( *[A-Za-z0-9_]+, *[A-Za-z0-9_]+' <<<"$flat" |
         sed -E 's/^INSTANTIATE_TEST_SUITE_P\( *([A-Za-z0-9_]+), *([A-Za-z0-9_]+)$/\1 \2/')
while read -r word; do literal["$word"]=1; done < <(grep -oE '"[A-Za-z0-9_]+"' <<<"$flat" | tr -d '"' | sort -u)
cmake_text="$(printf '%s\n' "${files[@]}" | grep -E '\.cmake$|CMakeLists\.txt$' | xargs cat)"
while read -r name; do [[ -n "$name" ]] && binary["$name"]=1; done < <(
  grep -oE 'dtrain_gtest\( *[A-Za-z0-9_]+' <<<"$cmake_text" | sed -E 's/dtrain_gtest\( *//')
while read -r name; do [[ -n "$name" ]] && plain["$name"]=1; done < <(
  grep -oE 'add_test\( *NAME +[A-Za-z0-9_.-]+' <<<"$cmake_text" | sed -E 's/add_test\( *NAME +//')

test_exists() {  # CTest name -> 0 when the test is defined in the sources
  local name="$1" rest prefix suite test param
  [[ -n "${plain[$name]:-}" ]] && return 0
  [[ -n "${binary[${name%%.*}]:-}" ]] || return 1
  rest="${name#*.}"
  if [[ "$rest" == */* ]]; then
    prefix="${rest%%/*}"
    rest="${rest#*/}"
    suite="${rest%%.*}"
    test="${rest#*.}"
    param="${test#*/}"
    test="${test%%/*}"
    [[ -n "${defined["TEST_P $suite.$test"]:-}" && -n "${instantiated["$prefix/$suite"]:-}" ]] ||
      return 1
    [[ "$param" == "*" || -n "${literal[$param]:-}" ]]
  else
    [[ -n "${defined["TEST $rest"]:-}" || -n "${defined["TEST_F $rest"]:-}" ]]
  fi
}

declare -A is_row=()
for id in $ids; do is_row["$id"]=1; done
tick='`'
while IFS= read -r row; do
  [[ -n "$row" ]] || continue
  IFS='|' read -r _ id _ _ _ tests status _ <<<"$row"
  id="${id// /}"
  status="$(sed -E 's/^ +| +$//g' <<<"$status")"
  named=0
  while [[ "$tests" =~ $tick([^$tick]+)$tick ]]; do
    token="${BASH_REMATCH[1]}"
    tests="${tests#*"$tick$token$tick"}"
    if [[ "$token" == */* && -e "$token" && "$token" != *.*.* ]]; then
      continue  # a script or file, e.g. scripts/fuzz.sh
    fi
    if test_exists "$token"; then
      named=$((named + 1))
    else
      fail "docs/reliability.md $id: no test $token in the sources"
    fi
  done
  case "$status" in
    covered*)
      [[ $named -gt 0 ]] || fail "docs/reliability.md $id: covered, but names no test" ;;
    "planned (issue "[0-9]*")"* | retired*) ;;
    *) fail "docs/reliability.md $id: status \"$status\" is not covered..., planned (issue N) or retired" ;;
  esac
done <<<"$rows"

# 3. Row ids cited after "reliability.md" on a line.
while IFS= read -r hit; do
  file="${hit%%:*}"
  rest="${hit#*:}"
  line="${rest%%:*}"
  text="${rest#*:}"
  after="${text#*reliability.md}"
  after="$(sed -E 's/reliability\.md#[A-Za-z0-9_-]+//g' <<<"$after")"
  while IFS= read -r id; do
    [[ -n "$id" ]] || continue
    [[ -n "${is_row[$id]:-}" ]] || fail "$file:$line: cites row $id, which is not in docs/reliability.md"
  done < <(grep -oE '\b[LUSPTNKHM][0-9]{1,3}\b' <<<"$after" || true)
done < <(grep -nI 'reliability\.md' "${files[@]}" 2>/dev/null | grep -v '^docs/reliability\.md:' || true)

# 3b. A comment that starts with row ids ("// L1: ...", "TEST(...) {  // S3, S4") cites rows too:
# each must be a row (this also keeps ids of documents outside the repository out of comments).
mapfile -t code < <(printf '%s\n' "${files[@]}" | grep -E '\.(h|cpp|cmake|sh|py)$|CMakeLists\.txt$' || true)
while IFS= read -r hit; do
  file="${hit%%:*}"
  rest="${hit#*:}"
  line="${rest%%:*}"
  text="${rest#*:}"
  comment="$(sed -E 's@^[^/#]*(//|#) *@@' <<<"$text")"
  lead="$(grep -oE '^[A-Z][0-9]{1,3}((,| and| /|-) *[A-Z][0-9]{1,3})*([:, ]|$)' <<<"$comment" || true)"
  while IFS= read -r id; do
    [[ -n "$id" ]] || continue
    [[ -n "${is_row[$id]:-}" ]] || fail "$file:$line: a comment cites row $id, which is not in docs/reliability.md"
  done < <(grep -oE '[A-Z][0-9]{1,3}' <<<"$lead" || true)
done < <(grep -nIE '(//|#) *[A-Z][0-9]{1,3}((,| and| /|-) *[A-Z][0-9]{1,3})*([:, ]|$)' "${code[@]}" 2>/dev/null || true)

# 5. Names. What comes from outside the tree, kept short and explicit: a name qualified by one of
# these namespaces (torch::, c10d::, std::, ...; os. for Python's), and these unqualified names.
foreign_namespaces=(torch c10d c10 at std gloo os)
foreign_names=(
  # PyTorch / libtorch
  detach_ named_parameters named_buffers load_state_dict set_autocast_enabled no_sync zero_grad
  set_data param_groups raw_allocate raw_deallocate copy_data
  DistributedRandomSampler RandomCrop
  # POSIX / libc
  poll fork kill raise _exit dlopen posix_fadvise getpid flock
)
mapfile -t name_sources < <(printf '%s\n' "${files[@]}" | grep -E '\.(h|cpp|py|sh|cmake)$|CMakeLists\.txt$' || true)
mapfile -t documents < <(printf '%s\n' "${files[@]}" | grep -E '\.md$' || true)
if problems="$(awk -f "$here/docs_names.awk" -v foreign_namespaces="${foreign_namespaces[*]}" \
                   -v foreign_names="${foreign_names[*]}" "${name_sources[@]}" "${documents[@]}")"; then
  while IFS= read -r problem; do
    [[ -n "$problem" ]] && fail "$problem"
  done <<<"$problems"
else
  fail "docs_names.awk failed on the sources"
fi

# 6. The guides' links and paths.
mapfile -t guides < <(printf '%s\n' "${files[@]}" | grep -E '^(README\.md|docs/[^/]+\.md)$' || true)
declare -A guide_anchors=()
for guide in "${guides[@]}"; do guide_anchors["$guide"]="$(anchors_of "$guide")"; done
normal_path() {  # "docs/../README.md" -> "README.md", in $REPLY
  local -a parts=() out=()
  local part
  IFS=/ read -r -a parts <<<"$1"
  for part in "${parts[@]}"; do
    case "$part" in
      "" | .) ;;
      ..) [[ ${#out[@]} -gt 0 ]] && unset 'out[${#out[@]}-1]' ;;
      *) out+=("$part") ;;
    esac
  done
  local IFS=/
  REPLY="${out[*]}"
}
for guide in "${guides[@]}"; do
  dir="$(dirname "$guide")"
  while IFS=: read -r line link; do
    [[ -n "$link" ]] || continue
    target="${link%%#*}"
    anchor=""
    [[ "$link" == *#* ]] && anchor="${link#*#}"
    case "$target" in http:* | https:* | mailto:*) continue ;; esac
    if [[ -z "$target" ]]; then
      resolved="$guide"
    else
      normal_path "$dir/$target"
      resolved="$REPLY"
      [[ -e "$resolved" ]] || { fail "$guide:$line: links to $target, which does not exist"; continue; }
    fi
    if [[ -n "$anchor" && "$resolved" == *.md ]]; then
      [[ -n "${guide_anchors[$resolved]+set}" ]] || guide_anchors["$resolved"]="$(anchors_of "$resolved")"
      grep -qxF -- "$anchor" <<<"${guide_anchors[$resolved]}" ||
        fail "$guide:$line: #$anchor is not a heading of $resolved"
    fi
  done < <(grep -noE '\]\([^) ]+\)' "$guide" | sed -E 's/^([0-9]+):\]\((.*)\)$/\1:\2/')
  while IFS=: read -r line path; do
    [[ -n "$path" ]] || continue
    case "$path" in *'*'* | *'<'* | *'{'* | *'$'*) continue ;; esac
    candidate="$path"
    [[ "$path" == dtrain/* ]] && candidate="runtime/include/$path"
    [[ "$path" == dtrain/config.h ]] && candidate="cmake/config.h.in"
    [[ -e "$candidate" ]] || fail "$guide:$line: names \`$path\`, which is not in the repository"
  done < <(grep -noE '`(launcher|runtime|tests|scripts|examples|benchmarks|docs|cmake|tools|dtrain)/[A-Za-z0-9_./-]*`' "$guide" |
           tr -d '`')
done
if [[ -f README.md ]]; then
  for guide in "${guides[@]}"; do
    [[ "$guide" == docs/* ]] || continue
    grep -qF "]($guide" README.md || fail "README.md does not link to the guide $guide"
  done
fi

# 7. launch's options and exit codes in docs/launch.md.
if [[ -f docs/launch.md && -f launcher/config/launch_args.cpp ]]; then
  while read -r option; do
    grep -qE -- "--$option([^a-z0-9-]|$)" docs/launch.md ||
      fail "docs/launch.md does not name --$option (a row of launcher/config/launch_args.cpp)"
  done < <(grep -oE '^    \{"[a-z0-9-]+", ' launcher/config/launch_args.cpp | sed -E 's/^    \{"([a-z0-9-]+)".*/\1/')
fi
if [[ -f docs/launch.md && -f launcher/exit_codes.h ]]; then
  while read -r code; do
    grep -qE "^\| ($code|[0-9]+ / $code|$code / [0-9]+) \|" docs/launch.md ||
      fail "docs/launch.md has no exit-code row for $code (launcher/exit_codes.h)"
  done < <(grep -oE 'constexpr int kExit[A-Za-z]+ = [0-9]+' launcher/exit_codes.h | grep -oE '[0-9]+$')
fi

# 8. docs/troubleshooting.md: each entry's messages and tests. The awk prints, per entry,
#    "E<TAB>heading<TAB>number of Checked lines", then per message "M<TAB>heading<TAB>text<TAB>
#    path<TAB>1 if the entry's example has it" and per test "T<TAB>heading<TAB>name".
if [[ -f docs/troubleshooting.md ]]; then
  while IFS=$'\t' read -r kind heading a b c; do
    case "$kind" in
      E) [[ "$a" -gt 0 ]] || fail "docs/troubleshooting.md: \"$heading\" has no **Checked:** line" ;;
      M)
        if [[ ! -f "$b" ]]; then
          fail "docs/troubleshooting.md: \"$heading\": $b does not exist"
        elif ! grep -qF -- "$a" "$b"; then
          fail "docs/troubleshooting.md: \"$heading\": the message \"$a\" no longer occurs in $b"
        fi
        [[ "$c" == 1 ]] || fail "docs/troubleshooting.md: \"$heading\": the example does not show \"$a\""
        ;;
      T) test_exists "$a" || fail "docs/troubleshooting.md: \"$heading\": no test $a in the sources" ;;
    esac
  done < <(awk -v tick='`' '
    function norm(t) { gsub(/[ \t]+/, " ", t); sub(/^ /, "", t); sub(/ $/, "", t); return t }
    function flush(   i, rest, m, text, path, n) {
      if (heading == "") return
      printf "E\t%s\t%d\n", heading, nchecked
      for (i = 1; i <= nchecked; i++) {
        rest = checked[i]
        while (match(rest, "message " tick "[^" tick "]+" tick " in " tick "[^" tick "]+" tick)) {
          m = substr(rest, RSTART, RLENGTH)
          rest = substr(rest, RSTART + RLENGTH)
          n = split(m, part, tick)
          text = part[2]; path = part[4]
          printf "M\t%s\t%s\t%s\t%d\n", heading, text, path, (index(norm(example), norm(text)) > 0)
        }
        rest = checked[i]
        while (match(rest, "test " tick "[^" tick "]+" tick)) {
          m = substr(rest, RSTART + 6, RLENGTH - 7)
          rest = substr(rest, RSTART + RLENGTH)
          printf "T\t%s\t%s\n", heading, m
        }
      }
    }
    /^## / { flush(); heading = substr($0, 4); example = ""; nchecked = 0; inchecked = 0; next }
    /^\*\*Checked:\*\*/ { checked[++nchecked] = $0; inchecked = 1; next }
    /^[ \t]*$/ { inchecked = 0; example = example " "; next }
    inchecked { checked[nchecked] = checked[nchecked] " " $0; next }
    { example = example " " $0 }
    END { flush() }
  ' docs/troubleshooting.md)
fi

# 9. Notes defined twice.
mapfile -t note_sources < <(printf '%s\n' "${files[@]}" |
  grep -E '\.(h|cpp|c|cu|py|sh|cmake|in)$|CMakeLists\.txt$' || true)
declare -A note_at=()
note_line='^[[:space:]]*(//|#)[[:space:]]*Note \[([^]]+)\][[:space:]]*$'
while IFS= read -r hit; do
  file="${hit%%:*}"
  rest="${hit#*:}"
  line="${rest%%:*}"
  text="${rest#*:}"
  [[ "$text" =~ $note_line ]] || continue
  marker="${BASH_REMATCH[1]}" title="${BASH_REMATCH[2]}"
  case "$file" in
    *.h | *.cpp | *.c | *.cu) [[ "$marker" == // ]] || continue ;;
    *) [[ "$marker" == '#' ]] || continue ;;  # a "//" line in a shell script is a here-document's
  esac
  if [[ -n "${note_at[$title]:-}" ]]; then
    fail "$file:$line: Note [$title] is defined again (first at ${note_at[$title]}); keep one" \
         "definition and make this one \"See Note [$title]\""
  else
    note_at["$title"]="$file:$line"
  fi
done < <(if [[ ${#note_sources[@]} -gt 0 ]]; then
           grep -nHIE "$note_line" "${note_sources[@]}" || true
         fi)

# 10. What the installed headers cite (docs_citations.awk reads a wrapped citation as one).
declare -A guide_sections=()
sections_of() {  # a guide's headings, and the bold leads of its paragraphs and list items
  grep -E '^#{1,6} ' "$1" | sed -E 's/^#+ +//; s/ +#+$//' || true
  grep -oE '^ *(- )?\*\*[^*]+\*\*' "$1" | sed -E 's/^ *(- )?\*\*//; s/\*\*$//; s/[.:]$//' || true
}
mapfile -t installed < <(printf '%s\n' "${files[@]}" | grep -E '^runtime/include/.*\.h$' || true)
while IFS=$'\t' read -r file line kind what heading; do
  if [[ "$kind" == N ]]; then
    defined="${note_at[$what]:-}"
    if [[ "$defined" != runtime/include/* ]]; then
      where="in ${defined}, which is not installed"
      [[ -n "$defined" ]] || where="nowhere"
      fail "$file:$line: an installed header cites Note [$what], defined $where; cite the docs/" \
           "section that explains it instead (docs/design.md \"Heading\")"
    fi
  elif [[ ! -f "$what" ]]; then
    fail "$file:$line: cites $what, which does not exist"
  else
    [[ -n "${guide_sections[$what]+set}" ]] || guide_sections["$what"]="$(sections_of "$what")"
    grep -qxF -- "$heading" <<<"${guide_sections[$what]}" ||
      fail "$file:$line: cites $what \"$heading\", which is not a heading of $what"
  fi
done < <(if [[ ${#installed[@]} -gt 0 ]]; then
           awk -f "$here/docs_citations.awk" "${installed[@]}"
         fi)

if [[ $failures -gt 0 ]]; then
  echo "docs_references: $failures problem(s)" >&2
  exit 1
fi
echo "docs_references: ok ($(wc -l <<<"$ids") rows, ${#files[@]} files)"
