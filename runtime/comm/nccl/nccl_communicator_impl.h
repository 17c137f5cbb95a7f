#pragma once
// NcclCommunicator: the Communicator over one ncclComm_t on one CUDA device. Callers' threads
// enqueue collectives on the communicator's stream (in issue order, one thread at a time); the
// watchdog thread owns completion and failure: it polls each collective's end event and NCCL's
// asynchronous error, and aborts the communicator when a collective outlives its timeout or NCCL
// reports an error (see Note [NCCL watchdog]).

#include <cuda_runtime.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "collective.h"
#include "communicator_base.h"
#include "dtrain/comm/nccl_communicator.h"
#include "heartbeat_monitor.h"
#include "nccl_compat.h"

namespace dtrain::comm {

class NcclCommunicator;

// One enqueued collective: its end event on the communicator's stream.
class NcclWork final : public Work {
 public:
  NcclWork(std::weak_ptr<NcclCommunicator> owner, std::string who, int device, CollectiveInfo info,
           cudaEvent_t done, cudaStream_t caller, std::chrono::steady_clock::time_point deadline,
           std::chrono::steady_clock::time_point waitLimit, bool blocking);
  ~NcclWork() override;

  bool isCompleted() override;
  // Without blocking wait: orders the caller's stream after the collective and returns. Blocking
  // (barrier, TORCH_NCCL_BLOCKING_WAIT=1): polls until the GPU is done, at most `timeout`; zero
  // is the default deadline (Note [Zero timeouts]): the collective's deadline plus the time the
  // watchdog needs to abort and report, so only a stuck watchdog makes it throw.
  void wait(Millis timeout = Millis::zero()) override { waitOnStream(nullptr, timeout); }
  // Orders `stream` (null: the caller's stream at issue) after the collective.
  void waitOnStream(void* stream, Millis timeout = Millis::zero()) override;

  const CollectiveInfo& info() const { return info_; }
  std::chrono::steady_clock::time_point deadline() const { return deadline_; }
  // By the watchdog: the collective finished on the GPU, or CUDA failed it (then the error, also
  // the Work's, goes to `cudaFailure`).
  bool pollOnWatchdog(std::exception_ptr* cudaFailure);
  void fail(std::exception_ptr error);

 private:
  std::exception_ptr errorNow();

  std::weak_ptr<NcclCommunicator> owner_;
  std::string who_;  // "rank 1/4"
  int device_;
  CollectiveInfo info_;
  cudaEvent_t done_;
  cudaStream_t caller_;
  std::chrono::steady_clock::time_point deadline_;
  std::chrono::steady_clock::time_point waitLimit_;  // of wait(0)
  bool blocking_;
  std::atomic<bool> finished_{false};
  std::mutex mutex_;
  std::exception_ptr error_;  // guarded by mutex_
};

class NcclCommunicator final : public CommunicatorBase,
                               public std::enable_shared_from_this<NcclCommunicator> {
 public:
  explicit NcclCommunicator(const NcclOptions& options);
  ~NcclCommunicator() override;
  // Starts the watchdog (needs shared_from_this, so not in the constructor).
  void start();

  const char* backendName() const override { return "nccl"; }

  std::shared_ptr<Work> allreduceAsync(void* data, size_t count, DataType dtype, ReduceOp op,
                                       const CallOptions& options) override;
  std::shared_ptr<Work> broadcastAsync(void* data, size_t count, DataType dtype, int root,
                                       const CallOptions& options) override;
  std::shared_ptr<Work> allgatherAsync(const void* send, void* recv, size_t count, DataType dtype,
                                       const CallOptions& options) override;
  std::shared_ptr<Work> reduceScatterAsync(const void* send, void* recv, size_t count,
                                           DataType dtype, ReduceOp op,
                                           const CallOptions& options) override;
  std::shared_ptr<Work> barrierAsync(const CallOptions& options) override;
  std::shared_ptr<Buffer> allocate(size_t bytes) override;
  void shutdown() override;
  void abort(const std::string& reason) override;

  void* deviceStream() const override { return stream_; }
  std::string describe() const override;

  int device() const { return device_; }
  Millis watchdogInterval() const { return watchdogInterval_; }

 protected:
  std::string shutDownMessage() const override;

 private:
  // Enqueues the collective on `stream` with `count` elements (the info's count: the wrong-shape
  // fault shrinks it).
  using Launch = std::function<ncclResult_t(ncclComm_t comm, cudaStream_t stream, size_t count)>;

  std::shared_ptr<Work> submit(CollectiveInfo info, const CallOptions& options, bool blocking,
                               const Launch& launch);
  // Creates comm_ (non-blocking) and waits at most `limit` for it; throws, with nothing held,
  // when it fails or times out.
  void initComm(const ncclUniqueId& id, Millis limit);
  // Waits for an enqueue that returned ncclInProgress, under the issue lock, until it completes,
  // the communicator fails or is aborted, or `deadline`; returns what the enqueue came to
  // (ncclInProgress when it was given up: the error to throw is the communicator's then).
  ncclResult_t awaitEnqueue(ncclResult_t rc, const CollectiveInfo& info,
                            std::chrono::steady_clock::time_point deadline);
  void watchdogMain();
  // Fails the communicator with `error` (first error wins, with what the other ranks reported
  // added: failure_report.h), fails pending work, aborts NCCL.
  void failOnWatchdog(std::exception_ptr error);
  // `error` with the ranks' reports about where each one is (Note [NCCL failure report]).
  std::exception_ptr withReports(std::exception_ptr error, const CollectiveInfo* at);
  // ncclCommAbort under issueMutex_ (Note [Aborting under the issue lock]).
  void abortOnWatchdog();
  void releaseHang();
  // The watchdog is alive and about to do `doing` (a string literal).
  void beat(const char* doing) {
    if (heartbeat_) heartbeat_->beat(doing);
  }
  static void CUDART_CB hangHostFunc(void* self);
  static void CUDART_CB slowHostFunc(void* millis);

  const int device_;
  const Millis watchdogInterval_;
  const bool blockingWait_;
  bool checkCollectives_ = false;  // Note [Collective check through the store]

  ncclComm_t comm_ = nullptr;  // used under issueMutex_ (callers, abort, shutdown)
  cudaStream_t stream_ = nullptr;
  void* barrierScratch_ = nullptr;  // one float on the device for barrier()

  // One caller enqueues at a time, in sequence order. The watchdog takes it to abort, so an
  // abort never frees the ncclComm_t under a caller that is using it (Note [Aborting under the
  // issue lock]).
  std::timed_mutex issueMutex_;

  std::condition_variable wake_;                   // with stateMutex_: the watchdog sleeps on it
  std::deque<std::shared_ptr<NcclWork>> pending_;  // guarded by stateMutex_
  bool aborted_ = false;                           // guarded by stateMutex_
  std::atomic<bool> hangReleased_{false};
  std::thread watchdog_;
  // Watches the watchdog (Note [Watchdog heartbeat]); null when turned off.
  std::unique_ptr<HeartbeatMonitor> heartbeat_;
};

}  // namespace dtrain::comm
