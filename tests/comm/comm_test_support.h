#pragma once
// Helpers for communicator tests that run ranks as threads sharing one HashStore (Gloo's own tests
// do the same): start a world, run a function on every rank, collect failures.

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dtrain/comm.h"
#include "dtrain/gloo_communicator.h"
#include "dtrain/store.h"

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

// Milliseconds since `start`.
double elapsedMs(std::chrono::steady_clock::time_point start);

}  // namespace dtrain::testing
