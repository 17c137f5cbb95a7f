#pragma once
// Small text helpers shared by the parsers of dtrain_base and the launcher (fault specs, host
// lists, option values). Internal: not installed.

#include <string>
#include <vector>

namespace dtrain {

// `text` cut at every `sep`: n separators give n + 1 parts, empty ones included ("a,,b" -> "a",
// "", "b"; "" -> one empty part).
std::vector<std::string> splitAt(const std::string& text, char sep);

// `text` without the leading and trailing characters of `blanks`.
std::string trim(const std::string& text, const char* blanks = " \t");

}  // namespace dtrain
