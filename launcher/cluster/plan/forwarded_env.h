#pragma once
// The environment every node's workers get from the master (docs/design.md, "Forwarded
// environment"): NCCL_*, GLOO_*, TORCH_*, PATH, LD_LIBRARY_PATH, PYTHONPATH, the runtime settings
// DTRAIN_VERBOSE / _BACKEND / _SHM / _FAULT / _IO_FAULT, the lines of a `.dtrain_env` file in the
// working directory (DeepSpeed's `.deepspeed_env` habit) and --env KEY=VALUE, later ones winning.
// Never DTRAIN_LAUNCH_* (options of this launch only) and never the job token (it travels on its
// own). Pure functions; the agent plan carries the result on ssh's stdin.

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace dtrain::launcher {

using EnvMap = std::map<std::string, std::string>;

constexpr const char* kDotEnvFile = ".dtrain_env";

// True for a variable the master forwards from its own environment.
bool isForwardedVariable(const std::string& name);

// `KEY=VALUE` lines; blank lines and `#` comments skipped; an optional leading `export `;
// values taken literally (no quotes removed, no expansion). Throws InvalidArgument naming
// `source` and the line for anything else, and for a variable launch sets itself.
std::vector<std::pair<std::string, std::string>> parseDotEnv(const std::string& text,
                                                             const std::string& source);

// What the master sends: the forwarded part of `inherited`, then `dotEnv`, then `env` (--env).
EnvMap forwardedEnvironment(const EnvMap& inherited,
                            const std::vector<std::pair<std::string, std::string>>& dotEnv,
                            const std::vector<std::pair<std::string, std::string>>& env);

}  // namespace dtrain::launcher
