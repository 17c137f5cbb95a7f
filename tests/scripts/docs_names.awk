# Part 5 of docs_references_test.sh: the names that Notes and documents cite are defined in the
# tree, or are on the script's allowlist of names from outside it. Cited are: in a Markdown
# document, every backticked `name()`, `Type::name` or `Type::name()` (and `obj.name()`,
# `ptr->name()`: the method); in a Note of the sources (from the "// Note [Title]" line, or
# "// Note [Title]: ...", to the first line that is not a comment), the same, and bare name() and
# Type::name too, since comments seldom backtick code.
#
# Input: the code files (.h .cpp .py .sh, and CMake files for their targets), then the Markdown
# files. Variables: foreign_namespaces (a name qualified by one of them is accepted) and
# foreign_names (unqualified names from outside the tree). Prints one line per unresolved name.
#
# What the tree defines is read in one pass, with a scan that is good enough for this code base's
# formatting rather than a C++ parser: braces are counted (after strings, characters and comments
# are dropped) to know whether a statement is at namespace, class, enum or block scope; the
# declarations at namespace, class and enum scope are recorded with the scope that holds them, so
# `Type::name` is checked against Type's members (and its bases'), `ns::name` against the
# namespace's. Python's def/class/self.x and shell functions and variables are read line by line.

BEGIN {
  n = split(foreign_namespaces, list, " ")
  for (i = 1; i <= n; i++) foreignNs[list[i]] = 1
  n = split(foreign_names, list, " ")
  for (i = 1; i <= n; i++) foreignName[list[i]] = 1
  nrefs = 0
  tick = "`"
}

FNR == 1 { startFile() }

function startFile() {
  kind = FILENAME
  if (kind ~ /\.md$/) kind = "md"
  else if (kind ~ /\.(h|cpp|cc|cu|hpp)$/) kind = "cpp"
  else if (kind ~ /\.py$/) kind = "py"
  else if (kind ~ /\.sh$/) kind = "sh"
  else kind = "cmake"
  depth = 0
  scopeKind[0] = "ns"
  scopeOwner[0] = ""
  head = ""
  inBlockComment = 0
  inMacro = 0
  inRawString = 0
  inNote = 0
  inFence = 0
  carry = ""
  pyClasses = 0
}

# ---- references ------------------------------------------------------------------------------

