#pragma once
// What DDP's reducer (reducer.cpp) and ZeRO's backward (../zero/gradient_sync.cpp) share of a
// synchronised backward pass: findUnusedParameters' search, and the messages a pass fails or
// warns with. `who` names the object the user built ("DistributedDataParallel",
// "ShardedOptimizer").

#include <cstddef>
#include <exception>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include <ATen/core/Tensor.h>

#include "../torch_compat.h"

namespace dtrain::ddp {

// The parameters a pass's forward outputs cannot reach (findUnusedParameters).
class UnusedSearch {
 public:
  // After a forward whose backward synchronises: `accumulators[i]` is parameter i's gradient
  // accumulator. `rearm`: a second forward before one backward (a siamese network) -- a
  // parameter is used if either forward's outputs reach it.
  void search(const std::vector<at::Tensor>& outputs,
              const std::vector<compat::NodePtr>& accumulators, bool rearm);
  void clear();
  const std::vector<size_t>& unused() const { return unused_; }

 private:
  std::unordered_set<const torch::autograd::Node*> reachable_;
  std::vector<size_t> unused_;
};

// "a, b, c and 3 more": at most `limit` names.
std::string listNames(const std::vector<std::string>& names, size_t limit = 8);

// Parameter `name`'s gradient arrived a second time in one pass.
[[noreturn]] void throwGradientTwice(const char* who, int rank, const std::string& name,
                                     bool findUnused);
// The end of a pass in which `names` (`missing` of `total` parameters) got no gradient.
[[noreturn]] void throwNoGradient(const char* who, int rank, size_t missing, size_t total,
                                  const std::string& names, bool findUnused);
// The end of a pass: `finalize(missing)` collects the indices of the parameters that got no
// gradient; `reset()` then runs whether or not it threw, so that the next pass starts clean, and
// finalize's error is rethrown after it.
template <class Finalize, class Reset>
std::vector<size_t> finishPass(Finalize&& finalize, Reset&& reset) {
  std::vector<size_t> missing;
  std::exception_ptr error;
  try {
    finalize(missing);
  } catch (...) {
    error = std::current_exception();
  }
  reset();
  if (error) std::rethrow_exception(error);
  return missing;
}

// Refuses a backward pass while the previous one is unfinished (an exception escaped it after
// `launched` of `total` collectives, named `what`, were issued): the ranks' collectives no longer
// line up. `who` names the wrapper in the message.
void checkPreviousPassEnded(bool unfinished, int rank, const char* who, size_t launched,
                            size_t total, const char* what);

// A backward reached the parameters without a forward through the wrapper (logged once).
void warnBackwardWithoutForward(const char* who, int rank);

}  // namespace dtrain::ddp
