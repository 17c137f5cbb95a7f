#include "text.h"

namespace dtrain {

std::vector<std::string> splitAt(const std::string& text, char sep) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    size_t at = text.find(sep, start);
    parts.push_back(text.substr(start, at == std::string::npos ? std::string::npos : at - start));
    if (at == std::string::npos) return parts;
    start = at + 1;
  }
}

std::string trim(const std::string& text, const char* blanks) {
  size_t b = text.find_first_not_of(blanks);
  if (b == std::string::npos) return "";
  size_t e = text.find_last_not_of(blanks);
  return text.substr(b, e - b + 1);
}

}  // namespace dtrain
