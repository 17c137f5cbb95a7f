#include "gloo_mesh.h"

#include <sched.h>

#include <regex>
#include <sstream>

#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/address.h>
#include <gloo/transport/tcp/device.h>

#include <fmt/format.h>

#include "dtrain/base/error.h"
#include "dtrain/base/logging.h"
#include "gloo_store.h"
#include "sigpipe_guard.h"

namespace dtrain::comm {

namespace {

// Gloo prints endpoints as "[127.0.0.1]:41232".
std::string plainEndpoint(const std::string& bracketed) {
  static const std::regex re(R"(\[([^\]]+)\]:(\d+))");
  std::smatch m;
  if (std::regex_search(bracketed, m, re)) return m[1].str() + ":" + m[2].str();
  return bracketed;
}

// Note [Gloo's event loop and the scheduler]
// Gloo's TCP transport reads on one event-loop thread per device; a collective's own thread
// writes, and both take the pair's mutex. When the loop thread finds the mutex taken it returns
// to epoll, which (level-triggered) reports the same socket again at once: it spins until the
// holder releases the mutex. On a 2-core machine with other work running, the holder is often
// preempted right after its write, and the spinning loop thread (woken with little CPU time used,
// so favoured by the scheduler) keeps it off the CPU until the next scheduler tick: every step of
// the collective then costs 4 ms (HZ=250), for whole runs of calls. perf shows the loop thread
// burning its time in epoll_wait then. Two measures remove most of it: the loop thread runs as
// SCHED_BATCH, so its wake-ups never preempt the thread that holds the mutex (it still gets its
// fair share, and runs at once on an idle core); and the direct exchange posts its sends before
// its receives, so its data is written by the loop thread itself rather than under contention
// (gloo_algorithms.cpp). Gloo's ring, still used for large buffers with more than two ranks,
// keeps writing from the collective's thread.
//
// Creates the device from this thread with SCHED_BATCH in effect, so the loop thread that Gloo
// starts inherits it (and SIGPIPE blocked, see sigpipe_guard.h); this thread's own policy and mask
// are restored at once. A process running under a real-time policy keeps it.
std::shared_ptr<gloo::transport::Device> createDeviceWithBatchLoop(
    const gloo::transport::tcp::attr& attr) {
  const int policy = sched_getscheduler(0);
  sched_param saved{};
  sched_getparam(0, &saved);
  const bool batch = policy == SCHED_OTHER;
  // Also born with SIGPIPE blocked: it writes queued sends (see sigpipe_guard.h).
  SigpipeGuard sigpipe;
  if (batch) {
    sched_param none{};
    sched_setscheduler(0, SCHED_BATCH, &none);  // the loop thread inherits it
  }
  std::shared_ptr<gloo::transport::Device> device;
  try {
    device = gloo::transport::tcp::CreateDevice(attr);
  } catch (...) {
    if (batch) sched_setscheduler(0, policy, &saved);
    throw;
  }
  if (batch) sched_setscheduler(0, policy, &saved);
  return device;
}

}  // namespace

GlooMesh::GlooMesh(const Options& o) : rank_(o.rank), size_(o.size), address_(o.bind.address) {
  gloo::transport::tcp::attr attr;
  attr.hostname = o.bind.address;
  std::shared_ptr<gloo::transport::Device> device;
  try {
    device = createDeviceWithBatchLoop(attr);
  } catch (const std::exception& e) {
    DTRAIN_THROW(NetworkError, "rank {}/{}: cannot create the Gloo TCP device on {} ({}): {}",
                 rank_, size_, o.bind.address, o.bind.reason, e.what());
  }
  auto context = std::make_shared<gloo::rendezvous::Context>(rank_, size_);
  context->setTimeout(o.connectTimeout);
  GlooStore glooStore(o.store, o.prefix + "/mesh", o.connectTimeout);
  SigpipeGuard sigpipe;  // connecting writes to peers that may die meanwhile
  try {
    context->connectFullMesh(glooStore, device);
  } catch (const TimeoutError& e) {
    DTRAIN_THROW(TimeoutError,
                 "rank {}/{}: not every rank joined the Gloo rendezvous within {} ms (store {}): "
                 "{}. HINT: a rank that never calls init() or crashed before it leaves the others "
                 "waiting",
                 rank_, size_, o.connectTimeout.count(), o.store->describe(), e.what());
  } catch (const dtrain::Error&) {
    throw;
  } catch (const std::exception& e) {
    DTRAIN_THROW(NetworkError, "rank {}/{}: Gloo could not connect to its peers from {}: {}", rank_,
                 size_, o.bind.address, e.what());
  }
  context->setTimeout(o.timeout);
  context_ = context;
  publishEndpoints(*o.store, o.prefix + "/endpoints");
  mapListeningAddresses(*o.store, o.prefix + "/mesh");
}

GlooMesh::~GlooMesh() = default;

void GlooMesh::mapListeningAddresses(store::Store& store, const std::string& meshPrefix) {
  // A pair's accepting side keeps, as the peer's address in its messages, the address the peer
  // listened on before it connected from another port. Those are what Gloo's rendezvous put in
  // the store: each rank's listening address for every peer, in rank order, equal-sized.
  for (int other = 0; other < size_; ++other) {
    if (other == rank_) continue;
    try {
      store::Bytes all = store.get(fmt::format("{}/{}", meshPrefix, other));
      const size_t each = all.size() / static_cast<size_t>(size_ - 1);
      const size_t index = static_cast<size_t>(rank_ < other ? rank_ : rank_ - 1);
      if (each == 0 || all.size() % static_cast<size_t>(size_ - 1) != 0) continue;
      std::vector<char> bytes(all.begin() + index * each, all.begin() + (index + 1) * each);
      gloo::transport::tcp::Address address(bytes);
      rankOfEndpoint_.emplace(plainEndpoint(address.str()), other);
    } catch (const std::exception&) {
      // A layout this code does not know: errors then name the address without the rank.
    }
  }
}

void GlooMesh::publishEndpoints(store::Store& store, const std::string& prefix) {
  // Each rank publishes its own end of every connection; a peer's end as seen from here is what
  // that peer published for us. That gives the rank behind every address in Gloo's messages.
  std::ostringstream mine;
  mine << address_ << "\n";
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    mine << peer << " " << context_->getPair(peer)->address().str() << "\n";
  }
  store.setString(fmt::format("{}/{}", prefix, rank_), mine.str());
  for (int other = 0; other < size_; ++other) {
    if (other == rank_) continue;
    std::istringstream in(store.getString(fmt::format("{}/{}", prefix, other)));
    std::string line;
    std::getline(in, line);
    addressOfRank_[other] = line;
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      int peer = -1;
      std::string endpoint;
      fields >> peer >> endpoint;
      if (peer == rank_) rankOfEndpoint_[plainEndpoint(endpoint)] = other;
    }
  }
}

