#pragma once
// A strict parser of the Prometheus text exposition format (0.0.4) for tests: a scrape is
// checked by parsing it, never by grepping. Every line must be a comment (# HELP / # TYPE), blank,
// or `name{label="value",...} value`; anything else is an error naming the line. Samples of one
// metric must be contiguous and follow its # TYPE line, as the format requires.

#include <cmath>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace dtrain::testing {

struct PromSample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

struct PromScrape {
  std::vector<PromSample> samples;
  std::map<std::string, std::string> types;  // metric -> counter | gauge | ...
  std::map<std::string, std::string> help;

  // Samples of `name` whose labels include every pair of `match`.
  std::vector<PromSample> find(const std::string& name,
                               const std::map<std::string, std::string>& match = {}) const {
    std::vector<PromSample> out;
    for (const auto& s : samples) {
      if (s.name != name) continue;
      bool ok = true;
      for (const auto& [k, v] : match) {
        auto it = s.labels.find(k);
        ok = ok && it != s.labels.end() && it->second == v;
      }
      if (ok) out.push_back(s);
    }
    return out;
  }
  // The one sample of `name` with exactly these labels; nullopt when absent.
  std::optional<double> value(const std::string& name,
                              const std::map<std::string, std::string>& labels = {}) const {
    for (const auto& s : samples) {
      if (s.name == name && s.labels == labels) return s.value;
    }
    return std::nullopt;
  }
};

inline bool promNameChar(char c, bool first) {
  return c == '_' || c == ':' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         (!first && c >= '0' && c <= '9');
}

inline PromScrape parsePrometheusText(const std::string& text) {
  PromScrape out;
  std::set<std::string> finished;  // metrics whose block has ended
  std::string current;
  size_t at = 0;
  int number = 0;
  auto fail = [&](const std::string& line, const std::string& why) {
    throw std::runtime_error("line " + std::to_string(number) + " (" + line + "): " + why);
  };
  while (at < text.size()) {
    size_t nl = text.find('\n', at);
    if (nl == std::string::npos) {
      throw std::runtime_error("the exposition does not end with a newline");
    }
    std::string line = text.substr(at, nl - at);
    at = nl + 1;
    ++number;
    if (line.empty()) continue;
    if (line[0] == '#') {
      if (line.rfind("# HELP ", 0) == 0 || line.rfind("# TYPE ", 0) == 0) {
        size_t sp = line.find(' ', 7);
        std::string name = line.substr(7, sp == std::string::npos ? std::string::npos : sp - 7);
        if (name.empty() || sp == std::string::npos) fail(line, "no metric name or text");
        std::string rest = line.substr(sp + 1);
        if (line[2] == 'T') {
          static const std::set<std::string> kinds{"counter", "gauge", "histogram", "summary",
                                                   "untyped"};
          if (!kinds.count(rest)) fail(line, "unknown type " + rest);
          if (out.types.count(name)) fail(line, "a second TYPE for " + name);
          if (finished.count(name)) fail(line, "TYPE after the samples of " + name);
          out.types[name] = rest;
        } else {
          out.help[name] = rest;
        }
        if (name != current) {
          if (!current.empty()) finished.insert(current);
          current = name;
        }
      }
      continue;
    }
    PromSample s;
    size_t i = 0;
    while (i < line.size() && promNameChar(line[i], i == 0)) ++i;
    if (i == 0) fail(line, "no metric name");
    s.name = line.substr(0, i);
    if (i < line.size() && line[i] == '{') {
      ++i;
      while (i < line.size() && line[i] != '}') {
        size_t start = i;
        while (i < line.size() && promNameChar(line[i], i == start) && line[i] != ':') ++i;
        std::string key = line.substr(start, i - start);
        if (key.empty() || i + 1 >= line.size() || line[i] != '=' || line[i + 1] != '"') {
          fail(line, "bad label");
        }
        i += 2;
        std::string value;
        while (i < line.size() && line[i] != '"') {
          if (line[i] == '\\' && i + 1 < line.size()) {
            char e = line[i + 1];
            value += e == 'n' ? '\n' : e;
            i += 2;
          } else {
            value += line[i++];
          }
        }
        if (i >= line.size()) fail(line, "unterminated label value");
        ++i;  // closing quote
        if (s.labels.count(key)) fail(line, "label " + key + " twice");
        s.labels[key] = value;
        if (i < line.size() && line[i] == ',') ++i;
      }
      if (i >= line.size()) fail(line, "unterminated label set");
      ++i;  // '}'
    }
    if (i >= line.size() || line[i] != ' ') fail(line, "no value");
    std::string value = line.substr(i + 1);
    size_t sp = value.find(' ');  // an optional timestamp follows
    if (sp != std::string::npos) value.resize(sp);
    if (value == "NaN") {
      s.value = std::nan("");
    } else if (value == "+Inf") {
      s.value = HUGE_VAL;
    } else if (value == "-Inf") {
      s.value = -HUGE_VAL;
    } else {
      char* end = nullptr;
      s.value = std::strtod(value.c_str(), &end);
      if (end == value.c_str() || *end != '\0') fail(line, "value is not a number");
    }
    if (s.name != current) {
      if (finished.count(s.name)) fail(line, "samples of " + s.name + " are not contiguous");
      if (!current.empty()) finished.insert(current);
      current = s.name;
    }
    for (const auto& other : out.samples) {
      if (other.name == s.name && other.labels == s.labels) fail(line, "a repeated series");
    }
    out.samples.push_back(std::move(s));
  }
  return out;
}

}  // namespace dtrain::testing
