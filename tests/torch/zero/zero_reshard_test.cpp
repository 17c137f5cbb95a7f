// Shard records and loading a re-sharded state: what the sharded checkpoint builds on. A state
// taken from 4 ranks' records loads exactly at 3, then at 2 (the records re-assembled after each
// load are bitwise what was saved), and training goes on as the 4-rank run does.
#include <gtest/gtest.h>

#include <map>
#include <mutex>

#include "zero_support.h"

namespace dtrain::testing::zero_reshard_test {
namespace {

constexpr int64_t kGlobalBatch = 12;  // divides among 4, 3 and 2 ranks

using Snapshot = ShardSnapshot;

ShardReader readerOf(const Snapshot& snap) {
  return [&snap](const ShardField& what, torch::Tensor& out) {
    if (what.field == "step") {
      auto it = snap.steps.find(what.param);
      if (it == snap.steps.end()) return false;
      out.fill_(it->second);
      return true;
    }
    auto it = snap.fields.find({what.param, what.field});
    if (it == snap.fields.end()) return false;
    out.copy_(it->second.narrow(0, what.begin, what.end - what.begin));
    return true;
  };
}

struct Leg {
  Snapshot end;
  std::map<std::string, torch::Tensor> params;  // rank 0's module
  Snapshot loaded;                              // the records right after loading
};

// Trains steps [from, to) on `world` ranks, starting from `start` when given.
Leg trainLeg(int world, int stage, int from, int to, const Snapshot* start) {
  Leg leg;
  std::mutex mutex;
  auto threads = ThreadWorld::create(world);
  threads->run([&](int rank) {
    auto group = threadGroup(*threads, rank);
    // Another start than the run that saved: the load decides.
    Mlp net = buildSeeded(100 + world, [] { return Mlp(7, 13, 5); });
    DistributedDataParallel<Mlp> ddp(net, group);
    ZeroOptions zo;
    zo.stage = stage;
    zo.firstUnitBytes = 128;
    zo.unitBytes = 512;
    ShardedOptimizer adam(ddp, factoryFor("adamw"), zo);
    if (start) {
      adam.loadShardState(readerOf(*start));
      std::lock_guard<std::mutex> lock(mutex);
      addRecords(leg.loaded, adam.shardRecords());
    }
    for (int s = from; s < to; ++s) {
      auto x = randnSeeded({kGlobalBatch, 7}, 500 + s), y = randnSeeded({kGlobalBatch, 5}, 700 + s);
      adam.zero_grad();
      torch::mse_loss(ddp(shard(x, rank, world)), shard(y, rank, world)).backward();
      adam.step();
    }
    std::lock_guard<std::mutex> lock(mutex);
    addRecords(leg.end, adam.shardRecords());
    if (rank == 0) {
      for (const auto& p : net->named_parameters())
        leg.params[p.key()] = p.value().detach().clone();
    }
  });
  return leg;
}

void expectSameSnapshot(const Snapshot& got, const Snapshot& want) {
  ASSERT_EQ(got.fields.size(), want.fields.size());
  for (const auto& [key, t] : want.fields) {
    ASSERT_TRUE(got.fields.count(key)) << key.first << " " << key.second;
    EXPECT_TRUE(torch::equal(got.fields.at(key), t)) << key.first << " " << key.second;
  }
  EXPECT_EQ(got.steps, want.steps);
}

class ZeroReshard : public ::testing::TestWithParam<int> {};

TEST_P(ZeroReshard, FourThenThreeThenTwoRanksLoadExactlyAndTrainOn) {
  const int stage = GetParam();
  const Leg whole = trainLeg(4, stage, 0, 9, nullptr);  // the run nobody interrupts
  const Leg four = trainLeg(4, stage, 0, 3, nullptr);
  ASSERT_FALSE(four.end.steps.empty()) << "AdamW counts steps";
  for (const auto& [key, t] : four.end.fields) {
    ASSERT_FALSE(torch::isnan(t).any().item<bool>()) << "the records tile " << key.first;
  }
  const Leg three = trainLeg(3, stage, 3, 6, &four.end);
  expectSameSnapshot(three.loaded, four.end);
  const Leg two = trainLeg(2, stage, 6, 9, &three.end);
  expectSameSnapshot(two.loaded, three.end);
  for (const auto& [name, t] : whole.params) {
    EXPECT_LE(relativeError(two.params.at(name), t), 1e-5) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, ZeroReshard, ::testing::Values(1, 2),
                         [](const auto& info) { return "stage" + std::to_string(info.param); });

// A state without optimizer fields (saved before the first step) loads as "never stepped".
TEST(ZeroReshard, ParametersOnlyLeaveTheOptimizerUnstepped) {
  Snapshot snap;
  {
    const Leg fresh = trainLeg(2, 2, 0, 0, nullptr);
    for (const auto& [key, t] : fresh.end.fields) {
      if (key.second == "master") snap.fields[key] = t.clone().fill_(0.25);
    }
  }
  const Leg loaded = trainLeg(3, 2, 0, 0, &snap);
  for (const auto& [key, t] : loaded.loaded.fields) {
    EXPECT_EQ(key.second, "master") << "no optimizer state was saved";
  }
  for (const auto& [name, t] : loaded.params) {
    EXPECT_TRUE(torch::equal(t, torch::full_like(t, 0.25)))
        << name << ": all-gathered after the load";
  }
}

// A load into an optimizer that has stepped fills its state's own tensors in place (no second
// copy of the state in memory), unless something holds a view of them -- a save in flight, here
// the records taken before -- which then keeps the values it holds while a new tensor is loaded.
TEST(ZeroReshard, ALoadFillsTheStatesOwnTensorsUnlessAViewOfThemIsHeld) {
  constexpr int kWorld = 2;
  auto threads = ThreadWorld::create(kWorld);
  threads->run([&](int rank) {
    auto group = threadGroup(*threads, rank);
    Mlp net = buildSeeded(100, [] { return Mlp(7, 13, 5); });
    DistributedDataParallel<Mlp> ddp(net, group);
    ZeroOptions zo;
    zo.stage = 2;
    ShardedOptimizer adam(ddp, factoryFor("adamw"), zo);
    auto train = [&](int s) {
      auto x = randnSeeded({kGlobalBatch, 7}, 500 + s), y = randnSeeded({kGlobalBatch, 5}, 700 + s);
      adam.zero_grad();
      torch::mse_loss(ddp(shard(x, rank, kWorld)), shard(y, rank, kWorld)).backward();
      adam.step();
    };
    // This rank's records hold its own elements alone (NaN elsewhere): compared bitwise so.
    auto expectSaved = [&](const Snapshot& got, const Snapshot& want) {
      ASSERT_EQ(got.fields.size(), want.fields.size());
      for (const auto& [key, t] : want.fields) {
        ASSERT_TRUE(got.fields.count(key)) << key.first << " " << key.second;
        EXPECT_TRUE(torch::allclose(got.fields.at(key), t, 0, 0, /*equal_nan=*/true))
            << "rank " << rank << ": " << key.first << " " << key.second;
      }
      EXPECT_EQ(got.steps, want.steps);
    };
    // The first field's place in this rank's first record.
    auto where = [&] {
      auto records = adam.shardRecords();
      EXPECT_FALSE(records.empty() || records[0].state.empty());
      return records[0].state[0].second.data_ptr();
    };
    train(0);
    train(1);
    Snapshot saved;
    addRecords(saved, adam.shardRecords());
    for (auto& [key, t] : saved.fields) t = t.clone();
    train(2);
    void* const before = where();
    adam.loadShardState(readerOf(saved));
    Snapshot loaded;
    addRecords(loaded, adam.shardRecords());
    expectSaved(loaded, saved);
    EXPECT_EQ(where(), before) << "rank " << rank << ": loaded into the state's own tensor";

    train(3);
    const auto held = adam.shardRecords();  // views of the state, as a save in flight holds
    const at::Tensor heldValues = held[0].state[0].second.clone();
    adam.loadShardState(readerOf(saved));
    EXPECT_NE(where(), held[0].state[0].second.data_ptr()) << "rank " << rank;
    EXPECT_TRUE(torch::equal(held[0].state[0].second, heldValues))
        << "rank " << rank << ": the held view's values changed under it";
    Snapshot again;
    addRecords(again, adam.shardRecords());
    expectSaved(again, saved);
  });
}

}  // namespace
}  // namespace dtrain::testing::zero_reshard_test
