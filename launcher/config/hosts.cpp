#include "launcher/config/hosts.h"

#include <algorithm>
#include <cctype>

#include "dtrain/base/error.h"
#include "launcher/config/launch_config.h"
#include "parse_int.h"

namespace dtrain::launcher {

namespace {

// A host name or address as ssh takes it: no spaces, quotes or shell syntax, no leading '-'
// (which ssh would read as an option). user@host is allowed.
bool validHostName(const std::string& h) {
  if (h.empty() || h.size() > 255 || h[0] == '-') return false;
  return std::all_of(h.begin(), h.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_' ||
           c == '@' || c == ':' || c == '[' || c == ']';
  });
}

int parseSlots(const std::string& text, const std::string& where) {
  int64_t v = 0;
  DTRAIN_CHECK_ARG(parseInt64(text, &v) && v >= 1 && v <= kMaxSlotsPerHost,
                   "{}: slots {} is not a count in 1..{}; HINT: host slots=8", where,
                   quoteValue(text), kMaxSlotsPerHost);
  return static_cast<int>(v);
}

std::vector<int> parseSlotList(const std::string& text, const std::string& where) {
  std::vector<int> slots;
  for (const auto& part : splitAt(text, ',')) {
    int64_t v = 0;
    DTRAIN_CHECK_ARG(parseInt64(part, &v) && v >= 0 && v < kMaxSlotsPerHost,
                     "{}: {} is not a slot number; HINT: host:0,2", where, quoteValue(part));
    DTRAIN_CHECK_ARG(std::find(slots.begin(), slots.end(), v) == slots.end(),
                     "{}: slot {} is named twice", where, v);
    slots.push_back(static_cast<int>(v));
  }
  return slots;
}

}  // namespace

std::vector<HostEntry> parseHostfile(const std::string& text, const std::string& source) {
  std::vector<HostEntry> hosts;
  std::vector<int> lineOf;
  int lineNo = 0;
  for (const auto& raw : splitAt(text, '\n')) {
    ++lineNo;
    std::string line = raw.substr(0, raw.find('#'));
    line = trim(line, " \t\r");
    if (line.empty()) continue;
    const std::string where = source + " line " + std::to_string(lineNo);
    // Fields separated by blanks: the host, then key=value pairs (slots=N; MPI's max_slots
    // is accepted and ignored).
    std::vector<std::string> fields;
    for (const auto& f : splitAt(line, ' ')) {
      for (const auto& g : splitAt(f, '\t')) {
        if (!g.empty()) fields.push_back(g);
      }
    }
    HostEntry e;
    e.host = fields[0];
    DTRAIN_CHECK_ARG(validHostName(e.host),
                     "{}: {} is not a host name; HINT: one host a line, as `host slots=N`", where,
                     quoteValue(e.host));
    for (size_t i = 1; i < fields.size(); ++i) {
      size_t eq = fields[i].find('=');
      std::string key = fields[i].substr(0, eq);
      DTRAIN_CHECK_ARG(eq != std::string::npos && (key == "slots" || key == "max_slots"),
                       "{}: unknown field {}; HINT: `host slots=N`", where, quoteValue(fields[i]));
      if (key == "slots") e.slots = parseSlots(fields[i].substr(eq + 1), where);
    }
    for (size_t i = 0; i < hosts.size(); ++i) {
      DTRAIN_CHECK_ARG(hosts[i].host != e.host,
                       "{}: host {} is listed twice (first on line {}); HINT: list each host "
                       "once, with slots=N for its workers",
                       where, e.host, lineOf[i]);
    }
    hosts.push_back(e);
    lineOf.push_back(lineNo);
  }
  DTRAIN_CHECK_ARG(!hosts.empty(), "{} lists no host; HINT: one host a line, as `host slots=N`",
                   source);
  return hosts;
}

