# What C++ comments cite, for docs_references_test.sh (part 10): one line per citation,
#   FILE <TAB> LINE <TAB> N <TAB> title             for Note [title]
#   FILE <TAB> LINE <TAB> D <TAB> docs/x.md <TAB> heading   for docs/x.md "heading" (or
#                                                            docs/x.md, "heading")
# A citation may wrap: the comment lines of a block (a run of lines that hold only a comment, or
# one trailing comment) are read as one text, and LINE is where the citation begins.
# Usage: awk -f docs_citations.awk FILE...

function flush(   t, off, s, doc, head) {
  t = text; off = 0
  while (match(t, /Note \[[^]]+\]/)) {
    print file "\t" line_at(off + RSTART) "\tN\t" substr(t, RSTART + 6, RLENGTH - 7)
    off += RSTART + RLENGTH - 1
    t = substr(t, RSTART + RLENGTH)
  }
  t = text; off = 0
  while (match(t, /docs\/[A-Za-z0-9_-]+\.md,? "[^"]+"/)) {
    s = substr(t, RSTART, RLENGTH)
    doc = s; sub(/,? ".*/, "", doc)
    head = s; sub(/^[^"]*"/, "", head); sub(/"$/, "", head)
    print file "\t" line_at(off + RSTART) "\tD\t" doc "\t" head
    off += RSTART + RLENGTH - 1
    t = substr(t, RSTART + RLENGTH)
  }
  text = ""; n = 0
}

# The line of the block on which character `pos` of its text lies.
function line_at(pos,   i) {
  for (i = n; i > 1; i--) if (start[i] <= pos) return line[i]
  return line[1]
}

FNR == 1 { flush(); previous_pure = 0; file = FILENAME }
{
  k = index($0, "//")
  if (k == 0) { flush(); previous_pure = 0; next }
  pure = ($0 ~ /^[ \t]*\/\//)
  if (!(pure && previous_pure)) flush()
  c = substr($0, k + 2)
  sub(/^ /, "", c)
  sub(/[ \t]+$/, "", c)
  if (text != "") text = text " "
  start[++n] = length(text) + 1
  line[n] = FNR
  text = text c
  previous_pure = pure
}
END { flush() }
