#pragma once
// Flags: reading a sample trainer's command line (parsed with cxxopts). A bad value is a usage
// error: one line on stderr that names the flag, and exit code 2.
//
//   o.width = number<int64_t>(result, "width", 1, 4096);  // else: "--width must be an integer ..."

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

}  // namespace examples
