#pragma once
// One rule for every integer dtrain reads from text -- environment variables, launch flags,
// fault specs, store counters: the whole text is an optional '-' and decimal digits, within
// int64. No spaces, no '+', no hex, no trailing junk (strtoll accepts all four silently).

#include <cstdint>
#include <string_view>

namespace dtrain {

// True and *out set when `text` is such an integer; false (and *out untouched) otherwise.
bool parseInt64(std::string_view text, int64_t* out);

}  // namespace dtrain
