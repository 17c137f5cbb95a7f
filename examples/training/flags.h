#pragma once
// Flags: reading a sample trainer's command line (parsed with cxxopts). A bad value is a usage
// error: one line on stderr that names the flag, and exit code 2.
//
//   o.width = number<int64_t>(result, "width", 1, 4096);  // else: "--width must be an integer ..."
//
// Every trainer ends its flags with the job's (addJobFlags: --device, --threads, rank 0's metrics
// sinks, --help) and parses with parseFlags.

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>

#include <cxxopts.hpp>
#include <fmt/format.h>

namespace examples {

// Prints "<program>: <message> (see --help)" on stderr and exits 2.
[[noreturn]] inline void usageError(const std::string& message) {
  std::fprintf(stderr, "%s: %s (see --help)\n", program_invocation_short_name, message.c_str());
  std::exit(2);
}

// Reads flag `name` as a number in [min, max]; a bad value is a usage error naming the flag.
template <typename T>
T number(const cxxopts::ParseResult& r, const std::string& name, double min, double max) {
  const std::string text = r[name].as<std::string>();
  char* end = nullptr;
  errno = 0;
  const double value = std::strtod(text.c_str(), &end);
  const bool integral = std::is_integral_v<T>;
  if (text.empty() || *end != '\0' || errno != 0 || value < min || value > max ||
      (integral && value != std::floor(value))) {
    usageError("--" + name + " must be " + (integral ? "an integer" : "a number") + " in [" +
               fmt::format("{}", min) + ", " + fmt::format("{}", max) + "], got '" + text + "'");
  }
  return static_cast<T>(value);
}

// The flags every sample trainer ends its list with: where it runs and where rank 0's own
// metrics go.
struct JobFlags {
  std::string device = "auto";  // auto | cpu | cuda
  int64_t threads = 0;          // intra-op threads per rank; 0: OMP_NUM_THREADS (launch sets it)
  std::string metricsFile;      // rank 0's JSONL file; empty: none
  int metricsPort = -1;         // rank 0's Prometheus endpoint; -1: none, 0: a free port
  std::string tensorboardDir;   // rank 0's TensorBoard events; empty: none
};

// Declares the job's flags (and --help) in `spec`, with the defaults of `defaults`.
inline void addJobFlags(cxxopts::Options& spec, const JobFlags& defaults) {
  auto none = [] { return cxxopts::value<std::string>(); };
  // clang-format off
  spec.add_options()
      ("device", "auto | cpu | cuda",
                 cxxopts::value<std::string>()->default_value(defaults.device))
      ("threads", "threads per rank (0: OMP_NUM_THREADS, set by launch)",
                  cxxopts::value<std::string>()->default_value(std::to_string(defaults.threads)))
      ("metrics-file", "a JSON record per step, appended (rank 0; default: none)", none())
      ("metrics-port", "Prometheus endpoint (rank 0; 0: a free port; default: none)", none())
      ("tensorboard-dir", "TensorBoard event files (rank 0; default: none)", none())
      ("h,help", "print this help");
  // clang-format on
}

inline JobFlags readJobFlags(const cxxopts::ParseResult& r) {
  JobFlags f;
  f.device = r["device"].as<std::string>();
  if (f.device != "auto" && f.device != "cpu" && f.device != "cuda") {
    usageError("--device must be auto, cpu or cuda, got '" + f.device + "'");
  }
  f.threads = number<int64_t>(r, "threads", 0, 1024);
  if (r.count("metrics-file")) f.metricsFile = r["metrics-file"].as<std::string>();
  if (r.count("metrics-port")) f.metricsPort = number<int>(r, "metrics-port", 0, 65535);
  if (r.count("tensorboard-dir")) f.tensorboardDir = r["tensorboard-dir"].as<std::string>();
  return f;
}

// Parses the command line against `spec`: a parse error or an unexpected argument is a usage
// error; --help prints the help and exits 0.
inline cxxopts::ParseResult parseFlags(cxxopts::Options& spec, int argc, char** argv) {
  cxxopts::ParseResult r;
  try {
    r = spec.parse(argc, argv);
  } catch (const cxxopts::exceptions::exception& e) {
    usageError(e.what());
  }
  if (r.count("help")) {
    std::fputs(spec.help().c_str(), stdout);
    std::exit(0);
  }
  if (!r.unmatched().empty()) usageError("unexpected argument '" + r.unmatched()[0] + "'");
  return r;
}

}  // namespace examples
