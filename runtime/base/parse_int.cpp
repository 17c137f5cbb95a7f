#include "parse_int.h"

#include <charconv>

namespace dtrain {

bool parseInt64(std::string_view text, int64_t* out) {
  int64_t v = 0;
  const char* end = text.data() + text.size();
  auto [at, ec] = std::from_chars(text.data(), end, v, 10);
  if (text.empty() || ec != std::errc() || at != end) return false;
  *out = v;
  return true;
}

}  // namespace dtrain