std::vector<HostEntry> parseHostsOption(const std::string& text, const std::string& label) {
  std::vector<HostEntry> hosts;
  for (const auto& part : splitAt(text, ',')) {
    HostEntry e;
    std::string slots;
    if (!part.empty() && part[0] == '[') {  // an IPv6 literal: [fe80::1] or [fe80::1]:4
      size_t close = part.find(']');
      DTRAIN_CHECK_ARG(close != std::string::npos, "{} {}: unclosed '['", label, quoteValue(text));
      e.host = part.substr(1, close - 1);
      if (close + 1 < part.size()) {
        DTRAIN_CHECK_ARG(part[close + 1] == ':', "{} {}: expected ':' after ']'", label,
                         quoteValue(text));
        slots = part.substr(close + 2);
      }
    } else if (size_t colon = part.find(':'); colon != std::string::npos) {
      e.host = part.substr(0, colon);
      slots = part.substr(colon + 1);
    } else {
      e.host = part;
    }
    if (!slots.empty() || (part.find(':') != std::string::npos && part[0] != '[')) {
      e.slots = parseSlots(slots, label + " " + quoteValue(part));
    }
    DTRAIN_CHECK_ARG(validHostName(e.host),
                     "{} {}: {} is not a host name; HINT: "
                     "--hosts a,b or --hosts a:4,b:4",
                     label, quoteValue(text), quoteValue(part));
    for (const auto& h : hosts) {
      DTRAIN_CHECK_ARG(h.host != e.host, "{} {}: host {} is listed twice", label, quoteValue(text),
                       e.host);
    }
    hosts.push_back(e);
  }
  return hosts;
}

std::vector<HostFilterTerm> parseHostFilter(const std::string& text, const std::string& label) {
  std::vector<HostFilterTerm> terms;
  for (const auto& part : splitAt(text, '@')) {
    HostFilterTerm t;
    size_t colon = part.find(':');
    t.host = part.substr(0, colon);
    const std::string where = label + " " + quoteValue(text);
    DTRAIN_CHECK_ARG(validHostName(t.host) && t.host.find(':') == std::string::npos,
                     "{}: {} is not a host; HINT: host, host:0,2, joined by @ "
                     "(worker-0@worker-1:0,1)",
                     where, quoteValue(part));
    if (colon != std::string::npos) t.slots = parseSlotList(part.substr(colon + 1), where);
    for (const auto& o : terms) {
      DTRAIN_CHECK_ARG(o.host != t.host, "{}: host {} is named twice", where, t.host);
    }
    terms.push_back(t);
  }
  return terms;
}

