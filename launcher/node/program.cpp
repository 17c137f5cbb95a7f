#include "launcher/node/program.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "launcher/node/shell_quote.h"

namespace dtrain::launcher {

namespace {

bool endsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Checks one candidate path: 0 when executable, else the exit code it earns (126 / 127) with
// `why` filled in.
int checkExecutable(const std::string& path, std::string* why) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    *why = std::strerror(errno);
    return errno == EACCES ? 126 : 127;
  }
  if (S_ISDIR(st.st_mode)) {
    *why = "is a directory";
    return 126;
  }
  if (::access(path.c_str(), X_OK) != 0) {
    *why = fmt::format("is not executable (mode {:o})", st.st_mode & 07777);
    return 126;
  }
  return 0;
}

std::string findOnPath(const std::string& name, const std::string& what, const std::string& pathEnv,
                       const std::string& host) {
  std::string firstProblem;
  for (const std::string& dir : pathDirectories(pathEnv)) {
    std::string candidate = dir + "/" + name;
    std::string why;
    int code = checkExecutable(candidate, &why);
    if (code == 0) return candidate;
    if (code == 126 && firstProblem.empty()) firstProblem = excerpt(candidate) + " " + why;
  }
  if (!firstProblem.empty()) {
    DTRAIN_THROW(ProgramNotExecutable,
                 "{} {} on host {}: {}; HINT: chmod +x it, or give a "
                 "path",
                 what, quoteValue(name), host, firstProblem);
  }
  DTRAIN_THROW(ProgramNotFound,
               "{} {} not found on host {}: no such file in any PATH "
               "directory; HINT: give a path such as ./{}",
               what, quoteValue(name), host, excerpt(name));
}

}  // namespace

std::vector<std::string> pathDirectories(const std::string& pathValue) {
  std::vector<std::string> dirs = splitAt(pathValue, ':');
  for (auto& dir : dirs) {
    if (dir.empty()) dir = ".";
  }
  return dirs;
}

WorkerCommand workerCommandLine(const LaunchConfig& config) {
  WorkerCommand cmd;
  if (config.module) {
    cmd.file = config.python;
    cmd.argv = {config.python, "-m", config.program};
    cmd.interpreted = true;
  } else if (!config.noPython && endsWith(config.program, ".py")) {
    cmd.file = config.python;
    cmd.argv = {config.python, config.program};
    cmd.script = config.program;
    cmd.interpreted = true;
  } else {
    cmd.file = config.program;
    cmd.argv = {config.program};
  }
  cmd.argv.insert(cmd.argv.end(), config.programArgs.begin(), config.programArgs.end());
  return cmd;
}

WorkerCommand resolveWorkerCommand(WorkerCommand command, const std::string& pathEnv,
                                   const std::string& host) {
  const std::string what = command.interpreted ? "interpreter (--python)" : "program";
  if (command.file.find('/') == std::string::npos) {
    command.file = findOnPath(command.file, what, pathEnv, host);
  } else {
    std::string why;
    int code = checkExecutable(command.file, &why);
    if (code == 127) {
      DTRAIN_THROW(ProgramNotFound, "{} {} not found on host {}: {}; HINT: check the path", what,
                   quoteValue(command.file), host, why);
    }
    if (code == 126) {
      DTRAIN_THROW(ProgramNotExecutable,
                   "{} {} on host {} {}; HINT: chmod +x it, or run a "
                   "script through its interpreter",
                   what, quoteValue(command.file), host, why);
    }
  }
  if (!command.script.empty()) {
    struct stat st {};
    if (::stat(command.script.c_str(), &st) != 0) {
      DTRAIN_THROW(ProgramNotFound, "script {} not found on host {}: {}; HINT: check the path",
                   quoteValue(command.script), host, std::strerror(errno));
    }
    if (::access(command.script.c_str(), R_OK) != 0) {
      DTRAIN_THROW(ProgramNotExecutable, "script {} on host {} is not readable: {}",
                   quoteValue(command.script), host, std::strerror(errno));
    }
  }
  return command;
}

std::string shellQuote(const std::vector<std::string>& argv) {
  std::string out;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (i) out += ' ';
    bool plain = !a.empty() &&
                 a.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRST"
                                     "UVWXYZ0123456789_-+=/.,:@%") == std::string::npos;
    out += plain ? a : remote::singleQuote(a);
  }
  return out;
}

}  // namespace dtrain::launcher
