#include "dtrain/base/error.h"

#include <cstring>

namespace dtrain::detail {

std::string withLocation(const std::string& message, const char* file, int line) {
  const char* slash = std::strrchr(file, '/');
  const char* base = slash ? slash + 1 : file;
  return fmt::format("{} [{}:{}]", message, base, line);
}

}  // namespace dtrain::detail