std::vector<HostEntry> applyHostFilters(std::vector<HostEntry> hosts,
                                        const std::vector<HostFilterTerm>& include,
                                        const std::vector<HostFilterTerm>& exclude,
                                        int defaultSlots, const std::string& includeLabel,
                                        const std::string& excludeLabel) {
  auto slotsOf = [&](const HostEntry& h) {
    std::vector<int> all;
    int n = h.slots > 0 ? h.slots : defaultSlots;
    for (int i = 0; i < n; ++i) all.push_back(i);
    return all;
  };
  auto find = [&](const std::string& host, const std::string& label) -> HostEntry& {
    auto it = std::find_if(hosts.begin(), hosts.end(),
                           [&](const HostEntry& h) { return h.host == host; });
    DTRAIN_CHECK_ARG(it != hosts.end(),
                     "{}: host {} is not in the host list; HINT: name a host "
                     "of --hostfile / --hosts",
                     label, host);
    return *it;
  };
  auto checkSlots = [&](const HostEntry& h, const std::vector<int>& slots,
                        const std::string& label) {
    const int n = h.slots > 0 ? h.slots : defaultSlots;
    for (int s : slots) {
      DTRAIN_CHECK_ARG(s < n, "{}: host {} has slots 0..{}, not {}", label, h.host, n - 1, s);
    }
  };
  if (!include.empty()) {
    std::vector<HostEntry> kept;
    for (const auto& t : include) {
      HostEntry h = find(t.host, includeLabel);
      if (!t.slots.empty()) {
        checkSlots(h, t.slots, includeLabel);
        h.gpus = t.slots;
      }
      kept.push_back(h);
    }
    // Keep the host list's order: node ranks follow it.
    std::vector<HostEntry> ordered;
    for (const auto& h : hosts) {
      for (const auto& k : kept) {
        if (k.host == h.host) ordered.push_back(k);
      }
    }
    hosts = ordered;
  }
  for (const auto& t : exclude) {
    HostEntry& h = find(t.host, excludeLabel);
    if (t.slots.empty()) {
      h.host.clear();  // removed below
      continue;
    }
    checkSlots(h, t.slots, excludeLabel);
    std::vector<int> left;
    for (int s : h.gpus.empty() ? slotsOf(h) : h.gpus) {
      if (std::find(t.slots.begin(), t.slots.end(), s) == t.slots.end()) left.push_back(s);
    }
    DTRAIN_CHECK_ARG(!left.empty(),
                     "{}: excludes every slot of host {}; HINT: exclude the "
                     "host itself (without :slots)",
                     excludeLabel, t.host);
    h.gpus = left;
  }
  hosts.erase(
      std::remove_if(hosts.begin(), hosts.end(), [](const HostEntry& h) { return h.host.empty(); }),
      hosts.end());
  DTRAIN_CHECK_ARG(!hosts.empty(), "{} leaves no host to run on", excludeLabel);
  return hosts;
}

namespace {

// Expands the first bracket group of `name` and recurses into the rest.
void expandName(const std::string& name, const std::string& label, const std::string& all,
                std::vector<std::string>* out) {
  size_t open = name.find('[');
  if (open == std::string::npos) {
    DTRAIN_CHECK_ARG(name.find(']') == std::string::npos && !name.empty(),
                     "{} {}: unbalanced ']' or an empty name", label, quoteValue(all));
    out->push_back(name);
    return;
  }
  size_t close = name.find(']', open);
  DTRAIN_CHECK_ARG(close != std::string::npos, "{} {}: '[' without ']'", label, quoteValue(all));
  const std::string head = name.substr(0, open);
  const std::string tail = name.substr(close + 1);
  for (const auto& range : splitAt(name.substr(open + 1, close - open - 1), ',')) {
    size_t dash = range.find('-');
    std::string lo = range.substr(0, dash);
    std::string hi = dash == std::string::npos ? lo : range.substr(dash + 1);
    int64_t a = 0;
    int64_t b = 0;
    DTRAIN_CHECK_ARG(parseInt64(lo, &a) && parseInt64(hi, &b) && a >= 0 && a <= b && b - a < 100000,
                     "{} {}: {} is not a range such as 01-04 or 7", label, quoteValue(all),
                     quoteValue(range));
    const size_t width = lo.size();  // "01-04": keep the padding
    for (int64_t i = a; i <= b; ++i) {
      std::string num = std::to_string(i);
      if (num.size() < width) num.insert(0, width - num.size(), '0');
      expandName(head + num + tail, label, all, out);
    }
  }
}

}  // namespace

std::vector<std::string> expandSlurmNodelist(const std::string& text, const std::string& label) {
  // Split at commas outside brackets.
  std::vector<std::string> names;
  std::string cur;
  int depth = 0;
  for (char c : text) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    DTRAIN_CHECK_ARG(depth >= 0 && depth <= 1, "{} {}: unbalanced brackets", label,
                     quoteValue(text));
    if (c == ',' && depth == 0) {
      names.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  DTRAIN_CHECK_ARG(depth == 0, "{} {}: '[' without ']'", label, quoteValue(text));
  names.push_back(cur);
  std::vector<std::string> out;
  for (const auto& n : names) expandName(n, label, text, &out);
  return out;
}

}  // namespace dtrain::launcher
