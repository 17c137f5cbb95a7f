// NcclWork: the Work of one NCCL collective (see nccl_communicator_impl.h).
#include <thread>

#include <fmt/format.h>

#include "cuda_device.h"
#include "dtrain/base/error.h"
#include "nccl_communicator_impl.h"
#include "nccl_errors.h"

namespace dtrain::comm {

NcclWork::NcclWork(std::weak_ptr<NcclCommunicator> owner, std::string who, int device,
                   CollectiveInfo info, cudaEvent_t done, cudaStream_t caller,
                   std::chrono::steady_clock::time_point deadline,
                   std::chrono::steady_clock::time_point waitLimit, bool blocking)
    : owner_(std::move(owner)),
      who_(std::move(who)),
      device_(device),
      info_(std::move(info)),
      done_(done),
      caller_(caller),
      deadline_(deadline),
      waitLimit_(waitLimit),
      blocking_(blocking) {}

NcclWork::~NcclWork() {
  if (done_ == nullptr) return;
  try {
    DeviceGuard guard(device_);  // whichever thread drops it: Note [Device guards and GPU 0]
    cudaEventDestroy(done_);
  } catch (...) {
    // Destructors do not throw; the event leaks only if the device is gone.
  }
}

bool NcclWork::pollOnWatchdog(std::exception_ptr* cudaFailure) {
  if (finished_.load()) return true;
  cudaError_t rc = cudaEventQuery(done_);
  if (rc == cudaSuccess) {
    finished_.store(true);
    return true;
  }
  if (rc != cudaErrorNotReady) {
    auto error = std::make_exception_ptr(
        Error(fmt::format("nccl {}: {}: CUDA error {} ({}) while waiting for the collective", who_,
                          info_.describeWithSeq(), cudaGetErrorName(rc), cudaGetErrorString(rc))));
    fail(error);
    if (cudaFailure != nullptr) *cudaFailure = error;
    return true;
  }
  return false;
}

void NcclWork::fail(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!error_) error_ = std::move(error);
  }
  finished_.store(true);
}

std::exception_ptr NcclWork::errorNow() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (error_) return error_;
  }
  if (auto owner = owner_.lock()) return owner->error();
  return nullptr;
}

bool NcclWork::isCompleted() {
  if (finished_.load()) return true;
  DeviceGuard guard(device_);  // a thread without a device must not get a context on GPU 0
  return cudaEventQuery(done_) == cudaSuccess || errorNow() != nullptr;
}

void NcclWork::waitOnStream(void* stream, Millis timeout) {
  // c10d orders the stream current at wait time; the torch layer passes it (comm.h).
  cudaStream_t after = stream != nullptr ? static_cast<cudaStream_t>(stream) : caller_;
  DTRAIN_CHECK_ARG(timeout >= Millis::zero(), "nccl {}: Work::wait: negative timeout {} ms", who_,
                   timeout.count());
  if (auto error = errorNow()) std::rethrow_exception(error);
  // A null stream is the legacy default stream of the current device: it must be device_'s, as
  // at issue (and a thread without a device must not get a context on GPU 0).
  DeviceGuard guard(device_);
  if (!blocking_) {
    // The caller's stream continues after the collective; the host does not wait for the GPU.
    checkCuda(cudaStreamWaitEvent(after, done_, 0),
              fmt::format("nccl {}: {}: cudaStreamWaitEvent", who_, info_.describeWithSeq()));
    return;
  }
  // Blocking: poll until the GPU is done, the watchdog fails the communicator, or the limit.
  const auto start = std::chrono::steady_clock::now();
  const auto limit = timeout > Millis::zero() ? start + timeout : waitLimit_;
  cudaError_t rc;
  while ((rc = cudaEventQuery(done_)) == cudaErrorNotReady) {
    if (auto error = errorNow()) std::rethrow_exception(error);
    if (std::chrono::steady_clock::now() > limit) {
      DTRAIN_THROW(
          TimeoutError,
          "nccl {}: {}: not completed after {} ms of wait(){} (the "
          "collective keeps running; the watchdog aborts it at its timeout)",
          who_, info_.describeWithSeq(),
          std::chrono::duration_cast<Millis>(std::chrono::steady_clock::now() - start).count(),
          timeout > Millis::zero() ? ""
                                   : ", past its default deadline: the watchdog "
                                     "did not fail it in time");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  if (auto error = errorNow()) std::rethrow_exception(error);
  // Any other answer is an error (possibly an earlier asynchronous one), not completion.
  checkCuda(rc, fmt::format("nccl {}: {}: cudaEventQuery", who_, info_.describeWithSeq()));
  finished_.store(true);
  checkCuda(cudaStreamWaitEvent(after, done_, 0), "cudaStreamWaitEvent");
}

}  // namespace dtrain::comm