# Collects the backticked spans of text (one line of a Note or a document); a span left open at
# the end of the line continues on the next one.
function collectRefs(text,   where, span) {
  where = FILENAME ":" FNR
  if (carry != "") {
    text = carry " " text
    where = carryWhere
    carry = ""
  }
  while (match(text, /`[^`]*`/)) {
    span = substr(text, RSTART + 1, RLENGTH - 2)
    text = substr(text, RSTART + RLENGTH)
    addRef(span, where)
    where = FILENAME ":" FNR
  }
  if (index(text, tick)) {
    carry = substr(text, index(text, tick))
    carryWhere = where
  }
}

function addRef(span, where) {
  gsub(/^[ \t]+|[ \t]+$/, "", span)
  # A call through an object, `ddp.noSync()` or `store->check(keys)`, names its method.
  if (span ~ /^[A-Za-z_][A-Za-z0-9_]*((\.|->)[A-Za-z_][A-Za-z0-9_]*)+\(.*\)$/) {
    if (substr(span, 1, match(span, /\.|->/) - 1) in foreignNs) return
    sub(/\(.*$/, "()", span)
    sub(/^.*(\.|->)/, "", span)
  }
  if (span !~ /^[A-Za-z_][A-Za-z0-9_]*(::~?[A-Za-z_][A-Za-z0-9_]*)*(\(.*\))?$/) return
  if (span !~ /::/ && span !~ /\)$/) return
  refWhere[nrefs] = where
  refSpan[nrefs] = span
  nrefs++
}

# A Note opens with a line that is only "// Note [Title]" ("# Note [Title]" in Python and shell)
# and runs to the first line that is not a comment.
function noteLine(line, comment) {
  if (line ~ ("^[ \t]*" comment "[ \t]*Note \\[[^]]+\\](:.*)?[ \t]*$")) {
    inNote = 1
    carry = ""
  } else if (inNote && line !~ ("^[ \t]*" comment)) {
    inNote = 0
    carry = ""
  }
  if (inNote) {
    collectRefs(line)
    bareRefs(line)
  }
}

# Comments name code without backticks: in a Note, a bare name() (empty parentheses: "rank(s)" is
# prose) or a bare qualified Type::name is a reference too.
function bareRefs(text,   where, name) {
  where = FILENAME ":" FNR
  gsub(/`[^`]*`/, " ", text)
  sub(/`.*$/, "", text)
  text = " " text
  while (match(text, /[^A-Za-z0-9_:~][A-Za-z_][A-Za-z0-9_]*((::~?[A-Za-z_][A-Za-z0-9_]*)+(\(\))?|\(\))/)) {
    name = substr(text, RSTART + 1, RLENGTH - 1)
    text = substr(text, RSTART + RLENGTH)
    addRef(name, where)
  }
}

kind == "md" {
  if ($0 ~ /^[ \t]*```/) { inFence = !inFence; carry = ""; next }
  if (inFence) next
  if ($0 ~ /^[ \t]*$/) { carry = ""; next }
  collectRefs($0)
  next
}

# ---- definitions -----------------------------------------------------------------------------

function define(owner, name) {
  if (name == "") return
  defined[name] = 1
  if (owner != "") member[owner, name] = 1
}

function trim(s) {
  gsub(/^[ \t]+|[ \t]+$/, "", s)
  return s
}

# The owner that declarations at the current scope belong to; "-" at block scope (nothing there
# is recorded).
function currentOwner() {
  return scopeKind[depth] == "block" ? "-" : scopeOwner[depth]
}

# Drops "template <...>" from a head, noting the names of its type parameters: `Api::hasContext`
# in a Note about a template over Api names whatever Api stands for.
function stripTemplate(h,   params, p) {
  while (match(h, /^template[ \t]*<[^<>]*(<[^<>]*>[^<>]*)*>[ \t]*/)) {
    params = substr(h, RSTART, RLENGTH)
    h = substr(h, RSTART + RLENGTH)
    while (match(params, /(typename|class)[ \t]+[A-Za-z_][A-Za-z0-9_]*/)) {
      p = substr(params, RSTART, RLENGTH)
      params = substr(params, RSTART + RLENGTH)
      sub(/^[a-z]+[ \t]+/, "", p)
      templateParam[p] = 1
    }
  }
  return h
}

# A declaration at namespace or class scope, ended by ';' or by the '{' of a body or initialiser:
# its name is the (qualified) identifier before the first '(', '=' or '[' outside template
# arguments, or the last identifier when there is none.
function declare(h, owner,   i, c, angle, cut, prefix, name, parts, n) {
  h = trim(h)
  h = stripTemplate(h)
  gsub(/\[\[[^]]*\]\]/, " ", h)
  gsub(/(public|protected|private)[ \t]*:/, " ", h)
  h = trim(h)
  if (h == "" || h ~ /(^|[^A-Za-z0-9_])operator([^A-Za-z0-9_]|$)/) return
  if (h ~ /^using[ \t]+namespace([ \t]|$)/ || h ~ /^(static_assert|friend|return|extern)([ \t(]|$)/) return
  if (match(h, /^using[ \t]+[A-Za-z_][A-Za-z0-9_]*[ \t]*=/)) {
    # An alias has its target's members: InitOptions::backend is WorldOptions::backend.
    name = trim(substr(h, 7, RLENGTH - 7))
    h = substr(h, RSTART + RLENGTH)
    while (gsub(/<[^<>]*>/, "", h)) {}
    sub(/^.*::/, "", h)
    define(owner, name)
    isType[name] = 1
    baseOf[name] = baseOf[name] " " trim(h)
    return
  }
  if (match(h, /^TORCH_MODULE[ \t]*\([ \t]*[A-Za-z_][A-Za-z0-9_]*/)) {
    # libtorch's macro defines the module holder Name for NameImpl.
    name = substr(h, RSTART, RLENGTH)
    sub(/^.*\([ \t]*/, "", name)
    define(owner, name)
    isType[name] = 1
    baseOf[name] = baseOf[name] " " name "Impl"
    return
  }
  if (h ~ /^namespace[ \t]/) return  # namespace alias
  angle = 0
  cut = length(h) + 1
  for (i = 1; i <= length(h); i++) {
    c = substr(h, i, 1)
    if (c == "<") angle++
    else if (c == ">" && angle > 0) angle--
    else if (angle == 0 && (c == "(" || c == "=" || c == "[")) { cut = i; break }
  }
  prefix = substr(h, 1, cut - 1)
  if (!match(prefix, /~?[A-Za-z_][A-Za-z0-9_]*(::~?[A-Za-z_][A-Za-z0-9_]*)*[ \t]*$/)) return
  name = trim(substr(prefix, RSTART, RLENGTH))
  n = split(name, parts, "::")
  if (n > 1) define(parts[n - 1], parts[n])
  define(owner, parts[n])
}

# Records a namespace, class or enum named in a head that opens a scope, and what it derives from.
function openScope(h,   owner, kw, rest, name, bases, n, list, i, b) {
  owner = currentOwner()
  h = trim(h)
  h = stripTemplate(h)
  if (owner != "-" && match(h, /^(inline[ \t]+)?namespace([ \t]|$)/)) {
    rest = trim(substr(h, RSTART + RLENGTH))
    depth++
    scopeKind[depth] = "ns"
    if (rest == "") { scopeOwner[depth] = owner; return }
    n = split(rest, list, "::")
    for (i = 1; i <= n; i++) {
      define(owner, list[i])
      owner = list[i]
    }
    scopeOwner[depth] = owner
    return
  }
  if (owner != "-" && h ~ /^extern[ \t]*"/) {
    depth++
    scopeKind[depth] = "ns"
    scopeOwner[depth] = owner
    return
  }
  if (owner != "-" && match(h, /(^|[ \t])(enum|class|struct|union)([ \t]|$)/) && h !~ /[(=]/) {
    rest = substr(h, RSTART + RLENGTH)
    kw = substr(h, RSTART, RLENGTH)
    if (kw ~ /enum/) sub(/^[ \t]*(class|struct)[ \t]+/, "", rest)
    bases = ""
    if (match(rest, /[^:]:[^:]/)) {
      bases = substr(rest, RSTART + 2)
      rest = substr(rest, 1, RSTART)
    } else if (rest ~ /^:[^:]/) {
      bases = substr(rest, 2)
      rest = ""
    }
    sub(/[ \t]final[ \t]*$/, "", rest)
    name = ""
    if (match(rest, /[A-Za-z_][A-Za-z0-9_]*[ \t]*$/)) name = trim(substr(rest, RSTART, RLENGTH))
    depth++
    scopeKind[depth] = kw ~ /enum/ ? "enum" : "class"
    scopeOwner[depth] = name
    if (name == "") return
    define(owner, name)
    isType[name] = 1
    if (kw ~ /enum/) return
    while (gsub(/<[^<>]*>/, "", bases)) {}
    n = split(bases, list, ",")
    for (i = 1; i <= n; i++) {
      b = list[i]
      gsub(/(public|protected|private|virtual)/, "", b)
      b = trim(b)
      sub(/^.*::/, "", b)
      if (b != "") baseOf[name] = baseOf[name] " " b
    }
    return
  }
  if (owner != "-" && scopeKind[depth] != "enum") declare(h, owner)
  depth++
  scopeKind[depth] = "block"
  scopeOwner[depth] = ""
}

function enumerator(h,   name) {
  h = trim(h)
  if (match(h, /^[A-Za-z_][A-Za-z0-9_]*/)) {
    name = substr(h, RSTART, RLENGTH)
    define(scopeOwner[depth], name)
    define(scopeOwner[depth - 1], name)
  }
}

function cppCode(line,   p, q, c, before) {
  if (inRawString) {
    p = index(line, ")\"")
    if (!p) return
    line = substr(line, p + 2)
    inRawString = 0
  }
  if (inBlockComment) {
    p = index(line, "*/")
    if (!p) return
    line = substr(line, p + 2)
    inBlockComment = 0
  }
  if (inMacro) { inMacro = (line ~ /\\$/); return }
  if (line ~ /^[ \t]*#/) {
    if (match(line, /^[ \t]*#[ \t]*define[ \t]+[A-Za-z_][A-Za-z0-9_]*/)) {
      c = substr(line, RSTART, RLENGTH)
      sub(/^.*define[ \t]+/, "", c)
      define("", c)
    }
    inMacro = (line ~ /\\$/)
    return
  }
  gsub(/\\./, "x", line)
  if (match(line, /R"\(/) && index(substr(line, RSTART + 3), ")\"") == 0) {
    line = substr(line, 1, RSTART - 1)
    inRawString = 1
  }
  gsub(/"[^"]*"/, "\"\"", line)
  gsub(/'[^']'/, "0", line)
  p = index(line, "//")
  if (p) line = substr(line, 1, p - 1)
  while ((p = index(line, "/*"))) {
    q = index(substr(line, p + 2), "*/")
    if (!q) { line = substr(line, 1, p - 1); inBlockComment = 1; break }
    line = substr(line, 1, p - 1) " " substr(line, p + q + 3)
  }
  while (match(line, /[{};,]/)) {
    c = substr(line, RSTART, 1)
    before = substr(line, 1, RSTART - 1)
    line = substr(line, RSTART + 1)
    if (scopeKind[depth] == "block" && c != "{" && c != "}") { head = ""; continue }
    head = head " " before
    if (c == ",") {
      if (scopeKind[depth] == "enum") { enumerator(head); head = "" } else head = head ","
    } else if (c == "{") {
      openScope(head)
      head = ""
    } else if (c == "}") {
      if (scopeKind[depth] == "enum") enumerator(head)
      if (depth > 0) depth--
      head = ""
    } else {
      if (currentOwner() != "-" && scopeKind[depth] != "enum") declare(head, currentOwner())
      head = ""
    }
  }
  head = head " " line
}

kind == "cpp" {
  noteLine($0, "//")
  cppCode($0)
  next
}

kind == "py" {
  noteLine($0, "#")
  if (match($0, /^[ \t]*(def|class)[ \t]+[A-Za-z_][A-Za-z0-9_]*/)) {
    text = substr($0, RSTART, RLENGTH)
    match(text, /^[ \t]*/)
    indent = RLENGTH
    name = text
    sub(/^[ \t]*(def|class)[ \t]+/, "", name)
    while (pyClasses > 0 && pyIndent[pyClasses] >= indent) pyClasses--
    define(pyClasses > 0 ? pyClass[pyClasses] : "", name)
    if (text ~ /class[ \t]/) {
      pyClasses++
      pyClass[pyClasses] = name
      pyIndent[pyClasses] = indent
      isType[name] = 1
    }
  } else if (match($0, /^[A-Za-z_][A-Za-z0-9_]*[ \t]*=/)) {
    name = substr($0, 1, RLENGTH)
    sub(/[ \t]*=$/, "", name)
    define("", name)
  } else if (match($0, /self\.[A-Za-z_][A-Za-z0-9_]*[ \t]*=/) && pyClasses > 0) {
    name = substr($0, RSTART + 5, RLENGTH - 5)
    sub(/[ \t]*=$/, "", name)
    define(pyClass[pyClasses], name)
  }
  next
}

kind == "sh" {
  noteLine($0, "#")
  if (match($0, /^[ \t]*(function[ \t]+)?[A-Za-z_][A-Za-z0-9_]*[ \t]*\(\)/)) {
    name = substr($0, RSTART, RLENGTH)
    sub(/^[ \t]*(function[ \t]+)?/, "", name)
    sub(/[ \t]*\(\)$/, "", name)
    define("", name)
  } else if (match($0, /^[ \t]*((local|export|readonly|declare)[ \t]+(-[A-Za-z]+[ \t]+)*)?[A-Za-z_][A-Za-z0-9_]*=/)) {
    name = substr($0, RSTART, RLENGTH - 1)
    sub(/^.*[ \t]/, "", name)
    define("", name)
  }
  next
}

# CMake: the targets, and the namespaced aliases (dtrain::dtrain_comm) that users link.
kind == "cmake" {
  if (match($0, /add_(library|executable)\([ \t]*[A-Za-z0-9_:]+/)) {
    name = substr($0, RSTART, RLENGTH)
    sub(/^.*\([ \t]*/, "", name)
    n = split(name, parts, "::")
    if (n == 2) define(parts[1], parts[2])
    else define("", name)
  }
  next
}

# ---- resolution ------------------------------------------------------------------------------

function hasMember(type, name, hops,   n, list, i) {
  if ((type, name) in member) return 1
  if ((type in templateParam) && !(type in isType) && (name in defined)) return 1
  if (type == name && (type in isType)) return 1  # a constructor
  if (hops > 8 || !(type in baseOf)) return 0
  n = split(baseOf[type], list, " ")
  for (i = 1; i <= n; i++) if (hasMember(list[i], name, hops + 1)) return 1
  return 0
}

function resolves(span,   name, n, parts, i) {
  name = span
  sub(/\(.*$/, "", name)
  n = split(name, parts, "::")
  if (n == 1) return (name in defined) || (name in foreignName)
  if (parts[1] in foreignNs) return 1
  for (i = 1; i < n; i++) if (!hasMember(parts[i], parts[i + 1], 0)) return 0
  return 1
}

END {
  for (i = 0; i < nrefs; i++) {
    if (!resolves(refSpan[i])) {
      print refWhere[i] ": `" refSpan[i] "` is not defined in the tree; fix the reference or add it" \
            " to the allowlist (foreign_names in docs_references_test.sh) if it is PyTorch/NCCL/Gloo's"
    }
  }
}
