// launch: start, supervise and restart a distributed training job.
//
//   launch [options] [--] PROGRAM [ARGS...]      see `launch --help`
//
// main() only splits the command line, dispatches on the command table below and maps
// exceptions to launch's exit codes (docs/design.md#exit-codes); the work is in dtrain_launcher.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "dtrain/base/error.h"
#include "dtrain/base/logging.h"
#include "launcher/cluster/multinode.h"
#include "launcher/config/launch_args.h"
#include "launcher/exit_codes.h"
#include "launcher/job/job.h"
#include "launcher/node/program.h"
#include "launcher/node/worker_env.h"

namespace dtrain::launcher {
const char* launcherVersion();
}

namespace {

using dtrain::launcher::kExitInfrastructure;
using dtrain::launcher::kExitNotExecutable;
using dtrain::launcher::kExitNotFound;
using dtrain::launcher::kExitUsage;
using dtrain::launcher::ParsedCommand;

int printHelp(const ParsedCommand&, const dtrain::launcher::EnvMap&) {
  std::fputs(dtrain::launcher::helpText().c_str(), stdout);
  return 0;
}

int printVersion(const ParsedCommand&, const dtrain::launcher::EnvMap&) {
  std::printf("launch (dtrain) %s\n", dtrain::launcher::launcherVersion());
  return 0;
}

int runJob(const ParsedCommand& command, const dtrain::launcher::EnvMap& environment) {
  const auto& config = command.config;
  if (config.agent) return dtrain::launcher::runAgentFromStdin(config, environment);
  if (dtrain::launcher::isMultiNode(config)) {
    return dtrain::launcher::runMultiNode(config, environment);
  }
  return dtrain::launcher::runJob(config, environment);
}

// The command table: what each parsed action runs.
struct Command {
  ParsedCommand::Action action;
  int (*run)(const ParsedCommand&, const dtrain::launcher::EnvMap&);
};
constexpr Command kCommands[] = {
    {ParsedCommand::Action::Help, printHelp},
    {ParsedCommand::Action::Version, printVersion},
    {ParsedCommand::Action::Run, runJob},
};

void usageError(const std::string& what, const char* exitNote) {
  std::fprintf(stderr, "launch: %s -- nothing was started%s\n", what.c_str(), exitNote);
}

// Pipes to workers must never land on fds 0-2: give a closed standard descriptor /dev/null.
void ensureStandardFds() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) < 0) {
      int nul = ::open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
      if (nul >= 0 && nul != fd) {
        ::dup2(nul, fd);
        ::close(nul);
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  ensureStandardFds();
  dtrain::log::setTag("[launch]");
  std::vector<std::string> args(argv + 1, argv + argc);
  const dtrain::launcher::EnvMap environment = dtrain::launcher::currentEnvironment();
  try {
    ParsedCommand parsed = dtrain::launcher::parseLaunchArgs(args, environment);
    for (const auto& c : kCommands) {
      if (c.action == parsed.action) return c.run(parsed, environment);
    }
    return kExitInfrastructure;
  } catch (const dtrain::launcher::ProgramNotFound& e) {
    usageError(e.what(), " (exit 127: not found)");
    return kExitNotFound;
  } catch (const dtrain::launcher::ProgramNotExecutable& e) {
    usageError(e.what(), " (exit 126: not executable)");
    return kExitNotExecutable;
  } catch (const dtrain::InvalidArgument& e) {
    usageError(e.what(), " (exit 2: usage error; see launch --help)");
    return kExitUsage;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "launch: error: %s (exit 125: launcher or infrastructure error)\n",
                 e.what());
    return kExitInfrastructure;
  } catch (...) {
    std::fprintf(stderr, "launch: error: an unexpected exception (exit 125: launcher or "
                         "infrastructure error)\n");
    return kExitInfrastructure;
  }
}
