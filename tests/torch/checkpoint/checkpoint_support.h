#pragma once
// What the Checkpointer tests with ranks as threads share (checkpoint_test.cpp: one node;
// checkpoint_nodes_test.cpp: several simulated nodes).
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../ddp/ddp_support.h"
#include "checkpoint/format.h"
#include "dtrain/base/store.h"
#include "dtrain/torch/checkpoint.h"
#include "thread_communicator_support.h"

namespace dtrain::testing {

// DTRAIN_IO_FAULT for the Checkpointers created while it lives (each reads it when built).
struct IoFaultScope {
  explicit IoFaultScope(const char* spec) { ::setenv("DTRAIN_IO_FAULT", spec, 1); }
  ~IoFaultScope() { ::unsetenv("DTRAIN_IO_FAULT"); }
};

inline CheckpointOptions optionsFor(const std::string& dir) {
  CheckpointOptions o(dir);
  o.handlePreemption = false;
  return o;
}

inline std::string verifyErrorOf(const std::string& path) {
  try {
    checkpoint::CheckpointReader::open(path).verify();
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

// The same values on every rank, as DDP would make them: ranks run as threads share one random
// generator, so seeding it in each thread races.
inline void setSameOnEveryRank(torch::nn::Module& m) {
  torch::NoGradGuard g;
  float base = 0;
  for (auto& p : m.parameters()) {
    p.copy_(torch::arange(p.numel(), torch::kFloat).reshape(p.sizes()) * 0.001 + base);
    base += 1;
  }
}

// Inverts the byte at `offset` (always a change, whatever the byte was).
inline void flipByte(const std::string& path, uint64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.read(&c, 1);
  f.seekp(static_cast<std::streamoff>(offset));
  f.put(static_cast<char>(~c));
}

inline std::shared_ptr<ProcessGroup> soloGroup() { return threadGroup(*ThreadWorld::create(1), 0); }

inline std::vector<torch::Tensor> stateOf(torch::nn::Module& m) {
  std::vector<torch::Tensor> out;
  for (const auto& p : m.parameters()) out.push_back(p.detach().clone());
  for (const auto& b : m.buffers()) out.push_back(b.detach().clone());
  return out;
}

inline void expectBitwise(torch::nn::Module& m, const std::vector<torch::Tensor>& want,
                          const std::string& what) {
  auto have = stateOf(m);
  ASSERT_EQ(have.size(), want.size());
  for (size_t i = 0; i < have.size(); ++i) {
    EXPECT_TRUE(torch::equal(have[i], want[i])) << what << " tensor " << i;
  }
}

// Four ranks on two simulated nodes, each node writing its own directory.
// They agree through one HashStore (Note [Checkpoint agreement]), as a job under launch does
// through its store.
struct TwoNodes {
  std::shared_ptr<ThreadWorld> world;
  std::string dir;
  std::shared_ptr<store::HashStore> store = std::make_shared<store::HashStore>();
  explicit TwoNodes(std::string d, ThreadWorldOptions o = {})
      : world(ThreadWorld::create(4, o)), dir(std::move(d)) {}
  CheckpointOptions options(int rank) const {
    CheckpointOptions o = optionsFor(dir);
    o.nodeId = rank / 2;
    o.localRank = rank % 2;
    o.store = store;
    return o;
  }
};

}  // namespace dtrain::testing
