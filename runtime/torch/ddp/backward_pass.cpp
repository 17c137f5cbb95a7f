#include "backward_pass.h"

#include <fmt/format.h>

#include "dtrain/base/error.h"
#include "dtrain/base/logging.h"
#include "reducer.h"

namespace dtrain::ddp {

void UnusedSearch::search(const std::vector<at::Tensor>& outputs,
                          const std::vector<compat::NodePtr>& accumulators, bool rearm) {
  auto nodes = reachableNodes(outputs);
  if (rearm) {
    reachable_.insert(nodes.begin(), nodes.end());
  } else {
    reachable_ = std::move(nodes);
  }
  unused_.clear();
  for (size_t i = 0; i < accumulators.size(); ++i) {
    if (!reachable_.count(accumulators[i].get())) unused_.push_back(i);
  }
}

void UnusedSearch::clear() {
  reachable_.clear();
  unused_.clear();
}

std::string listNames(const std::vector<std::string>& names, size_t limit) {
  std::string out;
  for (size_t k = 0; k < names.size() && k < limit; ++k) out += (k ? ", " : "") + names[k];
  if (names.size() > limit) out += fmt::format(" and {} more", names.size() - limit);
  return out;
}

void throwGradientTwice(const char* who, int rank, const std::string& name, bool findUnused) {
  DTRAIN_THROW(Error,
               "rank {}: {}: parameter {} received a gradient {} in this backward pass. HINT: {}",
               rank, who, name, findUnused ? "although no forward output reaches it" : "twice",
               findUnused ? "compute the loss from the tensors the wrapper's forward returned"
                          : "a parameter's gradient must be accumulated once per backward (no "
                            "reentrant checkpointing, no second backward through the same graph)");
}

void throwNoGradient(const char* who, int rank, size_t missing, size_t total,
                     const std::string& names, bool findUnused) {
  DTRAIN_THROW(Error,
               "rank {}: {}: {} of {} parameters received no gradient in this backward pass: {}. "
               "HINT: {}",
               rank, who, missing, total, names,
               findUnused ? "the forward's outputs reach them but the loss does not; compute the "
                            "loss from every output the wrapper's forward returned"
                          : "if the model skips them in some iterations, construct "
                            "DistributedDataParallel with DdpOptions::findUnusedParameters = "
                            "true; otherwise exclude them from the module or freeze them "
                            "(requires_grad(false))");
}

void checkPreviousPassEnded(bool unfinished, int rank, const char* who, size_t launched,
                            size_t total, const char* what) {
  DTRAIN_CHECK(!unfinished,
               "rank {}: {}: the previous backward pass stopped after {} of {} {} were launched, "
               "so the ranks' collectives no longer line up. HINT: an exception escaped that "
               "backward; end the job (or restart it) rather than train on",
               rank, who, launched, total, what);
}

void warnBackwardWithoutForward(const char* who, int rank) {
  DTRAIN_LOG(Warn,
             "rank {}: a backward pass reached {}'s parameters without a forward through the "
             "DistributedDataParallel wrapper since the last synchronised backward; these "
             "gradients stay local to this rank. HINT: call the wrapper's forward (not the "
             "module's) before each backward",
             rank, who);
}

}  // namespace dtrain::ddp
