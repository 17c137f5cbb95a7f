#pragma once
// The command line of `launch`: `launch [options] [--] PROGRAM [ARGS...]`.
//
// splitLauncherArgs() reads the launcher's options against the option table (launch_args.cpp,
// one row per option) and finds where the program begins, normalising torchrun's spellings
// (`--nproc_per_node=2` -> nproc-per-node, `--rdzv-id` -> run-id) on the way. parseLaunchArgs()
// applies them, adds DTRAIN_LAUNCH_<OPTION> variables for options not on the command line, and
// fills a LaunchConfig. Neither looks at the machine or starts anything. See Note [Option
// parsing] for why no option library reads the command line.

#include <map>
#include <string>
#include <vector>

#include "launcher/config/launch_config.h"

namespace dtrain::launcher {

// One option as given: its canonical long name ("nproc-per-node") and value ("true" for a flag).
struct OptionValue {
  std::string name;
  std::string value;
  bool operator==(const OptionValue& o) const { return name == o.name && value == o.value; }
};

struct SplitArgs {
  std::vector<OptionValue> options;  // the launcher's, in command-line order
  std::vector<std::string> program;  // PROGRAM ARGS...; empty when none was given
  bool help = false;                 // --help / -h seen among the launcher's options
  bool version = false;              // --version seen
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

// The canonical names of the options that take a value, in the table's order.
std::vector<std::string> valueOptionNames();

// The environment variable that sets `option` ("nproc-per-node" -> DTRAIN_LAUNCH_NPROC_PER_NODE).
std::string optionEnvName(const std::string& option);

}  // namespace dtrain::launcher
