#pragma once
// The Gloo backend: collectives on CPU memory over TCP (Gloo's transport), for CPU training and
// for tests. Ranks rendezvous through a dtrain Store (any: the job's TcpStore, or one HashStore
// shared by ranks run as threads). One comm thread per communicator runs the collectives in issue
// order; algorithms are chosen per size (see runtime/comm/gloo/gloo_algorithms.h).

#include <memory>
#include <string>

#include "dtrain/base/store.h"
#include "dtrain/comm/communicator.h"

namespace dtrain::comm {

// Allreduces up to this many bytes use one all-to-all exchange (one round trip); larger ones the
// ring (bandwidth-optimal), except at two ranks (see twoRankExchange). Measured on loopback; see
// benchmarks/README.md.
constexpr size_t kDefaultSmallAllreduceBytes = 256 * 1024;
constexpr size_t kDefaultRingSegmentBytes = 1024 * 1024;
// Chunk of the direct exchange for large buffers.
constexpr size_t kDefaultDirectChunkBytes = 1024 * 1024;

struct GlooOptions {
  int rank = 0;
  int size = 1;
  // Shared by all ranks; every key this communicator writes is under "<name>/".
  std::shared_ptr<store::Store> store;
  // Distinguishes communicators of one job (they must use the same name on every rank).
  std::string name = "gloo";
  // Network interface to bind; empty: GLOO_SOCKET_IFNAME, else docs/design.md#network-interface
  // (loopback when the store is on loopback, else the interface routing toward `storeHost`).
  std::string interface;
  std::string storeHost;
  // Default deadline of each collective (CallOptions::timeout overrides per call). Zero here and
  // in connectTimeout: the default (Note [Zero timeouts] in dtrain/base/timeout.h).
  Millis timeout = kDefaultCollectiveTimeout;
  // Deadline for all ranks to connect.
  Millis connectTimeout = kDefaultConnectTimeout;
  // Allgathers a fingerprint of every collective before running it and fails at once, naming both
  // sides, when ranks disagree (kind, type, count, shape). Costs one small round trip per
  // collective. Rank 0's value applies to all ranks. Default: DTRAIN_CHECK_COLLECTIVES=1.
  bool checkCollectives = false;
  bool checkCollectivesFromEnv = true;
  size_t smallAllreduceBytes = kDefaultSmallAllreduceBytes;
  // Largest message of the ring allreduce (Gloo's segment); see benchmarks/README.md.
  size_t ringSegmentBytes = kDefaultRingSegmentBytes;
  size_t directChunkBytes = kDefaultDirectChunkBytes;
  // With two ranks the direct exchange moves exactly the ring's bytes in one round instead of
  // 2(n-1) dependent steps: use it at every size (false: the ring above smallAllreduceBytes).
  bool twoRankExchange = true;
};

// True when dtrain was built with Gloo.
bool glooAvailable();

// Connects to every other rank (blocks until all have joined, or connectTimeout). Throws
// InvalidArgument for bad options, TimeoutError / NetworkError naming the ranks that did not join.
std::shared_ptr<Communicator> createGlooCommunicator(const GlooOptions& options);

}  // namespace dtrain::comm
