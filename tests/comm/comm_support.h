#pragma once
// Helpers for communicator tests that run ranks as threads sharing one HashStore (Gloo's own tests
// do the same): worlds of every backend, faults, failure checks. Running ranks as threads and
// Gloo worlds are shared with the torch tests: thread_communicator_support.h.

#include <chrono>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "collective_faults.h"
#include "dtrain/base/store.h"
#include "dtrain/comm/communicator.h"
#include "dtrain/comm/gloo_communicator.h"
#include "dtrain/comm/shm_communicator.h"
#include "fault.h"
#include "thread_communicator_support.h"

namespace dtrain::testing {

// ShmOptions for thread tests: short timeouts, a small arena.
comm::ShmOptions shmTestOptions(
    int rank, int size, std::shared_ptr<store::Store> store,
    std::chrono::milliseconds timeout = std::chrono::milliseconds(5000));

// A world for the communicator conformance suite: which backend, how many ranks, and for the
// hierarchical one how many pretend nodes (ranks as threads; each node its own segment).
struct WorldKind {
  std::string backend;  // "gloo", "shm" or "hier"
  int size = 2;
  int nodes = 1;             // hier: size / nodes ranks per node
  bool interleaved = false;  // hier: rank r on node r % nodes (else r / (size / nodes), as launch)
  bool tinySlots = false;    // shm/hier: 4 KiB staging slots and small chunks, so that every
                             // collective streams through many chunks with uneven slices
  std::string label() const;
};

// gtest prints the label (CTest lists parameterised tests with it).
inline void PrintTo(const WorldKind& kind, std::ostream* os) { *os << kind.label(); }

// Creates the communicators of every rank concurrently.
std::vector<std::shared_ptr<comm::Communicator>> makeWorld(
    const WorldKind& kind, std::chrono::milliseconds timeout = std::chrono::milliseconds(5000));

// Milliseconds since `start`.
double elapsedMs(std::chrono::steady_clock::time_point start);

// What fn() throws, or "(no error)".
std::string messageOf(const std::function<void()>& fn);

// A fault of `kind` on `rank` at collective `seq`.
fault::Fault faultAt(fault::Kind kind, int rank, int64_t seq);

// P3 (docs/reliability.md): three allreduces queued on `rank0` whose peers never call them: the
// first fails, and the two queued behind it fail with its error at once (< 200 ms).
void expectQueuedCollectivesFailWithTheFirstError(comm::Communicator& rank0);

// EXPECT that `text` contains `part`, printing both when it does not.
#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE((text).find(part), std::string::npos) << "missing \"" << (part) << "\" in: " << (text)

}  // namespace dtrain::testing
