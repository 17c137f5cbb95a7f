#include "nccl_communicator_impl.h"

#include <cstdlib>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "cuda_device.h"
#include "dtrain/base/error.h"
#include "dtrain/base/logging.h"
#include "dtrain/base/timeout.h"
#include "failure_report.h"
#include "nccl_errors.h"
#include "nccl_progress.h"
#include "nccl_types.h"
#include "store_collective_check.h"

namespace dtrain::comm {

namespace {

// Device memory from allocate(): freed on the communicator's device when released.
class DeviceBuffer final : public Buffer {
 public:
  DeviceBuffer(void* data, size_t bytes, int device)
      : data_(data), bytes_(bytes), device_(device) {}
  ~DeviceBuffer() override {
    try {
      DeviceGuard guard(device_);  // Note [Device guards and GPU 0]
      cudaFree(data_);
    } catch (const std::exception& e) {
      DTRAIN_LOG(Warn, "nccl: freeing {} bytes on cuda:{} failed: {}", bytes_, device_, e.what());
    }
  }
  void* data() override { return data_; }
  size_t bytes() const override { return bytes_; }

 private:
  void* data_;
  size_t bytes_;
  int device_;
};

}  // namespace

// Note [NCCL watchdog]
// NCCL collectives are asynchronous on the GPU: a peer that dies or hangs leaves this rank's
// kernel spinning forever, and a host that only waits on events would hang with it. So every
// collective records an end event, and one watchdog thread per communicator polls (every
// watchdogInterval): the end events of pending collectives, and ncclCommGetAsyncError for errors
// NCCL detected (a peer's connection closed, an internal failure). A collective that is not done
// by its deadline, or an asynchronous error, fails the communicator: the ranks compare notes
// through the store (Note [NCCL failure report]), the first error is kept with their reports,
// every pending Work fails with it, ncclCommAbort stops the kernels (so the device is usable for
// cleanup; Note [Aborting under the issue lock]), and every later call rethrows it.

NcclCommunicator::NcclCommunicator(const NcclOptions& o)
    : CommunicatorBase(
          o.rank, o.size, o.name, o.store,
          timeoutOrDefault(o.timeout, kDefaultCollectiveTimeout, "NcclOptions::timeout")),
      device_(o.device),
      watchdogInterval_(o.watchdogInterval),
      blockingWait_(o.blockingWait) {
  HeartbeatSetting heartbeat{true, o.heartbeatTimeout};
  if (o.heartbeatFromEnv) heartbeat = heartbeatFromEnv(o.heartbeatTimeout);
  if (heartbeat.enabled) {
    HeartbeatMonitorOptions h;
    h.who = fmt::format("nccl rank {}/{} (cuda:{})", o.rank, o.size, o.device);
    h.timeout = heartbeat.timeout;
    h.describe = [this] { return "its last collectives: " + recorder_.dump(); };
    heartbeat_ = std::make_unique<HeartbeatMonitor>(std::move(h));
  }
  DTRAIN_CHECK_ARG(size_ >= 1 && rank_ >= 0 && rank_ < size_, "NCCL: rank {} / world size {}",
                   rank_, size_);
  DTRAIN_CHECK_ARG(store_ != nullptr, "NCCL: {}: no store to share the ncclUniqueId through",
                   who());
  const Millis connectTimeout = timeoutOrDefault(o.connectTimeout, kDefaultConnectTimeout,
                                                 "NcclOptions::connectTimeout");
  validateNcclEnvironment();
  faults_ = CollectiveFaults::forThisThread(rank_);
  checkCollectives_ = agreeOnCollectiveCheck(o.checkCollectives, o.checkCollectivesFromEnv,
                                             connectTimeout);

  const int devices = cudaDeviceCount();
  DTRAIN_CHECK_ARG(device_ >= 0 && device_ < devices,
                   "NCCL: {}: CUDA device {} does not exist here ({} visible)", who(), device_,
                   devices);
  DeviceGuard guard(device_);

  // Rank 0 creates the id; everyone else reads it from the store.
  const std::string idKey = name_ + "/nccl_id";
  ncclUniqueId id;
  if (rank_ == 0) {
    checkNccl(ncclGetUniqueId(&id), nullptr, who(), "ncclGetUniqueId");
    store_->set(idKey, store::Bytes(reinterpret_cast<uint8_t*>(&id),
                                    reinterpret_cast<uint8_t*>(&id) + sizeof(id)));
    // ncclCommInitRank below blocks until every rank has the id: a set that failed after it
    // returned (TcpStore pipelines sets) must fail here, not leave rank 0 waiting in NCCL.
    store_->flush();
  } else {
    try {
      store_->wait({idKey}, connectTimeout);
    } catch (const TimeoutError& e) {
      DTRAIN_THROW(TimeoutError,
                   "NCCL: {}: rank 0 did not publish the ncclUniqueId within {} ms "
                   "({}). HINT: rank 0 must call init() too",
                   who(), connectTimeout.count(), e.what());
    }
    store::Bytes bytes = store_->get(idKey);
    DTRAIN_CHECK(bytes.size() == sizeof(id),
                 "NCCL: {}: the ncclUniqueId in the store has {} bytes, "
                 "expected {}",
                 who(), bytes.size(), sizeof(id));
    std::memcpy(&id, bytes.data(), sizeof(id));
  }
  initComm(id, connectTimeout);
  try {
    checkCuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    checkCuda(cudaMalloc(&barrierScratch_, sizeof(float)), "cudaMalloc");
  } catch (...) {
    // No destructor runs after a constructor throws: give back what NCCL and CUDA hold.
    ncclCommAbort(comm_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    throw;
  }
  // The library loaded may not be the one whose nccl.h this was built against: both are named.
  int loaded = 0;
  if (ncclGetVersion(&loaded) != ncclSuccess) loaded = 0;
  DTRAIN_LOG(Info,
             "nccl {}: communicator on cuda:{} (NCCL {} loaded, built against {}), collective "
             "timeout {} ms",
             who(), device_, loaded, NCCL_VERSION_CODE, timeout_.count());
}

// Note [Non-blocking communicators] (nccl_progress.h): init returns at once and completes in
// NCCL's threads; this rank waits for it at most `limit`, then aborts it.
void NcclCommunicator::initComm(const ncclUniqueId& id, Millis limit) {
  const std::string what = fmt::format("ncclCommInitRank on cuda:{}", device_);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclResult_t rc = ncclCommInitRankConfig(&comm_, size_, id, rank_, &config);
  const NcclProgress p = awaitNccl(comm_, rc, std::chrono::steady_clock::now() + limit,
                                   [] { return false; });
  if (p.result == ncclSuccess) return;
  // NCCL's message first: the abort below frees what it is read from.
  const std::exception_ptr error = p.timedOut ? nullptr : ncclError(p.result, comm_, who(), what);
  if (comm_ != nullptr) ncclCommAbort(comm_);
  comm_ = nullptr;
  if (p.timedOut) {
    DTRAIN_THROW(TimeoutError,
                 "NCCL: {}: {} did not complete within {} ms (NcclOptions::connectTimeout); the "
                 "communicator was aborted. HINT: every one of the {} ranks must create it with "
                 "the same store and name, and NCCL must reach every peer (NCCL_DEBUG=INFO "
                 "shows where it waits; NCCL_SOCKET_IFNAME picks the interface)",
                 who(), what, limit.count(), size_);
  }
  std::rethrow_exception(error);
}

void NcclCommunicator::start() {
  if (heartbeat_) heartbeat_->start();
  watchdog_ = std::thread([this] { watchdogMain(); });
  watchProgress();
}

NcclCommunicator::~NcclCommunicator() { shutdownInDestructor("nccl " + who()); }

std::string NcclCommunicator::describe() const {
  return fmt::format("nccl rank {}/{} (cuda:{})", rank_, size_, device_);
}

std::string NcclCommunicator::shutDownMessage() const {
  return fmt::format("nccl {}: the communicator was shut down; no collectives after shutdown()",
                     who());
}

void CUDART_CB NcclCommunicator::hangHostFunc(void* self) {
  auto* comm = static_cast<NcclCommunicator*>(self);
  while (!comm->hangReleased_.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

void CUDART_CB NcclCommunicator::slowHostFunc(void* millis) {
  std::this_thread::sleep_for(std::chrono::milliseconds(reinterpret_cast<intptr_t>(millis)));
}

void NcclCommunicator::releaseHang() { hangReleased_.store(true); }

std::shared_ptr<Work> NcclCommunicator::submit(CollectiveInfo info, const CallOptions& options,
                                               bool blocking, const Launch& launch) {
  throwIfUnusable();
  const Millis timeout = timeoutOrDefault(options.timeout, timeout_, "CallOptions::timeout");
  const auto caller = static_cast<cudaStream_t>(options.stream);
  info.shape = options.shape;
  info.label = options.label.substr(0, CallOptions::kMaxLabelBytes);
  info.check = options.check;
  std::lock_guard<std::timed_mutex> issue(issueMutex_);
  throwIfUnusable();  // the watchdog may have aborted while this caller waited for the lock
  DeviceGuard guard(device_);
  info.seq = nextSeq_.load();
  nextSeq_.store(info.seq + 1);
  recorder_.recordQueued(info);
  countPayload(info);
  if (faults_.at(fault::Kind::WrongShape, info.seq)) {
    info = wrongShape(info);
    DTRAIN_LOG(Info, "nccl {}: {} passes a wrong-sized buffer (DTRAIN_FAULT wrong-shape)", who(),
               info.describeWithSeq());
  }
  const bool skip = faults_.at(fault::Kind::SkipCollective, info.seq) != nullptr;
  if ((checkCollectives_ || options.check) && !skip) {
    try {
      checkCollectiveThroughStore(*store_, name_ + "/check", rank_, size_, info, timeout, who());
    } catch (...) {
      // As with Gloo, a failed check fails the communicator (the ranks no longer agree on what
      // comes next); the watchdog aborts it.
      recorder_.setState(info.seq, FlightRecorder::State::Failed);
      keepFirstError(std::current_exception());
      throw;
    }
  }

  cudaEvent_t ready = nullptr;
  cudaEvent_t done = nullptr;
  checkCuda(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "cudaEventCreate");
  checkCuda(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreate");
  // The collective starts after everything the caller queued on its stream so far.
  checkCuda(cudaEventRecord(ready, caller), "cudaEventRecord on the caller's stream");
  checkCuda(cudaStreamWaitEvent(stream_, ready, 0), "cudaStreamWaitEvent");
  cudaEventDestroy(ready);  // released once the recorded work completes

  if (const fault::Fault* slow = faults_.at(fault::Kind::Slow, info.seq)) {
    checkCuda(cudaLaunchHostFunc(stream_, &NcclCommunicator::slowHostFunc,
                                 reinterpret_cast<void*>(static_cast<intptr_t>(slow->arg))),
              "cudaLaunchHostFunc");
  }
  if (faults_.at(fault::Kind::Hang, info.seq)) {
    DTRAIN_LOG(Info, "nccl {}: {} hangs on the GPU stream (DTRAIN_FAULT)", who(),
               info.describeWithSeq());
    checkCuda(cudaLaunchHostFunc(stream_, &NcclCommunicator::hangHostFunc, this),
              "cudaLaunchHostFunc");
  }
  if (skip) {
    recorder_.setState(info.seq, FlightRecorder::State::Skipped);
  } else {
    recorder_.setState(info.seq, FlightRecorder::State::Running);
    ncclResult_t rc = launch(comm_, stream_, info.count);
    if (rc == ncclInProgress) {
      rc = awaitEnqueue(rc, info, std::chrono::steady_clock::now() + timeout);
    }
    if (rc != ncclSuccess) {
      cudaEventDestroy(done);
      recorder_.setState(info.seq, FlightRecorder::State::Failed);
      if (rc == ncclInProgress) std::rethrow_exception(this->error());  // given up: error kept
      auto error = ncclError(rc, comm_, who(), info.describeWithSeq());
      if (rc != ncclInvalidArgument && rc != ncclInvalidUsage) {
        keepFirstError(error);  // the watchdog aborts on its next round
      }
      std::rethrow_exception(error);
    }
  }
  checkCuda(cudaEventRecord(done, stream_), "cudaEventRecord on the NCCL stream");
  const auto now = std::chrono::steady_clock::now();
  auto work = std::make_shared<NcclWork>(weak_from_this(), who(), device_, info, done, caller,
                                         now + timeout, now + defaultWaitBudget(timeout),
                                         blocking || blockingWait_);
  {
    std::lock_guard<std::mutex> lock(stateMutex_);
    pending_.push_back(work);
  }
  return work;
}

ncclResult_t NcclCommunicator::awaitEnqueue(ncclResult_t rc, const CollectiveInfo& info,
                                            std::chrono::steady_clock::time_point deadline) {
  // Stops as soon as the communicator has an error: the watchdog's ncclCommAbort then waits for
  // this caller to leave the issue lock (Note [Non-blocking communicators]).
  const NcclProgress p = awaitNccl(comm_, rc, deadline, [this] { return error() != nullptr; });
  if (p.timedOut) {
    try {
      DTRAIN_THROW(TimeoutError,
                   "nccl {}: {} on cuda:{} was not enqueued within its timeout: NCCL was still "
                   "setting it up (connecting to a peer); the communicator is aborted and every "
                   "later call fails. HINT: a peer that died or cannot be reached leaves NCCL "
                   "connecting; the launcher's report names the rank that failed first",
                   who(), info.describeWithSeq(), device_);
    } catch (...) {
      keepFirstError(std::current_exception());
    }
    wake_.notify_all();  // the watchdog aborts on its next turn
  }
  return p.result;
}

void NcclCommunicator::watchdogMain() {
  // Its CUDA calls (event queries, the abort) must use this device's context, never create one on
  // the thread's default device 0 (Note [Device guards and GPU 0]).
  if (cudaSetDevice(device_) != cudaSuccess) cudaGetLastError();  // the calls below then say why
  std::unique_lock<std::mutex> lock(stateMutex_);
  while (true) {
    beat("its wait for work (idle)");
    wake_.wait_for(lock, watchdogInterval_);
    beat("a turn of its loop");
    if (closing_ && pending_.empty()) return;
    if (error_) {
      if (!aborted_) {
        auto error = error_;
        lock.unlock();
        beat("failing the communicator (the failure report, then ncclCommAbort)");
        failOnWatchdog(error);
        lock.lock();
      }
      if (closing_) return;
      continue;
    }
    // NCCL's own view first: a failed peer connection shows up here before any timeout.
    ncclResult_t async = ncclSuccess;
    beat("ncclCommGetAsyncError");
    if (comm_ != nullptr && ncclCommGetAsyncError(comm_, &async) == ncclSuccess &&
        async != ncclSuccess && async != ncclInProgress) {
      auto error = ncclError(async, comm_, who(), "asynchronous error");
      lock.unlock();
      beat("failing the communicator after NCCL's asynchronous error");
      failOnWatchdog(error);
      lock.lock();
      continue;
    }
    auto now = std::chrono::steady_clock::now();
    std::shared_ptr<NcclWork> late;
    std::exception_ptr cudaFailure;
    beat("cudaEventQuery of the oldest pending collective");
    while (!pending_.empty() && !cudaFailure) {
      auto& head = pending_.front();
      if (head->pollOnWatchdog(&cudaFailure)) {
        recorder_.setState(head->info().seq, cudaFailure ? FlightRecorder::State::Failed
                                                         : FlightRecorder::State::Done);
        pending_.pop_front();
        continue;
      }
      if (now > head->deadline()) late = head;
      break;
    }
    if (cudaFailure) {
      // The device failed under the communicator (an illegal access, a lost GPU): it fails too.
      lock.unlock();
      beat("failing the communicator after a CUDA error");
      failOnWatchdog(cudaFailure);
      lock.lock();
    } else if (late) {
      lock.unlock();
      beat("failing the communicator after a collective's timeout");
      failOnWatchdog(timeoutError(*this, late->info(), recorder_));  // Note [NCCL failure report]
      lock.lock();
    }
  }
}

void NcclCommunicator::failOnWatchdog(std::exception_ptr error) {
  DTRAIN_CHECK(std::this_thread::get_id() == watchdog_.get_id(),
               "nccl {}: failOnWatchdog() called outside the watchdog thread", who());
  std::shared_ptr<NcclWork> oldest;
  bool membership = false;
  {
    std::lock_guard<std::mutex> lock(stateMutex_);
    if (aborted_) return;
    if (!pending_.empty()) oldest = pending_.front();
    if (error_) error = error_;  // a caller's launch failed first, or abort() was called
    membership = membershipAborted_;
  }
  // abort()'s error goes out as it is: the ranks to compare notes with are being re-formed.
  if (!membership) error = withReports(error, oldest ? &oldest->info() : nullptr);
  std::deque<std::shared_ptr<NcclWork>> pending;
  {
    std::lock_guard<std::mutex> lock(stateMutex_);
    // Reports replace the bare error; calls made meanwhile rethrow the one with reports. An
    // abort() that came meanwhile keeps its own (Note [Aborting from outside]).
    if (membershipAborted_) {
      error = error_;
    } else {
      error_ = error;
    }
    pending.swap(pending_);
    aborted_ = true;
  }
  DTRAIN_LOG(Error, "{}", [&] {
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
  }());
  // Waiters learn the error now: the abort below may have to wait for a caller.
  for (auto& w : pending) {
    recorder_.setState(w->info().seq, FlightRecorder::State::Failed);
    w->fail(error);
  }
  // Release an injected hang before aborting, so the stream can drain once the kernels stop.
  releaseHang();
  abortOnWatchdog();
}

// abort() from any thread (Note [Aborting from outside] in communicator_base.cpp): the pending
// work fails now, so every waiter returns at once; ncclCommAbort, which must not free the
// ncclComm_t under a caller inside NCCL, is the watchdog's, woken for it, under the issue lock
// (Note [Aborting under the issue lock]). After shutdown() there is no watchdog, and nothing left
// to abort: shutdown() aborts a failed communicator itself.
void NcclCommunicator::abort(const std::string& reason) {
  const std::exception_ptr error = markAborted(reason);
  if (!error) return;
  DTRAIN_LOG(Warn, "nccl {}: aborted: membership changed: {}", who(), reason);
  std::deque<std::shared_ptr<NcclWork>> pending;
  {
    std::lock_guard<std::mutex> lock(stateMutex_);
    pending.swap(pending_);
  }
  for (auto& w : pending) {
    recorder_.setState(w->info().seq, FlightRecorder::State::Failed);
    w->fail(error);
  }
  releaseHang();
  wake_.notify_all();
}

// Note [NCCL failure report]
// Before failing its work, a failed rank compares notes with the others through the store, with
// the same report as the Gloo backend (failure_report.h): where it is (the oldest collective not
// done, its sequence number) and its error; it waits a short grace for the others' reports and adds
// "rank 1 is behind at seq 41 (...)", "rank 2 calls allgather(...) where this rank calls ...", or
// "rank 3 did not report" to its error. That is how a skipped collective or a wrong-sized buffer
// (which NCCL cannot see: it just waits) is told apart from a dead or frozen rank.
std::exception_ptr NcclCommunicator::withReports(std::exception_ptr error,
                                                 const CollectiveInfo* at) {
  if (size_ == 1) return error;
  std::string text;
  bool timedOut = false;
  try {
    std::rethrow_exception(error);
  } catch (const TimeoutError& e) {
    text = e.what();
    timedOut = true;
  } catch (const std::exception& e) {
    text = e.what();
  }
  RankReport mine;
  mine.rank = rank_;
  mine.seq = at ? at->seq : nextSeq_.load();
  mine.collective = at ? at->describe() : std::string("no collective pending");
  mine.error = text;
  const std::string summary = compareNotes(mine, timeout_, timedOut);
  if (summary.empty()) return error;
  return withOtherRanks(error, summary);
}

// Note [Aborting under the issue lock]
// NCCL allows one thread at a time on a communicator, and ncclCommAbort frees it: aborting while
// a caller is inside an NCCL call on it would free the communicator under that call. So the abort
// happens only under issueMutex_, which every caller holds while it uses comm_ (shutdown too).
// The communicator is non-blocking (Note [Non-blocking communicators] in nccl_progress.h): no
// NCCL call blocks its caller, and a caller waiting for an enqueue still in progress (connecting
// to a peer) polls outside NCCL and gives up as soon as the communicator has an error -- which
// the watchdog sets before it comes here, and abort() before it wakes the watchdog. So the lock
// comes within one poll. The wait below stays for what no poll covers (a CUDA call that hangs):
// the watchdog says so every few seconds instead of freeing the communicator under the caller.
void NcclCommunicator::abortOnWatchdog() {
  std::unique_lock<std::timed_mutex> issue(issueMutex_, std::defer_lock);
  const auto start = std::chrono::steady_clock::now();
  // No beat while waiting: a caller that never comes back out of NCCL leaves the watchdog here
  // for good, and the heartbeat monitor ends the process (Note [Watchdog heartbeat]).
  beat("waiting for a caller inside NCCL to return before ncclCommAbort");
  while (!issue.try_lock_for(std::chrono::seconds(5))) {
    DTRAIN_LOG(
        Warn,
        "nccl {}: the communicator failed, but a caller has been inside NCCL for {} "
        "s (issuing seq {}); waiting for it to return before ncclCommAbort, which NCCL "
        "allows no other thread to call meanwhile",
        who(),
        std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - start)
            .count(),
        nextSeq_.load() - 1);
  }
  beat("ncclCommAbort");
  if (comm_ != nullptr) ncclCommAbort(comm_);
  comm_ = nullptr;
  beat("a turn of its loop");
}

std::shared_ptr<Work> NcclCommunicator::allreduceAsync(void* data, size_t count, DataType dtype,
                                                       ReduceOp op, const CallOptions& options) {
  const ncclDataType_t t = toNcclDataType(dtype);
  const ncclRedOp_t o = toNcclRedOp(op);
  CollectiveInfo info = CollectiveInfo::allreduce(dtype, count, op);
  return submit(std::move(info), options, false,
                [=](ncclComm_t comm, cudaStream_t stream, size_t n) {
                  return ncclAllReduce(data, data, n, t, o, comm, stream);
                });
}

std::shared_ptr<Work> NcclCommunicator::broadcastAsync(void* data, size_t count, DataType dtype,
                                                       int root, const CallOptions& options) {
  DTRAIN_CHECK_ARG(root >= 0 && root < size_, "nccl {}: broadcast root {} is outside 0..{}", who(),
                   root, size_ - 1);
  const ncclDataType_t t = toNcclDataType(dtype);
  CollectiveInfo info = CollectiveInfo::broadcast(dtype, count, root);
  return submit(std::move(info), options, false,
                [=](ncclComm_t comm, cudaStream_t stream, size_t n) {
                  return ncclBroadcast(data, data, n, t, root, comm, stream);
                });
}

std::shared_ptr<Work> NcclCommunicator::allgatherAsync(const void* send, void* recv, size_t count,
                                                       DataType dtype, const CallOptions& options) {
  const ncclDataType_t t = toNcclDataType(dtype);
  CollectiveInfo info = CollectiveInfo::allgather(dtype, count);
  return submit(std::move(info), options, false,
                [=](ncclComm_t comm, cudaStream_t stream, size_t n) {
                  return ncclAllGather(send, recv, n, t, comm, stream);
                });
}

std::shared_ptr<Work> NcclCommunicator::reduceScatterAsync(const void* send, void* recv,
                                                           size_t count, DataType dtype,
                                                           ReduceOp op,
                                                           const CallOptions& options) {
  const ncclDataType_t t = toNcclDataType(dtype);
  const ncclRedOp_t o = toNcclRedOp(op);
  CollectiveInfo info = CollectiveInfo::reduceScatter(dtype, count, op);
  return submit(std::move(info), options, false,
                [=](ncclComm_t comm, cudaStream_t stream, size_t n) {
                  return ncclReduceScatter(send, recv, n, t, o, comm, stream);
                });
}

std::shared_ptr<Work> NcclCommunicator::barrierAsync(const CallOptions& options) {
  // NCCL has no barrier: a one-element allreduce, and wait() blocks the host until it is done.
  void* scratch = barrierScratch_;
  CollectiveInfo info = CollectiveInfo::barrier();
  return submit(std::move(info), options, /*blocking=*/true,
                [scratch](ncclComm_t comm, cudaStream_t stream, size_t) {
                  return ncclAllReduce(scratch, scratch, 1, ncclFloat32, ncclSum, comm, stream);
                });
}

std::shared_ptr<Buffer> allocateCudaBuffer(int device, size_t bytes) {
  DeviceGuard guard(device);
  void* data = nullptr;
  checkCuda(cudaMalloc(&data, bytes == 0 ? 1 : bytes),
            fmt::format("cudaMalloc({} bytes) on cuda:{}", bytes, device));
  return std::make_shared<DeviceBuffer>(data, bytes, device);
}

std::shared_ptr<Buffer> NcclCommunicator::allocate(size_t bytes) {
  return allocateCudaBuffer(device_, bytes);
}

void NcclCommunicator::shutdown() {
  if (!markClosing()) return;
  // Pending collectives finish (or time out: the watchdog fails them) before the watchdog exits.
  wake_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
  if (heartbeat_) heartbeat_->stop();
  releaseHang();
  DeviceGuard guard(device_);
  // Note [Aborting under the issue lock]; callers that get it after this see closing_ and stop.
  std::lock_guard<std::timed_mutex> issue(issueMutex_);
  bool healthy = false;
  bool aborted = false;
  {
    std::lock_guard<std::mutex> lock(stateMutex_);
    healthy = !error_ && !aborted_;
    aborted = aborted_;
  }
  if (comm_ != nullptr) {
    // A failed finalize leaves NCCL's kernels and proxy possibly running: only ncclCommAbort,
    // which stops them, may free the communicator then (ncclCommDestroy would wait for them).
    // Non-blocking (Note [Non-blocking communicators]): finalize completes in NCCL's threads,
    // waited for at most the collective timeout.
    const ncclResult_t finalized = healthy ? awaitNccl(comm_, ncclCommFinalize(comm_),
                                                       std::chrono::steady_clock::now() + timeout_,
                                                       [] { return false; })
                                                 .result
                                           : ncclSuccess;
    if (healthy && finalized == ncclSuccess) {
      ncclCommDestroy(comm_);
    } else if (!aborted) {
      if (healthy && finalized == ncclInProgress) {
        DTRAIN_LOG(Warn,
                   "nccl {}: ncclCommFinalize in shutdown() did not complete within {} ms; "
                   "aborting",
                   who(), timeout_.count());
      } else if (healthy) {
        DTRAIN_LOG(Warn, "nccl {}: ncclCommFinalize in shutdown() failed: {} ({}); aborting", who(),
                   ncclGetErrorString(finalized), nccl_compat::lastError(comm_));
      }
      ncclCommAbort(comm_);
    }
    comm_ = nullptr;  // an aborted communicator is already freed
  }
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  if (barrierScratch_ != nullptr) cudaFree(barrierScratch_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
  barrierScratch_ = nullptr;
  stream_ = nullptr;
}

bool ncclAvailable() { return true; }

int cudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device / no driver" error
    return 0;
  }
  return count;
}

std::shared_ptr<Communicator> createNcclCommunicator(const NcclOptions& options) {
  auto comm = std::make_shared<NcclCommunicator>(options);
  comm->start();
  return comm;
}

}  // namespace dtrain::comm
