#include "nccl_errors.h"

#include <fmt/format.h>

#include "dtrain/base/error.h"
#include "nccl_communicator_impl.h"

namespace dtrain::comm {

void checkCuda(cudaError_t rc, const std::string& what) {
  if (rc == cudaSuccess) return;
  DTRAIN_THROW(Error, "{}: CUDA error {} ({})", what, cudaGetErrorName(rc), cudaGetErrorString(rc));
}

std::exception_ptr ncclError(ncclResult_t rc, ncclComm_t comm, const std::string& who,
                             const std::string& what) {
  std::string detail = nccl_compat::lastError(comm);
  std::string message = fmt::format("nccl {}: {} failed: {} ({}){}{}", who, what,
                                    ncclGetErrorString(rc), static_cast<int>(rc),
                                    detail.empty() ? "" : ": ", detail);
  if (rc == ncclRemoteError || rc == ncclSystemError) {
    message += ". HINT: a peer process died or its network connection failed; the launcher's "
               "report names the rank that failed first";
  }
  try {
    switch (rc) {
      case ncclInvalidArgument:
      case ncclInvalidUsage: DTRAIN_THROW(InvalidArgument, "{}", message);
      case ncclRemoteError:
      case ncclSystemError: DTRAIN_THROW(NetworkError, "{}", message);
      default: DTRAIN_THROW(Error, "{}", message);
    }
  } catch (...) {
    return std::current_exception();
  }
}

void checkNccl(ncclResult_t rc, ncclComm_t comm, const std::string& who, const std::string& what) {
  if (rc != ncclSuccess) std::rethrow_exception(ncclError(rc, comm, who, what));
}

namespace {

template <typename E>
std::exception_ptr sameType(const std::string& text) {
  return std::make_exception_ptr(E(text));
}

}  // namespace

std::exception_ptr withOtherRanks(std::exception_ptr error, const std::string& summary) {
  auto merge = [&](const std::string& text) {
    const std::string part = ". Other ranks: " + summary;
    const size_t hint = text.find(". HINT:");
    if (hint == std::string::npos) return text + part;
    return text.substr(0, hint) + part + text.substr(hint);
  };
  try {
    std::rethrow_exception(error);
  } catch (const TimeoutError& e) {
    return sameType<TimeoutError>(merge(e.what()));
  } catch (const NetworkError& e) {
    return sameType<NetworkError>(merge(e.what()));
  } catch (const InvalidArgument& e) {
    return sameType<InvalidArgument>(merge(e.what()));
  } catch (const std::exception& e) {
    return sameType<Error>(merge(e.what()));
  }
}

std::exception_ptr timeoutError(const NcclCommunicator& comm, const CollectiveInfo& info,
                                const FlightRecorder& recorder) {
  try {
    DTRAIN_THROW(TimeoutError,
                 "nccl {}: {} on cuda:{} did not finish within its timeout; the communicator was "
                 "aborted (ncclCommAbort) and every later call fails. Recent collectives here: "
                 "{}. HINT: a rank that died, hangs, or skipped this collective leaves the others "
                 "waiting; the launcher's report names the rank that failed first",
                 comm.who(), info.describeWithSeq(), comm.device(), recorder.dump(4));
  } catch (...) {
    return std::current_exception();
  }
}

}  // namespace dtrain::comm
