// Checkpointer with ranks as threads on several simulated nodes (TwoNodes: four ranks, two
// nodes, each with its own directory, agreeing through a store): a node that lost its directory or
// holds a damaged newest file gets a copy from another; each node's writer reports its writes; a
// writer slower than the collectives' timeout is waited for; the restore loop ends when one node
// keeps failing to read a step and when the node that should hand a step out cannot open it.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include <sys/stat.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../ddp/ddp_models.h"
#include "checkpoint/file_io.h"
#include "checkpoint_support.h"
#include "dtrain/torch/checkpoint.h"
#include "dtrain/torch/distributed_sampler.h"
#include "test_support.h"

namespace dtrain::testing::checkpoint_nodes_test {
namespace {

// Runs `fn` on the job's ranks, failing the test (and aborting the world, so that every rank's
// collectives fail at once) when it has not ended within `limit`: a restore that loops for ever.
void runWithin(TwoNodes& job, std::chrono::seconds limit, const std::function<void(int)>& fn) {
  std::atomic<bool> done{false};
  std::thread watchdog([&] {
    const auto end = std::chrono::steady_clock::now() + limit;
    while (!done && std::chrono::steady_clock::now() < end) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (!done) job.world->abort("the test's time limit passed");
  });
  try {
    job.world->run(fn);
  } catch (...) {
    done = true;
    watchdog.join();
    throw;
  }
  done = true;
  watchdog.join();
}

// Every rank saves step 5, changes its model, saves step 6: the states of both, as saved.
struct TwoSteps {
  std::vector<torch::Tensor> at5, at6;
};

TwoSteps saveFiveAndSix(TwoNodes& job) {
  TwoSteps saved;
  job.world->run([&](int rank) {
    Mlp net;
    setSameOnEveryRank(*net);
    Checkpointer c(threadGroup(*job.world, rank), job.options(rank));
    c.addModule("m", net);
    c.save(5);
    if (rank == 0) saved.at5 = stateOf(*net);
    torch::NoGradGuard g;
    net->fc1->weight.add_(1);
    c.save(6);
    if (rank == 0) saved.at6 = stateOf(*net);
  });
  return saved;
}

TEST(Checkpointer, ANodeThatLostItsDirectoryGetsACopyFromAnother) {
  TempDir tmp;
  TwoNodes job(tmp.path() + "/ckpt");
  const std::vector<torch::Tensor> at6 = saveFiveAndSix(job).at6;
  for (int node : {0, 1}) {
    EXPECT_EQ(checkpoint::listDirectory(job.dir + "/node" + std::to_string(node)).steps,
              (std::vector<int64_t>{6, 5}));
  }
  // Node 1 comes back as a fresh machine.
  ASSERT_EQ(std::system(("rm -rf " + job.dir + "/node1").c_str()), 0);
  std::vector<RestoredCheckpoint> results(4);
  job.world->run([&](int rank) {
    Mlp net;  // whatever it starts with, restore() overwrites
    Checkpointer c(threadGroup(*job.world, rank), job.options(rank));
    c.addModule("m", net);
    results[rank] = c.restore().value();
    expectBitwise(*net, at6, "rank " + std::to_string(rank));
  });
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_EQ(results[rank].step, 6);
    EXPECT_EQ(results[rank].copiedFromPeer, rank >= 2) << rank;
  }
  auto copied = checkpoint::listDirectory(job.dir + "/node1");
  EXPECT_EQ(copied.steps, (std::vector<int64_t>{6}));
  EXPECT_EQ(copied.latest.value_or(-1), 6);
  EXPECT_EQ(verifyErrorOf(job.dir + "/node1/step-00000006"), "");
}

// What train_resnet records as checkpoint_write_seconds / checkpoint_bytes.
TEST(Checkpointer, FinishedWritesAreReportedOnceByEachNodesWriter) {
  TempDir tmp;
  TwoNodes job(tmp.path() + "/ckpt");
  std::vector<std::vector<CheckpointWrite>> writes(4), again(4);
  job.world->run([&](int rank) {
    Mlp net;
    setSameOnEveryRank(*net);
    Checkpointer c(threadGroup(*job.world, rank), job.options(rank));
    c.addModule("m", net);
    c.saveAsync(3);
    c.save(7);  // waits for the first, then writes and commits
    writes[rank] = c.finishedWrites();
    again[rank] = c.finishedWrites();
  });
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_TRUE(again[rank].empty()) << "rank " << rank << ": each write once";
    if (rank % 2 == 1) {
      EXPECT_TRUE(writes[rank].empty()) << "rank " << rank << " writes no directory";
      continue;
    }
    ASSERT_EQ(writes[rank].size(), 2u) << "rank " << rank << ", the writer of its node";
    const std::string dir = job.dir + "/node" + std::to_string(rank / 2);
    for (size_t i = 0; i < 2; ++i) {
      const CheckpointWrite& w = writes[rank][i];
      EXPECT_EQ(w.step, i == 0 ? 3 : 7);
      EXPECT_GT(w.seconds, 0);
      char name[32];
      std::snprintf(name, sizeof name, "/step-%08lld", static_cast<long long>(w.step));
      struct stat st {};
      ASSERT_EQ(::stat((dir + name).c_str(), &st), 0) << dir + name;
      EXPECT_EQ(w.bytes, static_cast<uint64_t>(st.st_size));
    }
  }
}

