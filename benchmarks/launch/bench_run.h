#pragma once
// Process plumbing shared by launch_bench's one-node and multi-node parts: run commands to
// completion and time them, medians, shell helpers.

#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::bench {

// Runs every command of `argvs` at once, to completion, stdout and stdin on /dev/null (stderr
// kept for failures); returns seconds until the last exited, negative when any did not exit 0
// (and *failure says which and why). `startNs`: CLOCK_MONOTONIC at the first fork, in ns.
double timeRunAll(const std::vector<std::vector<std::string>>& argvs, std::string* failure,
                  int64_t* startNs = nullptr);

// `copies` instances of argv at once.
double timeRun(const std::vector<std::string>& argv, std::string* failure, int copies = 1);

double median(std::vector<double> v);
double minimum(const std::vector<double>& v);
bool executable(const std::string& path);
// The stdout of `sh -c command`, trailing newlines and spaces removed; *rc its exit code.
std::string shellOut(const std::string& command, int* rc = nullptr);
std::vector<std::string> cat(std::vector<std::string> a, const std::vector<std::string>& b);
// CLOCK_MONOTONIC in ns: one clock for every process of this machine, network namespaces too.
int64_t monotonicNs();
// /proc/loadavg's first three fields.
std::string loadAverage();

}  // namespace dtrain::bench
