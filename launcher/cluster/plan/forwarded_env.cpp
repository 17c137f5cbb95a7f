#include "launcher/cluster/plan/forwarded_env.h"

#include <algorithm>
#include <cctype>

#include "dtrain/base/error.h"
#include "env_contract.h"
#include "launcher/config/launch_config.h"

namespace dtrain::launcher {

namespace {

bool startsWith(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

bool validName(const std::string& name) {
  if (name.empty() || std::isdigit(static_cast<unsigned char>(name[0]))) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
}

}  // namespace

bool isForwardedVariable(const std::string& name) {
  if (startsWith(name, env::kLaunchOptionPrefix) || name == env::kStoreToken) return false;
  for (const char* prefix : {"NCCL_", "GLOO_", "TORCH_"}) {
    if (startsWith(name, prefix)) return true;
  }
  for (const char* exact : {"PATH", "LD_LIBRARY_PATH", "PYTHONPATH", env::kVerbose, env::kBackend,
                            env::kShm, env::kFault, env::kIoFault, env::kJoinWait}) {
    if (name == exact) return true;
  }
  return false;
}

std::vector<std::pair<std::string, std::string>> parseDotEnv(const std::string& text,
                                                             const std::string& source) {
  std::vector<std::pair<std::string, std::string>> out;
  size_t start = 0;
  int lineNo = 0;
  while (start <= text.size()) {
    size_t nl = text.find('\n', start);
    std::string line = text.substr(start, nl == std::string::npos ? nl : nl - start);
    ++lineNo;
    start = nl == std::string::npos ? text.size() + 1 : nl + 1;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    size_t first = line.find_first_not_of(" \t");
    if (first == std::string::npos || line[first] == '#') continue;
    line = line.substr(first);
    if (startsWith(line, "export ")) line = line.substr(7);
    size_t eq = line.find('=');
    std::string key = line.substr(0, eq);
    DTRAIN_CHECK_ARG(eq != std::string::npos && validName(key),
                     "{} line {}: {} is not KEY=VALUE; HINT: one assignment a line, e.g. "
                     "NCCL_IB_HCA=mlx5",
                     source, lineNo, quoteValue(line));
    DTRAIN_CHECK_ARG(!isReservedWorkerVariable(key) && key != env::kStoreToken &&
                         !startsWith(key, env::kLaunchOptionPrefix),
                     "{} line {}: {} is set by launch itself; HINT: remove the line", source,
                     lineNo, key);
    out.emplace_back(key, line.substr(eq + 1));
  }
  return out;
}

EnvMap forwardedEnvironment(const EnvMap& inherited,
                            const std::vector<std::pair<std::string, std::string>>& dotEnv,
                            const std::vector<std::pair<std::string, std::string>>& env) {
  EnvMap out;
  for (const auto& [key, value] : inherited) {
    if (isForwardedVariable(key)) out[key] = value;
  }
  for (const auto& [key, value] : dotEnv) out[key] = value;
  for (const auto& [key, value] : env) out[key] = value;
  return out;
}

}  // namespace dtrain::launcher
