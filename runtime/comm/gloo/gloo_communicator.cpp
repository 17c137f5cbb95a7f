#include "gloo_communicator_impl.h"

#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "dtrain/base/error.h"
#include "dtrain/base/logging.h"
#include "dtrain/base/timeout.h"
#include "failure_report.h"
#include "net/net_interface.h"
#include "reduce_kernels.h"

namespace dtrain::comm {

namespace {

bool envFlag(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && (std::strcmp(v, "1") == 0 || std::strcmp(v, "true") == 0);
}


}  // namespace

GlooCommunicator::GlooCommunicator(const GlooOptions& o)
    : options_(o),
      rank_(o.rank),
      size_(o.size),
      name_(o.name),
      store_(o.store),
      timeout_(timeoutOrDefault(o.timeout, kDefaultCollectiveTimeout, "GlooOptions::timeout")),
      smallAllreduceBytes_(o.smallAllreduceBytes),
      ringSegmentBytes_(o.ringSegmentBytes),
      directChunkBytes_(o.directChunkBytes),
      twoRankExchange_(o.twoRankExchange),
      faults_(o.faults) {
  DTRAIN_CHECK_ARG(size_ >= 1, "Gloo: world size must be >= 1, got {}", size_);
  DTRAIN_CHECK_ARG(rank_ >= 0 && rank_ < size_, "Gloo: rank {} is outside 0..{}", rank_, size_ - 1);
  DTRAIN_CHECK_ARG(store_ != nullptr, "Gloo: rank {}/{}: no store to rendezvous through", rank_,
                   size_);
  const Millis connectTimeout =
      timeoutOrDefault(o.connectTimeout, kDefaultConnectTimeout, "GlooOptions::connectTimeout");
  if (o.faultsFromEnv && faults_.empty()) faults_ = fault::activeFaults();
  if (const char* restart = std::getenv("DTRAIN_RESTART_COUNT")) attempt_ = std::atoi(restart);

  // Rank 0 decides whether collectives are checked, so all ranks agree (a rank checking alone
  // would wait for fingerprints nobody sends).
  const std::string checkKey = name_ + "/check_collectives";
  if (rank_ == 0) {
    bool check = o.checkCollectives || (o.checkCollectivesFromEnv && envFlag("DTRAIN_CHECK_COLLECTIVES"));
    store_->setString(checkKey, check ? "1" : "0");
    checkCollectives_ = check;
  } else {
    store_->wait({checkKey}, connectTimeout);
    checkCollectives_ = store_->getString(checkKey) == "1";
  }

  const char* envIface = std::getenv("GLOO_SOCKET_IFNAME");
  std::string iface = o.interface;
  std::string ifaceSource = "the Gloo interface option";
  if (iface.empty() && envIface != nullptr && *envIface != '\0') {
    iface = envIface;
    ifaceSource = "GLOO_SOCKET_IFNAME";
  }
  GlooMesh::Options mo;
  mo.rank = rank_;
  mo.size = size_;
  mo.store = store_;
  mo.prefix = name_;
  mo.bind = net::chooseBindAddress(iface, ifaceSource, o.storeHost);
  mo.connectTimeout = connectTimeout;
  mo.timeout = timeout_;
  if (size_ > 1) mesh_ = std::make_unique<GlooMesh>(mo);
  address_ = mo.bind.address;
  DTRAIN_LOG(Info, "gloo rank {}/{}: connected on {} ({}); collective timeout {} ms{}", rank_,
             size_, mo.bind.address, mo.bind.reason, timeout_.count(),
             checkCollectives_ ? "; collectives are checked across ranks" : "");

  pool_ = HostBufferPool::create();
  queue_ = CollectiveQueue::start(fmt::format("dtrain-gloo{}", rank_));
  progress_ = progress::watchCollectives(
      [this] { return recorder_.progressState(name_, nextSeq_.load()); });
}

GlooCommunicator::~GlooCommunicator() {
  try {
    shutdown();
  } catch (const std::exception& e) {
    DTRAIN_LOG(Warn, "{}: shutdown in destructor failed: {}", who(), e.what());
  }
}

std::string GlooCommunicator::who() const { return fmt::format("rank {}/{}", rank_, size_); }

std::string GlooCommunicator::describe() const {
  return fmt::format("gloo rank {}/{} ({})", rank_, size_, address_);
}

std::exception_ptr GlooCommunicator::error() const {
  std::lock_guard<std::mutex> lock(stateMutex_);
  return error_;
}

void GlooCommunicator::throwIfUnusable() const {
  std::lock_guard<std::mutex> lock(stateMutex_);
  if (error_) std::rethrow_exception(error_);
  DTRAIN_CHECK(!closing_, "{}: the Gloo communicator was shut down; no collectives after "
               "shutdown()", who());
}

const fault::Fault* GlooCommunicator::faultAt(fault::Kind kind, uint64_t seq) const {
  if (faults_.empty()) return nullptr;
  for (const auto& f : faults_) {
    if (f.kind == kind && f.matches(rank_, static_cast<int64_t>(seq), attempt_)) {
      return &f;
    }
  }
  return nullptr;
}

std::shared_ptr<Work> GlooCommunicator::submit(CollectiveInfo info, const CallOptions& options,
                                               Body body) {
  throwIfUnusable();
  const Millis timeout = timeoutOrDefault(options.timeout, timeout_, "CallOptions::timeout");
  info.shape = options.shape;
  std::lock_guard<std::mutex> lock(issueMutex_);
  info.seq = nextSeq_.load();
  recorder_.recordQueued(info);
  auto work = queue_->enqueue(
      [this, info, timeout, body = std::move(body)] { runOnCommThread(info, timeout, body); },
      [this, info] { return fmt::format("{}: {}", who(), info.describeWithSeq()); },
      defaultWaitBudget(timeout), /*wake=*/!options.synchronous);
  nextSeq_.store(info.seq + 1);
  return work;
}

void GlooCommunicator::runOnCommThread(const CollectiveInfo& requested, Millis timeout,
                                       const Body& body) {
  DTRAIN_CHECK(queue_->onCommThread(), "{}: a collective ran outside the executor", who());
  {
    // A collective queued behind a failed one fails with the first error.
    std::lock_guard<std::mutex> lock(stateMutex_);
    if (error_) std::rethrow_exception(error_);
  }
  if (faultAt(fault::Kind::SkipCollective, requested.seq)) {
    DTRAIN_LOG(Info, "{}: skipping {} (DTRAIN_FAULT skip-collective)", who(),
               requested.describeWithSeq());
    recorder_.setState(requested.seq, FlightRecorder::State::Skipped);
    return;
  }
  if (const fault::Fault* hang = faultAt(fault::Kind::Hang, requested.seq)) {
    // The injected hang stops this rank before it sends anything: the collective stays "queued"
    // in the flight recorder (issued, never started) while its peers show it "running", which is
    // how a stall report tells the rank that holds everyone up from the ones waiting for it.
    hangOnCommThread(requested, *hang);
  }
  const CollectiveInfo info =
      faultAt(fault::Kind::WrongShape, requested.seq) ? wrongShape(requested) : requested;
  recorder_.setState(info.seq, FlightRecorder::State::Running);
  GlooCall call{mesh_ ? mesh_->contextPtr() : nullptr, info.tag(), timeout};
  try {
    if (checkCollectives_ && size_ > 1) checkCollectiveOnCommThread(info, call);
    body(call, info);
  } catch (...) {
    failOnCommThread(info, timeout, std::current_exception());
  }
  recorder_.setState(info.seq, FlightRecorder::State::Done);
}

void GlooCommunicator::hangOnCommThread(const CollectiveInfo& info, const fault::Fault& fault) {
  DTRAIN_LOG(Info, "{}: hanging in {} (DTRAIN_FAULT {}) until shutdown", who(),
             info.describeWithSeq(), fault.describe());
  std::unique_lock<std::mutex> lock(stateMutex_);
  stateChanged_.wait(lock, [&] { return closing_; });
  DTRAIN_THROW(Error, "{}: {} hung (DTRAIN_FAULT {}) until the communicator was shut down", who(),
               info.describeWithSeq(), fault.describe());
}

void GlooCommunicator::checkCollectiveOnCommThread(const CollectiveInfo& info,
                                                   const GlooCall& call) {
  const Fingerprint mine = Fingerprint::of(info);
  const std::vector<Fingerprint> all = allgatherFingerprints(call, mine);
  std::vector<std::string> differ;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    if (all[r].seq != mine.seq || !all[r].sameCollective(mine)) {
      differ.push_back(fmt::format("rank {} calls {}", r, all[r].toInfo().describeWithSeq()));
    }
  }
  if (!differ.empty()) {
    DTRAIN_THROW(InvalidArgument,
                 "{}: collective check failed: this rank calls {}; {}. HINT: every rank must issue "
                 "the same collectives, in the same order, with the same types and shapes",
                 who(), info.describeWithSeq(), fmt::join(differ, "; "));
  }
}

