#pragma once
// Process plumbing shared by the launch benchmarks (launch_bench's one-node and multi-node parts,
// crash_latency_bench): run commands to completion and time them, shell helpers, and their
// hand-written command lines; with the statistics every benchmark shares (common/stats.h).

#include <cstdint>
#include <string>
#include <vector>

#include "common/stats.h"

namespace dtrain::bench {

// Runs every command of `argvs` at once, to completion, stdout and stdin on /dev/null (stderr
// kept for failures); returns seconds until the last exited, negative when any did not exit 0
// (and *failure says which and why). `startNs`: CLOCK_MONOTONIC at the first fork, in ns.
double timeRunAll(const std::vector<std::vector<std::string>>& argvs, std::string* failure,
                  int64_t* startNs = nullptr);

// `copies` instances of argv at once.
double timeRun(const std::vector<std::string>& argv, std::string* failure, int copies = 1);

bool executable(const std::string& path);
// The stdout of `sh -c command`, trailing newlines and spaces removed; *rc its exit code.
std::string shellOut(const std::string& command, int* rc = nullptr);
std::vector<std::string> cat(std::vector<std::string> a, const std::vector<std::string>& b);
// CLOCK_MONOTONIC in ns: one clock for every process of this machine, network namespaces too.
int64_t monotonicNs();
// /proc/loadavg's first three fields.
std::string loadAverage();

// In a forked child: replaces the process with argv (argv[0] a path); exits 127 when it cannot.
[[noreturn]] void execArgv(const std::vector<std::string>& argv);

// "localhost:<a port free on 127.0.0.1 right now>", for a launcher's rendezvous endpoint.
std::string freeLocalEndpoint();

// A benchmark's command line, read flag by flag:
//
//   Flags flags("launch_bench", kUsage, argc, argv);
//   while (flags.next()) {
//     if (flags.flag() == "--reps") o.reps = std::atoi(flags.value().c_str());
//     else flags.usageError("unknown flag " + flags.flag());
//   }
//
// --help or -h prints the usage and exits 0; usageError(), or a flag without its value, prints
// what was wrong and the usage on stderr and exits 2.
class Flags {
 public:
  Flags(std::string program, const char* usage, int argc, char** argv);
  // Moves to the next flag; false after the last one.
  bool next();
  const std::string& flag() const { return flag_; }
  // The argument after the flag.
  std::string value();
  [[noreturn]] void usageError(const std::string& what) const;

 private:
  std::string program_;
  const char* usage_;
  int argc_;
  char** argv_;
  int at_ = 0;
  std::string flag_;
};

}  // namespace dtrain::bench
