#pragma once
// Which file the workers execute and with which argv: `./train --lr 1` runs as is, `train.py`
// runs under --python (as torchrun does), `--module pkg.train` as `python -m pkg.train`.
// workerCommandLine() decides it from the config alone; resolveWorkerCommand() then finds the
// file on disk (PATH search) and refuses a missing one (exit 127) or an unexecutable one (126)
// before anything starts.

#include <string>
#include <vector>

#include "dtrain/base/error.h"
#include "launcher/config/launch_config.h"

namespace dtrain::launcher {

// The program (or its interpreter, or its script) does not exist: exit code 127.
class ProgramNotFound : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};

// It exists but cannot be executed (mode, a directory): exit code 126.
class ProgramNotExecutable : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};

struct WorkerCommand {
  std::string file;               // what to execve: a path, or a name to look up on PATH
  std::vector<std::string> argv;  // argv[0] as the user spelled it
  std::string script;             // the .py script when run under the interpreter, else empty
  bool interpreted = false;       // file is --python (a .py script, or --module)
};

// Pure: the command line every worker runs.
WorkerCommand workerCommandLine(const LaunchConfig& config);

// Resolves `command.file` against `pathEnv` (the PATH value) and checks the script; returns the
// command with `file` a path that execve accepts. `host` names this machine in messages.
WorkerCommand resolveWorkerCommand(WorkerCommand command, const std::string& pathEnv,
                                   const std::string& host);

// The directories of a PATH value, in order; an empty entry is the current directory.
std::vector<std::string> pathDirectories(const std::string& pathValue);

// "a b 'c d'": argv quoted for a POSIX shell, for messages and --dry-run.
std::string shellQuote(const std::vector<std::string>& argv);

}  // namespace dtrain::launcher
