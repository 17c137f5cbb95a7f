#include "dtrain/base/timeout.h"

#include "dtrain/base/error.h"

namespace dtrain {

std::chrono::milliseconds timeoutOrDefault(std::chrono::milliseconds requested,
                                           std::chrono::milliseconds byDefault, const char* what) {
  DTRAIN_CHECK_ARG(requested.count() >= 0,
                   "{} is {} ms: a timeout cannot be negative. HINT: zero means the default "
                   "deadline ({} ms)",
                   what, requested.count(), byDefault.count());
  return requested.count() == 0 ? byDefault : requested;
}

}  // namespace dtrain
