#pragma once
// Helpers for communicator tests that run ranks as threads sharing one HashStore (Gloo's own tests
// do the same): start a world, run a function on every rank, collect failures.

#include <chrono>
#include <functional>
#include <ostream>
#include <memory>
#include <string>
#include <vector>

#include "dtrain/base/fault.h"
#include "dtrain/base/store.h"
#include "dtrain/comm/communicator.h"
#include "dtrain/comm/gloo_communicator.h"
#include "dtrain/comm/shm_communicator.h"

namespace dtrain::testing {

// Runs fn(rank) on `size` threads and waits for all; an exception on any rank fails the test
// with that rank's message.
void runRanks(int size, const std::function<void(int rank)>& fn);

// GlooOptions for thread tests: short timeouts, no faults or checks from the environment.
comm::GlooOptions glooTestOptions(int rank, int size, std::shared_ptr<store::Store> store,
                                  std::chrono::milliseconds timeout = std::chrono::milliseconds(5000));

// Creates one Gloo communicator per rank concurrently (creation blocks until all have joined).
std::vector<std::shared_ptr<comm::Communicator>> makeGlooWorld(
    int size, const std::function<void(comm::GlooOptions&)>& tweak = {});

// ShmOptions for thread tests: short timeouts, a small arena, no faults from the environment.
comm::ShmOptions shmTestOptions(int rank, int size, std::shared_ptr<store::Store> store,
                                std::chrono::milliseconds timeout = std::chrono::milliseconds(5000));

// A world for the communicator conformance suite: which backend, how many ranks, and for the
// hierarchical one how many pretend nodes (ranks as threads; each node its own segment).
struct WorldKind {
  std::string backend;  // "gloo", "shm" or "hier"
  int size = 2;
  int nodes = 1;           // hier: size / nodes ranks per node
  bool interleaved = false;  // hier: rank r on node r % nodes (else r / (size / nodes), as launch)
  bool tinySlots = false;  // shm/hier: 4 KiB staging slots and small chunks, so that every
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
