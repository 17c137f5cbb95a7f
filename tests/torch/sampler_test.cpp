#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include <torch/torch.h>

#include "dtrain/base/error.h"
#include "dtrain/torch/distributed_sampler.h"

namespace dtrain::sampler_test {
namespace {

using Shards = std::vector<std::vector<size_t>>;

Shards shardsOf(size_t n, int world, SamplerOptions options, int64_t epoch) {
  Shards out;
  for (int r = 0; r < world; ++r) {
    DistributedSampler s(n, world, r, options);
    s.setEpoch(epoch);
    out.push_back(s.indices());
  }
  return out;
}

SamplerOptions shuffled(uint64_t seed, bool dropLast = false) {
  SamplerOptions o;
  o.seed = seed;
  o.dropLast = dropLast;
  return o;
}

void checkMatchesPyTorch() {
  // torch.utils.data.distributed.DistributedSampler (PyTorch 1.13 and 2.14.1 alike), shuffle=True.
  struct Case {
    size_t n;
    int world;
    uint64_t seed;
    int64_t epoch;
    bool dropLast;
    Shards expected;
  };
  const std::vector<Case> cases = {
      {10, 3, 0, 0, false, {{4, 5, 0, 2}, {1, 3, 8, 4}, {7, 9, 6, 1}}},
      {10, 3, 7, 1, false, {{3, 1, 4, 9}, {5, 2, 7, 3}, {0, 6, 8, 5}}},
      {10, 4, 0, 2, true, {{8, 6}, {7, 9}, {1, 0}, {5, 4}}},
      {5, 4, 0, 0, false, {{4, 2}, {0, 4}, {1, 0}, {3, 1}}},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(shardsOf(c.n, c.world, shuffled(c.seed, c.dropLast), c.epoch), c.expected)
        << "n=" << c.n << " world=" << c.world << " seed=" << c.seed << " epoch=" << c.epoch;
  }
}

void checkPartitionsCoverTheDatasetOncePlusPadding() {
  for (size_t n : {0, 1, 7, 12, 13}) {
    for (int world : {1, 2, 3, 4, 5}) {
      auto shards = shardsOf(n, world, shuffled(3), 0);
      std::map<size_t, int> count;
      size_t total = 0;
      for (const auto& s : shards) {
        EXPECT_EQ(s.size(), shards[0].size()) << "every rank gets as many samples";
        for (size_t i : s) ++count[i];
        total += s.size();
      }
      EXPECT_EQ(total, (n + world - 1) / world * world);
      EXPECT_EQ(count.size(), n) << "every sample at least once";
      size_t repeats = 0;
      for (auto& [i, c] : count) {
        EXPECT_LT(i, n);
        repeats += c - 1;
      }
      EXPECT_EQ(repeats, total - n) << "only the padding repeats";
    }
  }
}

void checkDropLastCutsToAMultipleOfTheWorld() {
  auto shards = shardsOf(13, 4, shuffled(1, true), 0);
  std::set<size_t> seen;
  for (const auto& s : shards) {
    EXPECT_EQ(s.size(), 3u);
    seen.insert(s.begin(), s.end());
  }
  EXPECT_EQ(seen.size(), 12u) << "no sample twice";
}

void checkEpochsDifferAndAreReproducible() {
  auto e0 = shardsOf(20, 2, shuffled(5), 0);
  auto e1 = shardsOf(20, 2, shuffled(5), 1);
  EXPECT_NE(e0, e1);
  EXPECT_EQ(e1, shardsOf(20, 2, shuffled(5), 1));
  SamplerOptions sequential;
  sequential.shuffle = false;
  EXPECT_EQ(shardsOf(5, 2, sequential, 3), (Shards{{0, 2, 4}, {1, 3, 0}}));
}

void checkNextHandsOutBatchesAndResetRewinds() {
  DistributedSampler s(10, 2, 1, shuffled(0));
  std::vector<size_t> all;
  while (auto batch = s.next(2)) all.insert(all.end(), batch->begin(), batch->end());
  EXPECT_EQ(all, s.indices());
  EXPECT_FALSE(s.next(2).has_value());
  s.reset();
  EXPECT_EQ(s.next(100).value(), s.indices());
}

void checkResumeAtTheSameWorldSizeContinuesExactly() {
  for (bool dropLast : {false, true}) {
    auto options = shuffled(9, dropLast);
    auto full = shardsOf(23, 3, options, 4);
    for (size_t consumed : {0, 1, 5, 7, 8}) {
      for (int r = 0; r < 3; ++r) {
        DistributedSampler before(23, 3, r, options);
        before.setEpoch(4);
        for (size_t k = 0; k < consumed; ++k) before.next(1);
        auto state = SamplerState::decode(before.state().encode());
        DistributedSampler after(23, 3, r, options);
        after.loadState(state);
        std::vector<size_t> expected(full[r].begin() + std::min(consumed, full[r].size()),
                                     full[r].end());
        EXPECT_EQ(after.indices(), expected) << "rank " << r << " consumed " << consumed;
        EXPECT_EQ(after.epoch(), 4);
      }
    }
  }
}

void checkResumeAtAnotherWorldSizeReshardsTheRemainder() {
  const size_t n = 29;
  auto options = shuffled(11);
  auto full = shardsOf(n, 4, options, 2);
  const size_t consumed = 3;  // per rank, at world size 4
  DistributedSampler saver(n, 4, 0, options);
  saver.setEpoch(2);
  SamplerState state = saver.state(consumed);
  EXPECT_EQ(state.cursor, 12u);

  // Every sample not yet seen, exactly once (the first epoch's padding is not owed).
  std::set<size_t> seen;
  for (const auto& s : full) seen.insert(s.begin(), s.begin() + consumed);
  std::set<size_t> owed;
  for (size_t i = 0; i < n; ++i) {
    if (!seen.count(i)) owed.insert(i);
  }
  for (int world : {1, 2, 3, 5}) {
    Shards resumed;
    for (int r = 0; r < world; ++r) {
      DistributedSampler s(n, world, r, options);
      s.loadState(state);
      resumed.push_back(s.indices());
    }
    std::set<size_t> got;
    size_t total = 0;
    for (const auto& s : resumed) {
      EXPECT_EQ(s.size(), resumed[0].size());
      got.insert(s.begin(), s.end());
      total += s.size();
    }
    EXPECT_TRUE(std::includes(got.begin(), got.end(), owed.begin(), owed.end()))
        << "world " << world;
    EXPECT_EQ(total, (owed.size() + world - 1) / world * world) << "world " << world;
    // Resuming again from the resumed run continues from the same global position.
    DistributedSampler again(n, world, 0, options);
    again.loadState(state);
    EXPECT_EQ(again.state(1).cursor, std::min<uint64_t>(n, state.cursor + world));
  }
}

void checkEncodingRoundTripsAndRejectsDamage() {
  SamplerState s;
  s.seed = 0x0102030405060708ull;
  s.epoch = 7;
  s.datasetSize = 1000;
  s.cursor = 64;
  s.shuffle = true;
  s.dropLast = true;
  auto bytes = s.encode();
  ASSERT_EQ(bytes.size(), SamplerState::kEncodedSize);
  EXPECT_EQ(std::string(bytes.begin(), bytes.begin() + 8), "DTSAMPLR");
  EXPECT_EQ(bytes[16], 0x08);  // little-endian seed
  EXPECT_EQ(SamplerState::decode(bytes), s);

  auto expectRejected = [](std::vector<uint8_t> b, const std::string& part) {
    try {
      SamplerState::decode(b);
      ADD_FAILURE() << "accepted, expected: " << part;
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  expectRejected(std::vector<uint8_t>(bytes.begin(), bytes.end() - 1), "expected 48 bytes");
  auto badMagic = bytes;
  badMagic[0] = 'X';
  expectRejected(badMagic, "magic");
  auto badVersion = bytes;
  badVersion[8] = 2;
  expectRejected(badVersion, "version 2");
  auto badCursor = bytes;
  badCursor[41] = 0xff;
  expectRejected(badCursor, "cursor");
}

void checkLoadStateRefusesAnotherDatasetOrSeed() {
  DistributedSampler s(100, 2, 0, shuffled(1));
  auto state = s.state();
  DistributedSampler otherSize(99, 2, 0, shuffled(1));
  EXPECT_THROW(otherSize.loadState(state), InvalidArgument);
  DistributedSampler otherSeed(100, 2, 0, shuffled(2));
  EXPECT_THROW(otherSeed.loadState(state), InvalidArgument);
}

std::vector<size_t> rowsOf(const torch::data::TensorExample& batch) {
  std::vector<size_t> rows;
  for (int64_t i = 0; i < batch.data.size(0); ++i) {
    rows.push_back(static_cast<size_t>(batch.data[i][0].item<float>() / 2));
  }
  return rows;
}

void checkWorksAsADataLoaderSamplerAndSerializes() {
  auto data = torch::arange(40).reshape({20, 2}).to(torch::kFloat);
  auto dataset = torch::data::datasets::TensorDataset(data).map(
      torch::data::transforms::Stack<torch::data::TensorExample>());
  DistributedSampler sampler(20, 2, 1, shuffled(4));
  // The loader holds a copy; the program keeps `sampler`, as it would in Python.
  auto loader = torch::data::make_data_loader(std::move(dataset), sampler,
                                              torch::data::DataLoaderOptions().batch_size(3));
  std::vector<std::vector<size_t>> epochs;
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    sampler.setEpoch(epoch);  // reaches the loader's copy
    std::vector<size_t> rows;
    for (auto& batch : *loader) {
      auto r = rowsOf(batch);
      rows.insert(rows.end(), r.begin(), r.end());
    }
    EXPECT_EQ(rows, sampler.indices()) << "epoch " << epoch;
    epochs.push_back(rows);
  }
  EXPECT_NE(epochs[0], epochs[1]) << "setEpoch on the kept sampler did not reach the loader";

  // state() of the kept sampler reports what the loader handed out: a checkpoint taken after two
  // batches resumes with the rest of the epoch.
  sampler.setEpoch(2);
  const auto expected = sampler.indices();
  auto it = loader->begin();
  ++it;  // the loader has now handed out two batches of 3
  EXPECT_EQ(sampler.state().cursor, 6u * 2);
  torch::serialize::OutputArchive out;
  sampler.save(out);
  std::stringstream stream;
  out.save_to(stream);
  torch::serialize::InputArchive in;
  in.load_from(stream);
  DistributedSampler restored(20, 2, 1, shuffled(4));
  restored.load(in);
  EXPECT_EQ(restored.state(), sampler.state());
  EXPECT_EQ(restored.indices(), std::vector<size_t>(expected.begin() + 6, expected.end()));
}

void checkTakesPyTorchsArgumentOrder() {
  // PyTorch's DistributedSampler(dataset, num_replicas=3, rank=1) on 10 samples, seed 0, epoch 0
  // (the table in checkMatchesPyTorch), written as a port from Python would write it.
  DistributedSampler ported(10, /*numReplicas=*/3, /*rank=*/1, shuffled(0));
  EXPECT_EQ(ported.indices(), (std::vector<size_t>{1, 3, 8, 4}));
  // The old order, (rank, worldSize), is refused for every valid pair: a rank is below the world
  // size, so swapped values are never a valid (numReplicas, rank).
  for (int world = 1; world <= 6; ++world) {
    for (int rank = 0; rank < world; ++rank) {
      try {
        DistributedSampler swapped(10, rank, world);
        ADD_FAILURE() << "DistributedSampler(10, " << rank << ", " << world << ") was accepted";
      } catch (const InvalidArgument& e) {
        EXPECT_NE(std::string(e.what()).find("numReplicas (the world size) before rank"),
                  std::string::npos)
            << e.what();
      }
    }
  }
}

TEST(DistributedSampler, MatchesPyTorchAndPartitionsEachEpoch) {
  checkMatchesPyTorch();
  checkPartitionsCoverTheDatasetOncePlusPadding();
  checkDropLastCutsToAMultipleOfTheWorld();
  checkEpochsDifferAndAreReproducible();
}

TEST(DistributedSampler, TakesPyTorchsArgumentOrder) { checkTakesPyTorchsArgumentOrder(); }

TEST(DistributedSampler, SamplerInterfaceAndDataLoader) {
  checkNextHandsOutBatchesAndResetRewinds();
  checkWorksAsADataLoaderSamplerAndSerializes();
}

TEST(DistributedSampler, ResumesMidEpoch) {
  checkResumeAtTheSameWorldSizeContinuesExactly();
  checkResumeAtAnotherWorldSizeReshardsTheRemainder();
}

TEST(DistributedSampler, StateFormatAndValidation) {
  checkEncodingRoundTripsAndRejectsDamage();
  checkLoadStateRefusesAnotherDatasetOrSeed();
}

// nextShare(): the ranks' shares of each window are disjoint and cover it exactly, uneven when
// the world does not divide the window; the cursor moves by the whole window on every rank; a
// re-shard to another world mid-epoch goes on from there; the epoch's last window is short.
TEST(DistributedSampler, SharesOfAGlobalBatchCoverItAndReshardMidEpoch) {
  SamplerOptions o;
  o.seed = 3;
  DistributedSampler whole(23, 1, 0, o);
  std::vector<DistributedSampler> ranks;
  for (int r = 0; r < 3; ++r) ranks.emplace_back(23, 3, r, o);
  for (int step = 0; step < 2; ++step) {
    auto want = *whole.nextShare(7);
    std::vector<size_t> got;
    for (int r = 0; r < 3; ++r) {
      auto share = *ranks[static_cast<size_t>(r)].nextShare(7);
      EXPECT_EQ(share.size(), r == 0 ? 3u : 2u) << "rank " << r;
      got.insert(got.end(), share.begin(), share.end());
    }
    std::sort(got.begin(), got.end());
    std::sort(want.begin(), want.end());
    EXPECT_EQ(got, want) << "step " << step;
    for (auto& r : ranks) EXPECT_EQ(r.state().cursor, 7u * (step + 1));
  }
  // Two of the three go on as a world of two from the cursor (14).
  const SamplerState at = ranks[0].state();
  ranks.pop_back();
  for (int r = 0; r < 2; ++r) ranks[static_cast<size_t>(r)].reshard(2, r, at);
  auto want = *whole.nextShare(7);
  auto a = *ranks[0].nextShare(7);
  auto b = *ranks[1].nextShare(7);
  EXPECT_EQ(a.size(), 4u);
  EXPECT_EQ(b.size(), 3u);
  a.insert(a.end(), b.begin(), b.end());
  std::sort(a.begin(), a.end());
  std::sort(want.begin(), want.end());
  EXPECT_EQ(a, want);
  // 2 of 23 left: a short last window, then the end.
  EXPECT_EQ(ranks[0].nextShare(7)->size() + ranks[1].nextShare(7)->size(), 2u);
  EXPECT_FALSE(ranks[0].nextShare(7).has_value());
  EXPECT_DOUBLE_EQ(sampleWeight(3, 10, 4), 1.2);
  EXPECT_DOUBLE_EQ(sampleWeight(2, 8, 4), 1.0);
}

}  // namespace
}  // namespace dtrain::sampler_test
