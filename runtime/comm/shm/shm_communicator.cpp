#include "shm_communicator_impl.h"

#include <unistd.h>

#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "collective_faults.h"
#include "dtrain/base/error.h"
#include "dtrain/base/logging.h"
#include "dtrain/base/timeout.h"
#include "failure_report.h"
#include "reduce_kernels.h"
#include "shm_kernels.h"

namespace dtrain::comm {

namespace {

// More ranks than cores: a waiter must give its core to the peer it waits for (Note [Waiting]).
bool oversubscribed(const ShmOptions& o) {
  return static_cast<unsigned>(o.size) > std::max(1u, std::thread::hardware_concurrency());
}

std::chrono::microseconds spinOf(std::chrono::microseconds requested,
                                 std::chrono::microseconds byDefault) {
  return requested.count() >= 0 ? requested : byDefault;
}

// The first line of an error, for the segment's abort reason.
std::string firstLine(const std::string& text) { return text.substr(0, text.find('\n')); }

}  // namespace

ShmCommunicator::ShmCommunicator(Config c)
    : QueuedCommunicator(
          c.topology.rank, c.topology.size, c.name, c.store,
          timeoutOrDefault(c.timeout, kDefaultCollectiveTimeout, "ShmOptions::timeout")),
      topo_(std::move(c.topology)),
      shmOptions_(c.shm),
      storeHost_(c.storeHost),
      connectTimeout_(
          timeoutOrDefault(c.connectTimeout, kDefaultConnectTimeout, "ShmOptions::connectTimeout")),
      cross_(std::move(c.cross)),
      crossName_(c.crossName) {
  faults_ = CollectiveFaults::forThisThread(topo_.rank);
  const ShmOptions& o = shmOptions_;
  DTRAIN_CHECK_ARG(o.size >= 1 && o.size <= shm::kMaxShmRanks,
                   "shared memory: {} ranks on one node; at most {} are supported", o.size,
                   shm::kMaxShmRanks);
  DTRAIN_CHECK_ARG(o.rank >= 0 && o.rank < o.size, "shared memory: rank {} is outside 0..{}",
                   o.rank, o.size - 1);
  DTRAIN_CHECK_ARG(o.store != nullptr, "shared memory: rank {}/{}: no store to meet through",
                   o.rank, o.size);
  shm::SegmentOptions so;
  so.rank = o.rank;
  so.size = o.size;
  so.store = o.store;
  so.name = o.name;
  so.tuning.slotBytes = o.slotBytes;
  so.tuning.arenaBytes = o.arenaBytes;
  so.tuning.smallBytes = o.smallBytes;
  so.tuning.ownedChunkBytes = o.ownedChunkBytes;
  so.connectTimeout = connectTimeout_;
  if (topo_.nodes > 1) {
    for (int l = 0; l < topo_.locals; ++l) so.rankNames.push_back(topo_.rankOf(topo_.node, l));
    so.who = fmt::format("rank {}/{} (local rank {}/{})", topo_.rank, topo_.size, topo_.local,
                         topo_.locals);
  }
  try {
    segment_ = shm::Segment::join(so);
  } catch (const std::exception& e) {
    // The cross-node peers waiting for this rank in checkTuningAcrossNodes() lose the connection;
    // the report they read then says why.
    if (cross_) reportToCrossGroup("could not join its node's shared memory", e.what());
    throw;
  }
  if (cross_) checkTuningAcrossNodes();
  shm::EngineOptions eo;
  spin_ = spinOf(o.spin, kDefaultShmSpin);
  asyncSpin_ = spinOf(o.asyncSpin, kDefaultShmAsyncSpin);
  eo.spin = asyncSpin_;
  eo.yield = o.yieldSpin < 0 ? oversubscribed(o) : o.yieldSpin > 0;
  eo.rankNames = so.rankNames;
  engine_ = std::make_unique<shm::Engine>(segment_, eo);
  arena_ = shm::Arena::create(segment_);
  spill_ = HostBufferPool::create();
  DTRAIN_LOG(Info,
             "{}: shared memory with {} rank{} of this node{}; {} MiB staging, kernels {}, "
             "huge pages {}; collective timeout {} ms",
             describe(), o.size, o.size > 1 ? "s" : "",
             cross_ ? fmt::format(", Gloo across {} nodes", topo_.nodes) : std::string(),
             (2 * segment_->slotBytes() * o.size) >> 20, shm::vectorKernels() ? "AVX2" : "portable",
             segment_->hugePages() ? "advised" : "not allowed for shared memory here",
             timeout_.count());
  // Only the cross-node Gloo steps write to sockets; shared memory alone cannot raise SIGPIPE.
  startQueue(fmt::format("dtrain-shm{}", topo_.rank), /*writesSockets=*/cross_ != nullptr);
}

ShmCommunicator::~ShmCommunicator() { shutdownInDestructor(who()); }

std::string ShmCommunicator::describe() const {
  if (cross_) {
    return fmt::format("shm+gloo rank {}/{} (node {}/{}, local rank {}/{}, pid {})", topo_.rank,
                       topo_.size, topo_.node, topo_.nodes, topo_.local, topo_.locals, ::getpid());
  }
  return fmt::format("shm rank {}/{} (pid {})", topo_.rank, topo_.size, ::getpid());
}

std::string ShmCommunicator::shutDownMessage() const {
  return fmt::format("{}: the shared-memory communicator was shut down; no collectives after "
                     "shutdown()",
                     who());
}

std::shared_ptr<Work> ShmCommunicator::submit(CollectiveInfo info, const CallOptions& options,
                                              ShmBody body) {
  const bool synchronous = options.synchronous;
  return queueCollective(
      std::move(info), options,
      [this, synchronous, body = std::move(body)](const CollectiveInfo& i, Millis timeout) {
        engine_->setSpin(synchronous ? spin_ : asyncSpin_);
        body(i, shm::Clock::now() + timeout);
      });
}

void ShmCommunicator::failOnCommThread(const CollectiveInfo& info, Millis timeout,
                                       std::exception_ptr cause) {
  recorder_.setState(info.seq, FlightRecorder::State::Failed);
  std::string what = "unknown error";
  enum { Timeout, Peer, Argument, Membership, Other } kind = Other;
  try {
    std::rethrow_exception(cause);
  } catch (const MembershipChanged& e) {
    // A peer of this node, or this rank's cross-node group, was aborted: the node re-forms.
    what = e.what();
    kind = Membership;
  } catch (const TimeoutError& e) {
    what = e.what();
    kind = Timeout;
  } catch (const NetworkError& e) {
    what = e.what();
    kind = Peer;
  } catch (const InvalidArgument& e) {
    what = e.what();
    kind = Argument;
  } catch (const std::exception& e) {
    what = e.what();
  }
  const std::string head = fmt::format("{}: {} failed: {}", who(), info.describeWithSeq(), what);
  // Note [Failing once]: the node's peers fail at once, quoting this; other nodes through Gloo.
  if (kind == Membership) {
    engine_->abortForMembership(firstLine(head));
  } else {
    engine_->abort(firstLine(head));
  }
  if (cross_) {
    // The cross-node peers waiting on this rank lose the connection; the report they read right
    // then (failure_report.h) carries this error, so they can name the root cause too.
    reportToCrossGroup("failed inside its node before the next step across nodes", head);
    try {
      cross_->shutdown();
    } catch (const std::exception&) {
    }
  }
  std::string message = head + ". Recent collectives here: " + recorder_.dump(4);
  if (kind == Timeout) {
    message += fmt::format(". HINT: the collective timeout is {} ms; a rank that skipped a "
                           "collective or is stuck outside the communicator leaves the others "
                           "waiting",
                           timeout.count());
  }
  DTRAIN_LOG(Error, "{}", message);
  std::exception_ptr error;
  switch (kind) {
    case Timeout: error = DTRAIN_ERROR_PTR(TimeoutError, "{}", message); break;
    case Peer: error = DTRAIN_ERROR_PTR(NetworkError, "{}", message); break;
    case Argument: error = DTRAIN_ERROR_PTR(InvalidArgument, "{}", message); break;
    case Membership: error = DTRAIN_ERROR_PTR(MembershipChanged, "{}", message); break;
    case Other: error = DTRAIN_ERROR_PTR(Error, "{}", message); break;
  }
  std::rethrow_exception(keepFirstError(error));
}

void ShmCommunicator::reportToCrossGroup(const std::string& where, const std::string& error) {
  RankReport mine;
  mine.rank = topo_.node;
  // It never reached the cross step it was heading for: report it as behind, at the last one.
  const uint64_t issued = cross_->sequenceNumber();
  mine.seq = issued > 0 ? issued - 1 : 0;
  mine.collective = where;
  mine.error = firstLine(error);
  exchangeReports(*store_, crossName_ + "/failure", topo_.nodes, mine, Millis::zero());
}

CallOptions ShmCommunicator::crossCall(shm::Clock::time_point deadline, const CollectiveInfo& i) {
  CallOptions o;
  o.synchronous = true;
  o.label = i.label;
  o.check = i.check;
  o.timeout = std::max(Millis(1), std::chrono::duration_cast<Millis>(deadline - shm::Clock::now()));
  return o;
}

std::shared_ptr<Buffer> ShmCommunicator::scratchOnCommThread(size_t bytes, int which) {
  auto& s = scratch_[which];
  if (!s || s->bytes() < bytes) {
    s.reset();
    s = allocate(bytes);
  }
  return s;
}

std::shared_ptr<Work> ShmCommunicator::allreduceAsync(void* data, size_t count, DataType dtype,
                                                      ReduceOp op, const CallOptions& options) {
  DTRAIN_CHECK_ARG(data != nullptr || count == 0, "{}: allreduce of a null buffer", who());
  reduceFunction(dtype, op);  // an unsupported combination fails here, before queueing
  return submit(CollectiveInfo::allreduce(dtype, count, op), options,
                [this, data](const CollectiveInfo& i, shm::Clock::time_point deadline) {
                  if (i.count == 0 || topo_.size == 1) return;
                  if (cross_) return hierAllreduce(i, data, deadline);
                  engine_->allreduce(i, data, deadline);
                });
}

std::shared_ptr<Work> ShmCommunicator::broadcastAsync(void* data, size_t count, DataType dtype,
                                                      int root, const CallOptions& options) {
  DTRAIN_CHECK_ARG(root >= 0 && root < topo_.size, "{}: broadcast root {} is outside 0..{}", who(),
                   root, topo_.size - 1);
  DTRAIN_CHECK_ARG(data != nullptr || count == 0, "{}: broadcast of a null buffer", who());
  return submit(CollectiveInfo::broadcast(dtype, count, root), options,
                [this, data](const CollectiveInfo& i, shm::Clock::time_point deadline) {
                  if (i.count == 0 || topo_.size == 1) return;
                  if (cross_) return hierBroadcast(i, data, deadline);
                  engine_->broadcast(i, data, deadline);
                });
}

std::shared_ptr<Work> ShmCommunicator::allgatherAsync(const void* send, void* recv, size_t count,
                                                      DataType dtype, const CallOptions& options) {
  DTRAIN_CHECK_ARG((send != nullptr && recv != nullptr) || count == 0,
                   "{}: allgather of a null buffer", who());
  return submit(CollectiveInfo::allgather(dtype, count), options,
                [this, send, recv](const CollectiveInfo& i, shm::Clock::time_point deadline) {
                  if (i.count == 0) return;
                  if (topo_.size == 1) {
                    if (send != recv) std::memmove(recv, send, i.count * elementSize(i.dtype));
                    return;
                  }
                  if (cross_) return hierAllgather(i, send, recv, deadline);
                  engine_->allgather(i, send, recv, deadline);
                });
}

std::shared_ptr<Work> ShmCommunicator::reduceScatterAsync(const void* send, void* recv,
                                                          size_t count, DataType dtype, ReduceOp op,
                                                          const CallOptions& options) {
  DTRAIN_CHECK_ARG((send != nullptr && recv != nullptr) || count == 0,
                   "{}: reduceScatter of a null buffer", who());
  reduceFunction(dtype, op);
  return submit(CollectiveInfo::reduceScatter(dtype, count, op), options,
                [this, send, recv](const CollectiveInfo& i, shm::Clock::time_point deadline) {
                  if (i.count == 0) return;
                  if (topo_.size == 1) {
                    if (send != recv) std::memmove(recv, send, i.count * elementSize(i.dtype));
                    return;
                  }
                  if (cross_) return hierReduceScatter(i, send, recv, deadline);
                  engine_->reduceScatter(i, send, recv, deadline);
                });
}

std::shared_ptr<Work> ShmCommunicator::barrierAsync(const CallOptions& options) {
  return submit(CollectiveInfo::barrier(), options,
                [this](const CollectiveInfo& i, shm::Clock::time_point deadline) {
                  if (topo_.size == 1) return;
                  if (cross_) return hierBarrier(i, deadline);
                  engine_->barrier(i, deadline);
                });
}

std::shared_ptr<Buffer> ShmCommunicator::allocate(size_t bytes) {
  if (auto buffer = arena_->allocate(bytes)) return buffer;
  if (!warnedSpill_.exchange(true)) {
    DTRAIN_LOG(Warn,
               "{}: the shared-memory arena ({} MiB reserved, {} MiB in use) has no room "
               "for {} more bytes; such buffers live in private memory and their collectives "
               "copy through the staging slots. HINT: raise ShmOptions::arenaBytes",
               who(), segment_->arenaBytes() >> 20, arena_->inUseBytes() >> 20, bytes);
  }
  return spill_->allocate(bytes);
}

BufferStats ShmCommunicator::bufferStats() const {
  BufferStats s = spill_->stats();
  const size_t inUse = arena_->inUseBytes();
  s.inUseBytes += inUse;
  s.peakInUseBytes += arena_->peakInUseBytes();  // an upper bound: the two peak apart
  s.cachedBytes += arena_->touchedBytes() - inUse;
  return s;
}

void ShmCommunicator::resetBufferPeak() {
  spill_->resetPeak();
  arena_->resetPeak();
}

void ShmCommunicator::trimBuffers() { spill_->trim(); }

void ShmCommunicator::abort(const std::string& reason) {
  abortQueue(reason, [&] {
    // The whole node's segment: the node's other ranks fail at once, quoting this, and re-form
    // with this one (docs/design.md "Communicator").
    engine_->abortForMembership(
        fmt::format("{}: membership changed: {}", describe(), firstLine(reason)));
    if (cross_) cross_->abort(reason);
  });
}

void ShmCommunicator::shutdown() {
  if (!stopQueue()) return;
  engine_->close();
  scratch_[0].reset();
  scratch_[1].reset();
  if (cross_) cross_->shutdown();
  DTRAIN_LOG(Debug, "{}: shared-memory communicator shut down", who());
}

std::optional<Communicator::GroupContext> ShmCommunicator::groupContext() const {
  return GroupContext{store_, name_, timeout_, connectTimeout_};
}

std::shared_ptr<Communicator> ShmCommunicator::createGroup(const GroupSpec& spec) {
  NodeMap members;
  for (int r : spec.members) members.nodeOf.push_back(topo_.map.nodeOf[r]);
  CpuWorldOptions o;
  o.rank = spec.rank;
  o.size = static_cast<int>(spec.members.size());
  o.store = store_;
  o.name = spec.name;
  o.node = topo_.map.nodeOf[topo_.rank];
  o.storeHost = storeHost_;
  o.timeout = spec.timeout;
  o.connectTimeout = spec.connectTimeout;
  o.shm = shmOptions_;
  const ScopedCollectiveFaults none({});  // faults count the world's collectives, not a group's
  return createCpuCommunicatorFor(o, members);
}

}  // namespace dtrain::comm
