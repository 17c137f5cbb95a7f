// Built instead of the Gloo backend when Gloo was not found.
#include "dtrain/base/error.h"
#include "dtrain/comm/gloo_communicator.h"

namespace dtrain::comm {

bool glooAvailable() { return false; }

std::shared_ptr<Communicator> createGlooCommunicator(const GlooOptions&) {
  DTRAIN_THROW(InvalidArgument,
               "dtrain was built without Gloo, so there is no CPU backend. HINT: install "
               "libgloo-dev and rebuild (CMake option DTRAIN_WITH_GLOO=ON)");
}

}  // namespace dtrain::comm
