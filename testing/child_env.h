#pragma once
// childEnvironment: the environment a test or benchmark starts a process with. Header-only and
// gtest-free, like free_port.h, so that the simulated cluster uses it without the test support
// library.

#include <map>
#include <string>
#include <vector>

extern char** environ;

namespace dtrain::testing {

// This process's environment as "KEY=VALUE" strings sorted by key, less the variables whose names
// start with `dropPrefix` (none when it is empty), with each "KEY=VALUE" of `env` set over it and
// each "KEY=" removing KEY.
inline std::vector<std::string> childEnvironment(const std::vector<std::string>& env,
                                                 const std::string& dropPrefix = "") {
  std::map<std::string, std::string> vars;
  for (char** e = environ; *e; ++e) {
    std::string s(*e);
    const size_t eq = s.find('=');
    if (eq == std::string::npos) continue;
    std::string key = s.substr(0, eq);
    if (!dropPrefix.empty() && key.rfind(dropPrefix, 0) == 0) continue;
    vars[key] = s.substr(eq + 1);
  }
  for (const auto& kv : env) {
    const size_t eq = kv.find('=');
    if (eq + 1 == kv.size()) {
      vars.erase(kv.substr(0, eq));
    } else {
      vars[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
  }
  std::vector<std::string> out;
  for (const auto& [k, v] : vars) out.push_back(k + "=" + v);
  return out;
}

}  // namespace dtrain::testing