std::string GlooMesh::peerIn(const std::string& text) const {
  std::string endpoint = plainEndpoint(text);
  auto it = rankOfEndpoint_.find(endpoint);
  if (it == rankOfEndpoint_.end()) {
    return endpoint == text ? std::string() : fmt::format("peer {}", endpoint);
  }
  return fmt::format("rank {} ({})", it->second, endpoint);
}

std::string GlooMesh::describePeer(int rank) const {
  auto it = addressOfRank_.find(rank);
  return it == addressOfRank_.end() ? fmt::format("rank {}", rank)
                                    : fmt::format("rank {} ({})", rank, it->second);
}

void GlooMesh::abort() {
  std::lock_guard<std::mutex> lock(abortMutex_);
  if (aborted_ || !context_) return;
  aborted_ = true;
  context_->closeConnections();
}

// Note [Interrupting Gloo]
// A thread blocked in a Gloo collective waits on a condition variable of one of the operation's
// buffers; Gloo wakes it on completion, on its timeout, on abortWait*(), or when the pair fails
// and hands its exception to the buffers of the operations pending on it. Closing a pair fails
// nothing (close only drops the socket), so interrupt() makes each pair fail after closing it:
// switching a closed pair to synchronous mode is, in Gloo's TCP transport, "socket unexpectedly
// closed", which fails every operation pending on that pair (a posted receive whose data has
// not begun to arrive, a send its peer has not asked for: what a rank waiting for a lost peer
// blocks in). That is all Gloo's public interface offers, and it misses the one operation whose
// data is being read, and sends queued behind a full socket: Gloo keeps those apart from the
// pending ones. For our algorithms (the direct allreduce and reduce-scatter, the collective
// check) WaitInterrupt covers them, waking the wait registered at that moment through
// abortWaitRecv/abortWaitSend. It does so only after the pairs are closed: by then Gloo's event
// loop, which reads and writes under each pair's lock, has let go of every buffer, so the
// algorithm may free them at once. Gloo's own algorithms (ring allreduce, broadcast, allgather,
// barrier) interrupted in the middle of a transfer still wait until their timeout
// (docs/reliability.md P20).
void GlooMesh::interrupt() {
  std::lock_guard<std::mutex> lock(abortMutex_);
  if (interrupted_ || !context_) return;
  interrupted_ = true;
  if (!aborted_) {
    aborted_ = true;
    context_->closeConnections();
  }
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    try {
      context_->getPair(peer)->setSync(true, false);
    } catch (const std::exception&) {
      // Expected: the pair failed (now or before), and so did what was pending on it.
    }
  }
  waitInterrupt_.interrupt();
}

}  // namespace dtrain::comm
