#include "gloo_communicator_impl.h"

#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "collective_faults.h"
#include "dtrain/base/error.h"
#include "dtrain/base/logging.h"
#include "dtrain/base/timeout.h"
#include "dtrain/config.h"
#include "failure_report.h"
#include "net/net_interface.h"
#include "reduce_kernels.h"

namespace dtrain::comm {

GlooCommunicator::GlooCommunicator(const GlooOptions& o)
    : QueuedCommunicator(
          o.rank, o.size, o.name, o.store,
          timeoutOrDefault(o.timeout, kDefaultCollectiveTimeout, "GlooOptions::timeout")),
      options_(o),
      smallAllreduceBytes_(o.smallAllreduceBytes),
      ringSegmentBytes_(o.ringSegmentBytes),
      directChunkBytes_(o.directChunkBytes),
      twoRankExchange_(o.twoRankExchange) {
  DTRAIN_CHECK_ARG(size_ >= 1, "Gloo: world size must be >= 1, got {}", size_);
  DTRAIN_CHECK_ARG(rank_ >= 0 && rank_ < size_, "Gloo: rank {} is outside 0..{}", rank_, size_ - 1);
  DTRAIN_CHECK_ARG(store_ != nullptr, "Gloo: rank {}/{}: no store to rendezvous through", rank_,
                   size_);
  const Millis connectTimeout = timeoutOrDefault(o.connectTimeout, kDefaultConnectTimeout,
                                                 "GlooOptions::connectTimeout");
  faults_ = CollectiveFaults::forThisThread(rank_);
  checkCollectives_ = agreeOnCollectiveCheck(o.checkCollectives, o.checkCollectivesFromEnv,
                                             connectTimeout);

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
  startQueue(fmt::format("dtrain-gloo{}", rank_));
}

GlooCommunicator::~GlooCommunicator() { shutdownInDestructor(who()); }

std::string GlooCommunicator::describe() const {
  return fmt::format("gloo rank {}/{} ({})", rank_, size_, address_);
}

std::string GlooCommunicator::shutDownMessage() const {
  return fmt::format("{}: the Gloo communicator was shut down; no collectives after shutdown()",
                     who());
}

std::shared_ptr<Work> GlooCommunicator::submit(CollectiveInfo info, const CallOptions& options,
                                               GlooBody body) {
  const bool check = (checkCollectives_ || options.check) && size_ > 1;
  return queueCollective(
      std::move(info), options,
      [this, check, body = std::move(body)](const CollectiveInfo& i, Millis timeout) {
        GlooCall call{mesh_ ? mesh_->contextPtr() : nullptr, i.tag(), timeout,
                      mesh_ ? mesh_->waitInterrupt() : nullptr};
        if (check) checkCollectiveOnCommThread(i, call);
        body(call, i);
      });
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
  return submit(std::move(info), options,
                [this, data, reduce](const GlooCall& call, const CollectiveInfo& i) {
                  if (i.count == 0 || size_ == 1) return;
                  const size_t bytes = i.count * elementSize(i.dtype);
                  if (bytes <= smallAllreduceBytes_ || (size_ == 2 && twoRankExchange_)) {
                    allreduceDirect(call, data, i.count, elementSize(i.dtype), reduce, scratch_,
                                    directChunkBytes_);
                  } else {
                    allreduceRing(call, data, i.count, elementSize(i.dtype), reduce,
                                  ringSegmentBytes_);
                  }
                  finishAverage(data, i.count, i.dtype, i.op, size_);
                });
}

std::shared_ptr<Work> GlooCommunicator::broadcastAsync(void* data, size_t count, DataType dtype,
                                                       int root, const CallOptions& options) {
  DTRAIN_CHECK_ARG(root >= 0 && root < size_, "{}: broadcast root {} is outside 0..{}", who(), root,
                   size_ - 1);
  DTRAIN_CHECK_ARG(data != nullptr || count == 0, "{}: broadcast of a null buffer", who());
  CollectiveInfo info = CollectiveInfo::broadcast(dtype, count, root);
  return submit(std::move(info), options,
                [this, data](const GlooCall& call, const CollectiveInfo& i) {
                  if (i.count == 0 || size_ == 1) return;
                  broadcastGloo(call, data, i.count * elementSize(i.dtype), i.root);
                });
}

std::shared_ptr<Work> GlooCommunicator::allgatherAsync(const void* send, void* recv, size_t count,
                                                       DataType dtype, const CallOptions& options) {
  DTRAIN_CHECK_ARG((send != nullptr && recv != nullptr) || count == 0,
                   "{}: allgather of a null buffer", who());
  CollectiveInfo info = CollectiveInfo::allgather(dtype, count);
  return submit(std::move(info), options,
                [this, send, recv](const GlooCall& call, const CollectiveInfo& i) {
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
  return submit(std::move(info), options,
                [this, send, recv, reduce](const GlooCall& call, const CollectiveInfo& i) {
                  if (i.count == 0) return;
                  if (size_ == 1) {
                    if (send != recv) std::memmove(recv, send, i.count * elementSize(i.dtype));
                    finishAverage(recv, i.count, i.dtype, i.op, size_);
                    return;
                  }
                  reduceScatterDirect(call, send, recv, i.count, elementSize(i.dtype), reduce,
                                      scratch_);
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
BufferStats GlooCommunicator::bufferStats() const { return pool_->stats(); }
void GlooCommunicator::resetBufferPeak() { pool_->resetPeak(); }
void GlooCommunicator::trimBuffers() { pool_->trim(); }

void GlooCommunicator::abort(const std::string& reason) {
  abortQueue(reason, [&] {
    std::lock_guard<std::mutex> lock(meshMutex_);
    if (mesh_) mesh_->interrupt();  // Note [Interrupting Gloo]
  });
}

void GlooCommunicator::shutdown() {
  // Collectives already queued still run (each bounded by its timeout): shutdown() finishes
  // pending work, then closes the connections.
  if (!stopQueue()) return;
  std::unique_ptr<GlooMesh> mesh;
  {
    std::lock_guard<std::mutex> lock(meshMutex_);
    mesh = std::move(mesh_);
  }
  mesh.reset();
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
  o.checkCollectives = checkCollectives_;
  o.checkCollectivesFromEnv = false;
  const ScopedCollectiveFaults none({});  // faults count the world's collectives, not a group's
  return std::make_shared<GlooCommunicator>(o);
}

}  // namespace dtrain::comm

// The entry points dtrain_comm looks up after loading this library (gloo_loader.cpp; see
// Note [One Gloo per process] there).
extern "C" __attribute__((visibility("default"))) const char* dtrain_gloo_version() {
  return DTRAIN_VERSION;
}

extern "C" __attribute__((visibility("default"))) void dtrain_gloo_create(
    const dtrain::comm::GlooOptions* options, std::shared_ptr<dtrain::comm::Communicator>* out) {
  *out = std::make_shared<dtrain::comm::GlooCommunicator>(*options);
}
