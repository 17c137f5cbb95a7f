// Checkpoints of a ShardedOptimizer with ranks as threads on simulated nodes, one directory each
// (Note [Sharded checkpoint files]): each node's file holds its own ranks' shards and the next
// node's; a node that comes back empty restores from its neighbour; 4 -> 3 -> 2 ranks restore
// exactly what was saved; a shard damaged on every node that holds it makes the restore take the
// next older complete step, saying why; a rank whose blocks are all padding is a saver all the
// same; a step no node holds some rank's shards of is refused as incomplete, not as damaged.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <set>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../zero/zero_support.h"
#include "checkpoint/format.h"
#include "checkpoint_support.h"
#include "dtrain/torch/checkpoint.h"
#include "dtrain/torch/zero.h"
#include "test_support.h"

namespace dtrain::testing::checkpoint_sharded_test {
namespace {

constexpr int64_t kGlobalBatch = 12;  // divides among 4, 3 and 2 ranks

// A whole sharded state (ShardSnapshot) and rank 0's module.
struct Snapshot : ShardSnapshot {
  std::map<std::string, torch::Tensor> params;
};

void expectSame(const Snapshot& got, const Snapshot& want, const std::string& what) {
  ASSERT_EQ(got.fields.size(), want.fields.size()) << what;
  for (const auto& [key, t] : want.fields) {
    ASSERT_TRUE(got.fields.count(key)) << what << ": " << key.first << " " << key.second;
    EXPECT_TRUE(torch::equal(got.fields.at(key), t))
        << what << ": " << key.first << " " << key.second;
  }
  EXPECT_EQ(got.steps, want.steps) << what;
  for (const auto& [name, t] : want.params) {
    EXPECT_TRUE(torch::equal(got.params.at(name), t)) << what << ": " << name;
  }
}

// `world` ranks on nodes of `perNode` ranks, each node its own directory under `dir`.
struct Cluster {
  std::shared_ptr<ThreadWorld> threads;
  std::string dir;
  int perNode;
  std::shared_ptr<store::HashStore> store = std::make_shared<store::HashStore>();
  Cluster(int world, int perNode_, std::string d)
      : threads(ThreadWorld::create(world)), dir(std::move(d)), perNode(perNode_) {}
  CheckpointOptions options(int rank) const {
    CheckpointOptions o = optionsFor(dir);
    o.nodeId = rank / perNode;
    o.localRank = rank % perNode;
    o.store = store;
    o.allowWorldSizeChange = true;
    return o;
  }
};

// What one leg of training does and ends with.
struct Leg {
  int from = 0, to = 0;        // steps trained
  std::vector<int64_t> saves;  // steps saved (synchronously) after training them
  bool restore = false;
  bool defer = false;           // ZeroOptions::deferAllgatherWait
  Snapshot loaded;              // right after restore()
  Snapshot end;                 // after the last step
  std::vector<size_t> records;  // per rank: how many shard records it holds at the end
  std::vector<std::optional<RestoredCheckpoint>> restored;  // per rank
  std::vector<uint64_t> restoreBytes;  // per rank: what restore() sent over the group
};

// Trains `leg` with ZeRO stage 2 and AdamW on `cluster`: the module `make()` builds, of `in`
// inputs and `out` outputs.
template <typename Make>
void runLegOf(Cluster& cluster, Leg& leg, int64_t in, int64_t out, Make make) {
  std::mutex mutex;
  const int world = cluster.threads->size();
  leg.restored.assign(world, std::nullopt);
  leg.records.assign(world, 0);
  leg.restoreBytes.assign(world, 0);
  cluster.threads->run([&](int rank) {
    auto group = threadGroup(*cluster.threads, rank);
    // Another start than the run that saved: the restore decides.
    auto net = buildSeeded(100 + world + leg.from, make);
    DistributedDataParallel<decltype(net)> ddp(net, group);
    ZeroOptions zo;
    zo.stage = 2;
    zo.firstUnitBytes = 128;
    zo.unitBytes = 512;
    zo.deferAllgatherWait = leg.defer;
    ShardedOptimizer adam(ddp, factoryFor("adamw"), zo);
    Checkpointer checkpointer(group, cluster.options(rank));
    checkpointer.addModule("model", net);
    checkpointer.addOptimizer("adam", adam);
    if (leg.restore) {
      const uint64_t before = cluster.threads->communicator(rank)->payloadBytes();
      auto restored = checkpointer.restore();
      const uint64_t sent = cluster.threads->communicator(rank)->payloadBytes() - before;
      std::lock_guard<std::mutex> lock(mutex);
      leg.restored[rank] = restored;
      leg.restoreBytes[rank] = sent;
      addRecords(leg.loaded, adam.shardRecords());
      if (rank == 0) {
        for (const auto& p : net->named_parameters())
          leg.loaded.params[p.key()] = p.value().clone();
      }
    }
    for (int s = leg.from; s < leg.to; ++s) {
      auto x = randnSeeded({kGlobalBatch, in}, 500 + s);
      auto y = randnSeeded({kGlobalBatch, out}, 700 + s);
      adam.zero_grad();
      torch::mse_loss(ddp(shard(x, rank, world)), shard(y, rank, world)).backward();
      adam.step();
      if (std::count(leg.saves.begin(), leg.saves.end(), s)) checkpointer.save(s);
    }
    const auto records = adam.shardRecords();
    std::lock_guard<std::mutex> lock(mutex);
    addRecords(leg.end, records);
    leg.records[rank] = records.size();
    if (rank == 0) {
      for (const auto& p : net->named_parameters()) leg.end.params[p.key()] = p.value().clone();
    }
  });
}

void runLeg(Cluster& cluster, Leg& leg) {
  runLegOf(cluster, leg, 7, 5, [] { return Mlp(7, 13, 5); });
}

// Restores on `cluster` and trains nothing: what the restore loaded.
Leg restoreOnly(Cluster& cluster, int from) {
  Leg leg;
  leg.from = from;
  leg.to = from;
  leg.restore = true;
  runLeg(cluster, leg);
  return leg;
}

std::string readText(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::string stepFile(const std::string& dir, int node, int64_t step) {
  return fmt::format("{}/node{}/step-{:08d}", dir, node, step);
}

// The owners of the shard records in a file.
std::set<uint32_t> ownersIn(const std::string& path) {
  std::set<uint32_t> owners;
  auto reader = checkpoint::CheckpointReader::open(path);
  for (const auto& e : reader.entries()) {
    if (e.owner != checkpoint::kReplicated && e.kind == checkpoint::Kind::Tensor) {
      owners.insert(e.owner);
    }
  }
  return owners;
}

// Three nodes of one rank: node i keeps its own shards and node i+1's; nothing is gathered.
TEST(ShardedCheckpoint, EachNodeKeepsItsShardsAndTheNextNodesAndLatestNamesTheStep) {
  TempDir tmp;
  Cluster cluster(3, 1, tmp.file("ckpt"));
  Leg leg;
  leg.to = 2;
  leg.saves = {1};
  runLeg(cluster, leg);
  EXPECT_EQ(ownersIn(stepFile(cluster.dir, 0, 1)), (std::set<uint32_t>{0, 1}));
  EXPECT_EQ(ownersIn(stepFile(cluster.dir, 1, 1)), (std::set<uint32_t>{1, 2}));
  EXPECT_EQ(ownersIn(stepFile(cluster.dir, 2, 1)), (std::set<uint32_t>{0, 2}));
  for (int node = 0; node < 3; ++node) {
    EXPECT_EQ(verifyErrorOf(stepFile(cluster.dir, node, 1)), "");
    EXPECT_EQ(readText(fmt::format("{}/node{}/LATEST", cluster.dir, node)), "step-00000001\n");
  }
}

TEST(ShardedCheckpoint, AWipedNodeRestoresFromItsNeighbour) {
  TempDir tmp;
  Leg first;
  first.to = 3;
  first.saves = {2};
  {
    Cluster cluster(3, 1, tmp.file("ckpt"));
    runLeg(cluster, first);
  }
  std::filesystem::remove_all(tmp.file("ckpt/node1"));  // a spot machine that came back empty
  Cluster cluster(3, 1, tmp.file("ckpt"));
  const Leg second = restoreOnly(cluster, 3);
  ASSERT_TRUE(second.restored[1].has_value());
  EXPECT_EQ(second.restored[1]->step, 2);
  EXPECT_TRUE(second.restored[1]->copiedFromPeer);
  expectSame(second.loaded, first.end, "restored after node 1 was wiped");
  EXPECT_EQ(verifyErrorOf(stepFile(cluster.dir, 1, 2)), "") << "node 1 holds the step again";
}

// Note [Deferred all-gathers]: a save right after a step that left its all-gathers running
// restores what the step made (the module's parameters and the shards). On these CPU backends
// the save's own collectives, issued after the all-gathers, would order them first anyway; on a
// GPU the save's wait is what puts its copies after them on the stream.
TEST(ShardedCheckpoint, ASaveAfterADeferredStepHoldsTheStepsParameters) {
  TempDir tmp;
  Leg first;
  first.to = 3;
  first.saves = {2};
  first.defer = true;
  {
    Cluster cluster(2, 1, tmp.file("ckpt"));
    runLeg(cluster, first);
  }
  Cluster cluster(2, 1, tmp.file("ckpt"));
  const Leg second = restoreOnly(cluster, 3);
  ASSERT_TRUE(second.restored[0].has_value());
  EXPECT_EQ(second.restored[0]->step, 2);
  expectSame(second.loaded, first.end, "restored after a deferred step");
}

// 4 ranks on 2 nodes -> 3 ranks on 3 nodes (one of them new) -> 2 ranks on 2 nodes: each restore
// loads bitwise what was saved, and training goes on as the uninterrupted run.
TEST(ShardedCheckpoint, FourThenThreeThenTwoRanksRestoreExactly) {
  TempDir tmp;
  const std::string dir = tmp.file("ckpt");
  Leg whole;
  whole.to = 9;
  {
    Cluster c(4, 2, tmp.file("whole"));
    runLeg(c, whole);
  }
  Leg four;
  four.to = 3;
  four.saves = {2};
  {
    Cluster c(4, 2, dir);
    runLeg(c, four);
  }
  Leg three;
  three.from = 3;
  three.to = 6;
  three.saves = {5};
  three.restore = true;
  {
    Cluster c(3, 1, dir);
    runLeg(c, three);
  }
  ASSERT_TRUE(three.restored[0].has_value());
  EXPECT_EQ(three.restored[0]->savedWorldSize, 4);
  expectSame(three.loaded, four.end, "4 -> 3");
  Leg two;
  two.from = 6;
  two.to = 9;
  two.restore = true;
  {
    Cluster c(2, 1, dir);  // nodes 0 and 1 hold every shard of step 5 between them
    runLeg(c, two);
  }
  ASSERT_TRUE(two.restored[0].has_value());
  EXPECT_EQ(two.restored[0]->step, 5);
  EXPECT_EQ(two.restored[0]->savedWorldSize, 3);
  expectSame(two.loaded, three.end, "3 -> 2");
  for (const auto& [name, t] : whole.end.params) {
    EXPECT_LE(relativeError(two.end.params.at(name), t), 1e-5) << name;
  }
}

// Linear(2, 1) at 4 ranks, one per node (a linear probe or a small head; many small stage-3 units
// at a large world size alike): 3 trained elements, so rank 3's block is all padding and it saves
// no record. shards/records lists it as a saver all the same, so the step is complete and
// restores bitwise (Note [Sharded checkpoint files]).
TEST(ShardedCheckpoint, ARankWhoseBlocksAreAllPaddingSavesAStepThatRestoresBitwise) {
  TempDir tmp;
  const std::string dir = tmp.file("ckpt");
  auto probe = [] { return torch::nn::Linear(2, 1); };
  Leg saved;
  saved.to = 3;
  saved.saves = {2};
  {
    Cluster cluster(4, 1, dir);
    runLegOf(cluster, saved, 2, 1, probe);
  }
  ASSERT_EQ(saved.records.at(3), 0u) << "rank 3 holds a record: not the case under test";
  // Node 3 keeps its own rank's shards and node 0's.
  EXPECT_EQ(ownersIn(stepFile(dir, 3, 2)), (std::set<uint32_t>{0, 3}));
  Leg restored;
  restored.from = 3;
  restored.to = 3;
  restored.restore = true;
  {
    Cluster cluster(4, 1, dir);
    runLegOf(cluster, restored, 2, 1, probe);
  }
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(restored.restored[r].has_value()) << "rank " << r;
    EXPECT_EQ(restored.restored[r]->step, 2);
    EXPECT_EQ(restored.restored[r]->skipped, "");
  }
  expectSame(restored.loaded, saved.end, "restored with rank 3's blocks all padding");
}

// Rank 1's shards are on node 1 (its own) and node 0 (which keeps node 1's): with both files of
// the step gone, no node holds them. Nothing is damaged, so the refusal says the step is
// incomplete, naming the rank and the nodes searched -- not damage, which `checkpoint verify`
// would look for in vain.
TEST(ShardedCheckpoint, AStepNoNodeHoldsARanksShardsOfIsRefusedAsIncompleteNamingThem) {
  TempDir tmp;
  const std::string dir = tmp.file("ckpt");
  Leg saved;
  saved.to = 2;
  saved.saves = {1};
  {
    Cluster cluster(3, 1, dir);
    runLeg(cluster, saved);
  }
  ASSERT_TRUE(std::filesystem::remove(stepFile(dir, 0, 1)));
  ASSERT_TRUE(std::filesystem::remove(stepFile(dir, 1, 1)));
  Cluster cluster(3, 1, dir);
  std::string error;
  try {
    restoreOnly(cluster, 2);
  } catch (const CheckpointError& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("checkpoint step 1 is incomplete: no node holds the shards of rank(s) 1 of "
                       "the 3 ranks that saved it (searched node(s) 0, 1, 2; the step's file is "
                       "on node(s) 2)"),
            std::string::npos)
      << error;
  EXPECT_EQ(error.find("damage"), std::string::npos) << error;
}

// Flips a byte of rank `owner`'s record of fc1.weight's exp_avg in `path`.
void damageShard(const std::string& path, uint32_t owner) {
  uint64_t offset = 0;
  {
    auto reader = checkpoint::CheckpointReader::open(path);
    for (const auto& e : reader.entries()) {
      if (e.owner == owner && e.name == "optimizer/adam/fc1.weight/exp_avg") offset = e.offset;
    }
  }
  ASSERT_NE(offset, 0u) << path << " holds no exp_avg of fc1.weight from rank " << owner;
  flipByte(path, offset);
}

// Steps 1 and 2 saved by three nodes of one rank; fc1.weight lies in rank 0's or 1's shard.
struct TwoSaves {
  TempDir tmp;
  Leg leg;
  uint32_t owner = 0;  // a rank holding part of fc1.weight
  TwoSaves() {
    leg.to = 3;
    leg.saves = {1, 2};
    Cluster cluster(3, 1, tmp.file("ckpt"));
    runLeg(cluster, leg);
    // Node n's own rank is n: the first rank whose own file holds part of fc1.weight.
    for (int node = 2; node >= 0; --node) {
      auto reader = checkpoint::CheckpointReader::open(stepFile(tmp.file("ckpt"), node, 2));
      for (const auto& e : reader.entries()) {
        if (e.owner == static_cast<uint32_t>(node) &&
            e.name == "optimizer/adam/fc1.weight/exp_avg") {
          owner = e.owner;
        }
      }
    }
  }
  // The node whose file holds `owner`'s shards as its own, and the one keeping the replica.
  int home() const { return static_cast<int>(owner); }
  int keeper() const { return (static_cast<int>(owner) + 2) % 3; }
};

// Note [Local shard reads] in sharded_checkpointer.cpp: 4 ranks on 2 nodes save, so each node's
// file holds every rank's shards; restored by 4 ranks on those nodes, by 2 and by 6, every rank
// reads what it needs from its own node's file and the group carries no shard: only the
// parameters' all-gather after the load and a few bytes of agreement.
TEST(ShardedCheckpoint, RanksThatCanReadEveryShardOnTheirNodeSendNoneAtAnyWorldSize) {
  TempDir tmp;
  auto wide = [] { return Mlp(7, 512, 5); };
  Cluster saving(4, 2, tmp.file("ckpt"));
  Leg saved;
  saved.to = 2;
  saved.saves = {1};
  runLegOf(saving, saved, 7, 5, wide);
  uint64_t paramBytes = 0;  // the shards are three times as much: master, exp_avg, exp_avg_sq
  for (const auto& [name, t] : saved.end.params) paramBytes += t.nbytes();
  for (int perNode : {2, 1, 3}) {
    Cluster cluster(2 * perNode, perNode, saving.dir);
    Leg leg;
    leg.from = leg.to = 2;
    leg.restore = true;
    runLegOf(cluster, leg, 7, 5, wide);
    const std::string what = fmt::format("4 ranks -> {}", 2 * perNode);
    ASSERT_TRUE(leg.restored[0].has_value()) << what;
    expectSame(leg.loaded, saved.end, what);
    // The stage-2 parameters' all-gather after the load, and a slack far below one shard.
    const uint64_t world = static_cast<uint64_t>(2 * perNode);
    const uint64_t allgather = paramBytes * (world - 1) / world;
    for (int r = 0; r < 2 * perNode; ++r) {
      EXPECT_LT(leg.restoreBytes[r], allgather + paramBytes / 20)
          << what << ": rank " << r << " sent shards";
    }
  }
}

TEST(ShardedCheckpoint, AShardDamagedOnOneNodeIsReadFromItsReplica) {
  TwoSaves saved;
  damageShard(stepFile(saved.tmp.file("ckpt"), saved.home(), 2), saved.owner);
  Cluster cluster(3, 1, saved.tmp.file("ckpt"));
  const Leg after = restoreOnly(cluster, 3);
  ASSERT_TRUE(after.restored[0].has_value());
  EXPECT_EQ(after.restored[0]->step, 2);
  EXPECT_EQ(after.restored[0]->skipped, "");
}

TEST(ShardedCheckpoint, AShardDamagedEverywhereFallsBackToTheNextOlderCompleteStepNamingIt) {
  TwoSaves saved;
  // What step 1 held: the same run, stopped after step 1.
  Leg upTo1;
  upTo1.to = 2;
  {
    Cluster c(3, 1, saved.tmp.file("other"));
    runLeg(c, upTo1);
  }
  damageShard(stepFile(saved.tmp.file("ckpt"), saved.home(), 2), saved.owner);
  damageShard(stepFile(saved.tmp.file("ckpt"), saved.keeper(), 2), saved.owner);
  Cluster cluster(3, 1, saved.tmp.file("ckpt"));
  const Leg after = restoreOnly(cluster, 3);
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(after.restored[r].has_value());
    EXPECT_EQ(after.restored[r]->step, 1);
    EXPECT_NE(after.restored[r]->skipped.find(
                  fmt::format("checkpoint step 2: the shards of rank {} are damaged", saved.owner)),
              std::string::npos)
        << after.restored[r]->skipped;
  }
  expectSame(after.loaded, upTo1.end, "step 1");
}

}  // namespace
}  // namespace dtrain::testing::checkpoint_sharded_test