TEST(Checkpointer, TheNewestStepThatVerifiesOnAnyNodeWins) {
  TempDir tmp;
  TwoNodes job(tmp.path() + "/ckpt-{node}-local");
  const std::vector<torch::Tensor> at6 = saveFiveAndSix(job).at6;
  // Node 0's newest file is damaged; node 1's is intact.
  std::string damaged = tmp.path() + "/ckpt-0-local/step-00000006";
  flipByte(damaged, 300);
  EXPECT_NE(verifyErrorOf(damaged), "");
  job.world->run([&](int rank) {
    Mlp net;
    Checkpointer c(threadGroup(*job.world, rank), job.options(rank));
    c.addModule("m", net);
    auto r = c.restore().value();
    EXPECT_EQ(r.step, 6);
    EXPECT_EQ(r.copiedFromPeer, rank < 2);
    expectBitwise(*net, at6, "rank " + std::to_string(rank));
  });
  EXPECT_EQ(verifyErrorOf(damaged), "") << "node 0's damaged copy was not replaced";
}

// Note [Checkpoint agreement]: node 1's writer takes 0.6 s per write call (a slow disk,
// `write:slow:600`) while the collectives time out after 0.3 s. The other ranks wait for it
// through the store, with the checkpoint's deadline: both saves complete on every rank and the
// communicator still works. (Waiting in an allgather timed it out and failed the communicator.)
TEST(Checkpointer, AWriteSlowerThanTheCollectiveTimeoutCompletes) {
  TempDir tmp;
  ThreadWorldOptions fast;
  fast.timeout = std::chrono::milliseconds(300);
  TwoNodes job(tmp.path() + "/ckpt", fast);
  IoFaultScope slowDisk("write:slow:600,rank=2");
  std::vector<double> sums(4, 0);
  job.world->run([&](int rank) {
    Mlp net;
    setSameOnEveryRank(*net);
    auto group = threadGroup(*job.world, rank);
    CheckpointOptions o = job.options(rank);
    o.timeout = std::chrono::seconds(30);
    Checkpointer c(group, o);
    c.addModule("m", net);
    c.save(3);
    c.saveAsync(4);
    c.wait();
    auto t = torch::ones({1});
    group->allreduce(t);
    sums[rank] = t.item<double>();
  });
  for (int rank = 0; rank < 4; ++rank) EXPECT_EQ(sums[rank], 4) << rank;
  for (int node : {0, 1}) {
    const std::string dir = job.dir + "/node" + std::to_string(node);
    EXPECT_EQ(checkpoint::listDirectory(dir).steps, (std::vector<int64_t>{4, 3})) << dir;
    EXPECT_EQ(verifyErrorOf(dir + "/step-00000004"), "");
  }
}

// Note [Restore agreement]'s bound: step 5 lacks rank 3's sampler position (rank 3 had not
// registered the sampler when it was saved), so rank 3 -- node 1 only -- fails to read it however
// intact the file is. Node 1 drops it, gets a fresh verified copy from node 0, fails again, and
// then every node drops step 5: the restore ends with step 4. (It used to copy step 5 to node 1
// for ever.)
TEST(Checkpointer, AStepOneNodeKeepsFailingToReadIsDroppedEverywhere) {
  TempDir tmp;
  TwoNodes job(tmp.path() + "/ckpt");
  std::vector<torch::Tensor> at4;
  job.world->run([&](int rank) {
    Mlp net;
    setSameOnEveryRank(*net);
    DistributedSampler sampler(16, 4, rank);
    {
      Checkpointer c(threadGroup(*job.world, rank), job.options(rank));
      c.addModule("m", net);
      c.addSampler("data", sampler);
      c.save(4);
    }
    if (rank == 0) at4 = stateOf(*net);
    torch::NoGradGuard g;
    net->fc1->weight.add_(1);
    Checkpointer c(threadGroup(*job.world, rank), job.options(rank));
    c.addModule("m", net);
    if (rank != 3) c.addSampler("data", sampler);
    c.save(5);
  });
  std::vector<int64_t> steps(4, -1);
  runWithin(job, std::chrono::seconds(60), [&](int rank) {
    Mlp net;
    DistributedSampler sampler(16, 4, rank);
    Checkpointer c(threadGroup(*job.world, rank), job.options(rank));
    c.addModule("m", net);
    c.addSampler("data", sampler);
    steps[rank] = c.restore().value().step;
    expectBitwise(*net, at4, "rank " + std::to_string(rank));
  });
  EXPECT_EQ(steps, (std::vector<int64_t>{4, 4, 4, 4}));
}

// The node that should hand a step out cannot open its copy (EIO on the open, after its copy
// verified): it drops the step and the restore goes on with what every node holds, instead of
// failing as a whole.
TEST(Checkpointer, ANodeThatCannotOpenItsCopyMakesTheRestoreTryTheNextStep) {
  TempDir tmp;
  TwoNodes job(tmp.path() + "/ckpt");
  const std::vector<torch::Tensor> at5 = saveFiveAndSix(job).at5;
  ASSERT_EQ(::unlink((job.dir + "/node1/step-00000006").c_str()), 0);  // node 1 lacks step 6
  IoFaultScope unreadable("open:EIO@1,rank=0");  // node 0's first open: the copy's source file
  std::vector<int64_t> steps(4, -1);
  runWithin(job, std::chrono::seconds(60), [&](int rank) {
    Mlp net;
    Checkpointer c(threadGroup(*job.world, rank), job.options(rank));
    c.addModule("m", net);
    steps[rank] = c.restore().value().step;
    expectBitwise(*net, at5, "rank " + std::to_string(rank));
  });
  EXPECT_EQ(steps, (std::vector<int64_t>{5, 5, 5, 5}));
}

}  // namespace
}  // namespace dtrain::testing::checkpoint_nodes_test
