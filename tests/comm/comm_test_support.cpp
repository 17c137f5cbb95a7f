#include "comm_test_support.h"

#include <exception>
#include <mutex>
#include <thread>

#include <gtest/gtest.h>

namespace dtrain::testing {

void runRanks(int size, const std::function<void(int rank)>& fn) {
  std::vector<std::thread> threads;
  std::mutex mutex;
  std::vector<std::string> failures;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mutex);
        failures.push_back("rank " + std::to_string(r) + ": " + e.what());
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& f : failures) ADD_FAILURE() << f;
}

comm::GlooOptions glooTestOptions(int rank, int size, std::shared_ptr<store::Store> store,
                                  std::chrono::milliseconds timeout) {
  comm::GlooOptions o;
  o.rank = rank;
  o.size = size;
  o.store = std::move(store);
  o.timeout = timeout;
  o.connectTimeout = std::chrono::milliseconds(10000);
  o.faultsFromEnv = false;
  o.checkCollectivesFromEnv = false;
  return o;
}

std::vector<std::shared_ptr<comm::Communicator>> makeGlooWorld(
    int size, const std::function<void(comm::GlooOptions&)>& tweak) {
  auto store = std::make_shared<store::HashStore>();
  std::vector<std::shared_ptr<comm::Communicator>> world(size);
  runRanks(size, [&](int r) {
    auto o = glooTestOptions(r, size, store);
    if (tweak) tweak(o);
    world[r] = comm::createGlooCommunicator(o);
  });
  return world;
}

double elapsedMs(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

}  // namespace dtrain::testing