std::shared_ptr<Work> GlooCommunicator::allreduceAsync(void* data, size_t count, DataType dtype,
                                                       ReduceOp op, const CallOptions& options) {
  DTRAIN_CHECK_ARG(data != nullptr || count == 0, "{}: allreduce of a null buffer", who());
  const ReduceFn reduce = reduceFunction(dtype, op);
  CollectiveInfo info = CollectiveInfo::allreduce(dtype, count, op);
  return submit(std::move(info), options, [this, data, reduce](const GlooCall& call,
                                                                const CollectiveInfo& i) {
    if (i.count == 0 || size_ == 1) return;
    const size_t bytes = i.count * elementSize(i.dtype);
    if (bytes <= smallAllreduceBytes_ || (size_ == 2 && twoRankExchange_)) {
      allreduceDirect(call, data, i.count, elementSize(i.dtype), reduce, scratch_,
                      directChunkBytes_);
    } else {
      allreduceRing(call, data, i.count, elementSize(i.dtype), reduce, ringSegmentBytes_);
    }
    finishAverage(data, i.count, i.dtype, i.op, size_);
  });
}

std::shared_ptr<Work> GlooCommunicator::broadcastAsync(void* data, size_t count, DataType dtype,
                                                       int root, const CallOptions& options) {
  DTRAIN_CHECK_ARG(root >= 0 && root < size_, "{}: broadcast root {} is outside 0..{}", who(),
                   root, size_ - 1);
  DTRAIN_CHECK_ARG(data != nullptr || count == 0, "{}: broadcast of a null buffer", who());
  CollectiveInfo info = CollectiveInfo::broadcast(dtype, count, root);
  return submit(std::move(info), options, [this, data](const GlooCall& call,
                                                       const CollectiveInfo& i) {
    if (i.count == 0 || size_ == 1) return;
    broadcastGloo(call, data, i.count * elementSize(i.dtype), i.root);
  });
}

