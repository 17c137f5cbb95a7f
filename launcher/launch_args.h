#pragma once
// The command line of `launch`: `launch [options] [--] PROGRAM [ARGS...]`.
//
// splitLauncherArgs() finds where the launcher's options end and the program begins (cxxopts does
// not stop at the first positional), normalising torchrun's spellings (`--nproc_per_node=2` ->
// `--nproc-per-node=2`, `--rdzv-id` -> `--run-id`) on the way. parseLaunchArgs() then hands the
// launcher's part to cxxopts, adds DTRAIN_LAUNCH_<OPTION> variables for options not on the command
// line, and fills a LaunchConfig. Neither looks at the machine or starts anything.

#include <map>
#include <string>
#include <vector>

#include "launcher/launch_config.h"

namespace dtrain::launcher {

struct SplitArgs {
  std::vector<std::string> launcherArgs;  // canonical: "--name" or "--name=value"
  std::vector<std::string> program;       // PROGRAM ARGS...; empty when none was given
  bool help = false;                      // --help / -h seen among the launcher's options
  bool version = false;                   // --version seen
};

// `args` excludes argv[0]. Throws InvalidArgument for an unknown option or a missing value.
SplitArgs splitLauncherArgs(const std::vector<std::string>& args);

// What main() should do.
struct ParsedCommand {
  enum class Action { Run, Help, Version };
  Action action = Action::Run;
  LaunchConfig config;
};

// Throws InvalidArgument naming the option (or variable) and what to do. `environment` is the
// launcher's own environment; only its DTRAIN_LAUNCH_* entries are read.
ParsedCommand parseLaunchArgs(const std::vector<std::string>& args,
                              const std::map<std::string, std::string>& environment);

// Applies one option by its canonical name ("max-restarts") as the command line would, and
// records it in config.appliedOptions. Throws InvalidArgument naming `label`.
void applyLaunchOption(LaunchConfig& config, const std::string& name, const std::string& value,
                       const std::string& label);

// `launch --help`.
std::string helpText();

// The environment variable that sets `option` ("nproc-per-node" -> DTRAIN_LAUNCH_NPROC_PER_NODE).
std::string optionEnvName(const std::string& option);

}  // namespace dtrain::launcher