std::shared_ptr<Work> GlooCommunicator::allgatherAsync(const void* send, void* recv, size_t count,
                                                       DataType dtype,
                                                       const CallOptions& options) {
  DTRAIN_CHECK_ARG((send != nullptr && recv != nullptr) || count == 0,
                   "{}: allgather of a null buffer", who());
  CollectiveInfo info = CollectiveInfo::allgather(dtype, count);
  return submit(std::move(info), options, [this, send, recv](const GlooCall& call,
                                                             const CollectiveInfo& i) {
    const size_t bytes = i.count * elementSize(i.dtype);
    if (bytes == 0) return;
    if (size_ == 1) {
      if (send != recv) std::memmove(recv, send, bytes);
      return;
    }
    allgatherGloo(call, send, recv, bytes);
  });
}

std::shared_ptr<Work> GlooCommunicator::reduceScatterAsync(const void* send, void* recv,
                                                           size_t count, DataType dtype,
                                                           ReduceOp op,
                                                           const CallOptions& options) {
  DTRAIN_CHECK_ARG((send != nullptr && recv != nullptr) || count == 0,
                   "{}: reduceScatter of a null buffer", who());
  const ReduceFn reduce = reduceFunction(dtype, op);
  CollectiveInfo info = CollectiveInfo::reduceScatter(dtype, count, op);
  return submit(std::move(info), options, [this, send, recv, reduce](const GlooCall& call,
                                                                     const CollectiveInfo& i) {
    if (i.count == 0) return;
    if (size_ == 1) {
      if (send != recv) std::memmove(recv, send, i.count * elementSize(i.dtype));
      finishAverage(recv, i.count, i.dtype, i.op, size_);
      return;
    }
    reduceScatterDirect(call, send, recv, i.count, elementSize(i.dtype), reduce, scratch_);
    finishAverage(recv, i.count, i.dtype, i.op, size_);
  });
}

std::shared_ptr<Work> GlooCommunicator::barrierAsync(const CallOptions& options) {
  CollectiveInfo info = CollectiveInfo::barrier();
  return submit(std::move(info), options, [this](const GlooCall& call, const CollectiveInfo&) {
    if (size_ > 1) barrierGloo(call);
  });
}

std::shared_ptr<Buffer> GlooCommunicator::allocate(size_t bytes) { return pool_->allocate(bytes); }

void GlooCommunicator::shutdown() {
  {
    std::lock_guard<std::mutex> lock(stateMutex_);
    if (closing_) return;
    closing_ = true;  // no new collectives; releases an injected hang
  }
  stateChanged_.notify_all();
  // Collectives already queued still run (each bounded by its timeout): shutdown() finishes
  // pending work, then closes the connections.
  if (queue_) queue_->stop();
  mesh_.reset();
  DTRAIN_LOG(Debug, "{}: Gloo communicator shut down", who());
}

std::optional<Communicator::GroupContext> GlooCommunicator::groupContext() const {
  return GroupContext{store_, name_, timeout_,
                      timeoutOrDefault(options_.connectTimeout, kDefaultConnectTimeout,
                                       "GlooOptions::connectTimeout")};
}

std::shared_ptr<Communicator> GlooCommunicator::createGroup(const GroupSpec& spec) {
  GlooOptions o = options_;
  o.rank = spec.rank;
  o.size = static_cast<int>(spec.members.size());
  o.name = spec.name;
  o.timeout = spec.timeout;
  o.connectTimeout = spec.connectTimeout;
  o.faults.clear();  // faults count the world's collectives, not a group's
  o.faultsFromEnv = false;
  o.checkCollectives = checkCollectives_;
  o.checkCollectivesFromEnv = false;
  return std::make_shared<GlooCommunicator>(o);
}

bool glooAvailable() { return true; }

std::shared_ptr<Communicator> createGlooCommunicator(const GlooOptions& options) {
  return std::make_shared<GlooCommunicator>(options);
}

}  // namespace dtrain::comm
