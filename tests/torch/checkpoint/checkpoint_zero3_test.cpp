// Checkpoints of ZeRO stage 3 with ranks as threads on simulated nodes, one directory each
// (Note [Stage-3 checkpoints]): the marked layers' parameters are saved from the shard records as
// owned module entries, never gathered; a restore at the same world size loads bitwise what was
// saved and training goes on bitwise as the uninterrupted run; 2 ranks restore at 3, a stage-3
// save restores into stage 2 and into other units, a stage-2 save into stage 3; export assembles
// the parameters from every node's files, also when a rank's block is all padding; a module whose
// units are freed is refused by name when no stage-3 optimizer over it is registered.
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <set>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../zero/zero_support.h"
#include "checkpoint/file_io.h"
#include "checkpoint/format.h"
#include "checkpoint_support.h"
#include "dtrain/torch/autocast.h"
#include "dtrain/torch/checkpoint.h"
#include "dtrain/torch/fully_shard.h"
#include "dtrain/torch/zero.h"
#include "test_support.h"

namespace dtrain::testing::checkpoint_zero3_test {
namespace {

constexpr int64_t kGlobalBatch = 12;  // divides among 2 and 3 ranks

// Two layers and a head at the root, with a buffer. `everyLayer`: both layers are marked (two
// units and the root's); else only the second is, and the first joins the head in the root's
// unit. The parameter names are the same either way (body.0.weight, ..., head.bias).
struct Z3NetImpl : torch::nn::Module {
  explicit Z3NetImpl(bool everyLayer) {
    torch::nn::Linear first(7, 16), second(16, 11);
    body = register_module(
        "body", everyLayer ? shardEveryChild(torch::nn::Sequential(first, torch::nn::Tanh(), second,
                                                                   torch::nn::Tanh()))
                           : torch::nn::Sequential(first, torch::nn::Tanh(), ShardedUnit(second),
                                                   torch::nn::Tanh()));
    head = register_module("head", torch::nn::Linear(11, 5));
    shift = register_buffer("shift", torch::linspace(-0.5, 0.5, 5));
  }
  torch::Tensor forward(const torch::Tensor& x) { return head(body->forward(x)) + shift; }
  torch::nn::Sequential body{nullptr};
  torch::nn::Linear head{nullptr};
  torch::Tensor shift;
};
TORCH_MODULE(Z3Net);

using Params = std::map<std::string, torch::Tensor>;

// Bytes of the parameter storages of every marked module (each parameter once).
size_t markedBytes(torch::nn::Module& net) {
  size_t bytes = 0;
  for (const auto& m : net.modules(/*include_self=*/true)) {
    if (std::dynamic_pointer_cast<ShardedUnitImpl>(m) == nullptr) continue;
    for (const auto& p : m->parameters(/*recurse=*/false)) bytes += p.storage().nbytes();
  }
  return bytes;
}

// One leg of training on `world` ranks, `perNode` to a node, each node its own directory under
// `dir`: restores (when asked), trains steps [from, to), saves the steps in `saves`.
struct Leg {
  std::string dir;
  int world = 2;
  int perNode = 1;
  int stage = 3;
  bool everyLayer = true;
  at::ScalarType dtype = at::kFloat;
  bool paramDtype = false;  // ZeroOptions::paramDtype = bfloat16; forwards under autocast
  int from = 0, to = 0;
  std::vector<int64_t> saves;
  bool restore = false;
  // What it ends with: rank 0's gathered parameters and buffer, every rank's records; the same
  // right after restore().
  Params loaded, end;
  ShardSnapshot loadedRecords, endRecords;
  size_t markedAfterRestore = 1;  // rank 0, stage 3
  bool ranksAgree = true;         // every rank gathered the same parameters at the end
  std::vector<std::optional<RestoredCheckpoint>> restored;  // per rank
};

Params gathered(ShardedOptimizer& optimizer, Z3Net& net) {
  Params out;
  for (auto& [name, t] : gatherFullParameters(optimizer)) out[name] = t;
  out["shift"] = net->shift.clone();
  return out;
}

void runLeg(Leg& leg) {
  leg.loaded = leg.end = {};  // a leg copied from another starts with no results
  leg.loadedRecords = leg.endRecords = {};
  leg.markedAfterRestore = 1;
  leg.ranksAgree = true;
  auto threads = ThreadWorld::create(leg.world);
  auto store = std::make_shared<store::HashStore>();
  std::mutex mutex;
  std::vector<Params> ends(static_cast<size_t>(leg.world));
  leg.restored.assign(static_cast<size_t>(leg.world), std::nullopt);
  threads->run([&](int rank) {
    auto group = threadGroup(*threads, rank);
    // Another start than the run that saved: the restore decides.
    Z3Net net = buildSeeded(100 + leg.world + leg.from, [&] { return Z3Net(leg.everyLayer); });
    net->to(leg.dtype);
    DistributedDataParallel<Z3Net> ddp(net, group);
    ZeroOptions zo;
    zo.stage = leg.stage;
    zo.firstUnitBytes = 128;
    zo.unitBytes = 512;
    if (leg.paramDtype) zo.paramDtype = at::kBFloat16;
    ShardedOptimizer adam(ddp, factoryFor("adamw"), zo);
    CheckpointOptions options = optionsFor(leg.dir);
    options.nodeId = rank / leg.perNode;
    options.localRank = rank % leg.perNode;
    options.store = store;
    options.allowWorldSizeChange = true;
    Checkpointer checkpointer(group, options);
    checkpointer.addModule("model", net);
    checkpointer.addOptimizer("adam", adam);
    if (leg.restore) {
      auto restored = checkpointer.restore();
      const size_t marked = markedBytes(*net);
      auto records = adam.shardRecords();
      Params loaded = gathered(adam, net);
      std::lock_guard<std::mutex> lock(mutex);
      leg.restored[static_cast<size_t>(rank)] = restored;
      addRecords(leg.loadedRecords, records);
      if (rank == 0) {
        leg.loaded = loaded;
        leg.markedAfterRestore = marked;
      }
    }
    for (int s = leg.from; s < leg.to; ++s) {
      auto x = randnSeeded({kGlobalBatch, 7}, 500 + s), y = randnSeeded({kGlobalBatch, 5}, 700 + s);
      adam.zero_grad();
      torch::Tensor out;
      {
        AutocastGuard autocast(torch::kCPU, leg.paramDtype);
        out = ddp(shard(x, rank, leg.world).to(leg.dtype));
      }
      torch::mse_loss(out.to(torch::kFloat), shard(y, rank, leg.world)).backward();
      adam.step();
      if (std::count(leg.saves.begin(), leg.saves.end(), s)) checkpointer.save(s);
    }
    auto records = adam.shardRecords();
    Params end = gathered(adam, net);
    std::lock_guard<std::mutex> lock(mutex);
    addRecords(leg.endRecords, records);
    ends[static_cast<size_t>(rank)] = end;
  });
  leg.end = ends[0];
  for (const auto& other : ends) {
    for (const auto& [name, t] : leg.end) {
      leg.ranksAgree = leg.ranksAgree && torch::equal(other.at(name), t);
    }
  }
}

void expectSameParams(const Params& got, const Params& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (const auto& [name, t] : want) {
    ASSERT_TRUE(got.count(name)) << what << ": " << name;
    EXPECT_EQ(got.at(name).scalar_type(), t.scalar_type()) << what << ": " << name;
    EXPECT_TRUE(torch::equal(got.at(name), t)) << what << ": " << name;
  }
}

void expectSameRecords(const ShardSnapshot& got, const ShardSnapshot& want,
                       const std::string& what) {
  ASSERT_EQ(got.fields.size(), want.fields.size()) << what;
  for (const auto& [key, t] : want.fields) {
    ASSERT_TRUE(got.fields.count(key)) << what << ": " << key.first << " " << key.second;
    EXPECT_TRUE(torch::equal(got.fields.at(key), t))
        << what << ": " << key.first << " " << key.second;
  }
  EXPECT_EQ(got.steps, want.steps) << what;
}

std::string stepFile(const std::string& dir, int node, int64_t step) {
  return fmt::format("{}/node{}/step-{:08d}", dir, node, step);
}

// The owners of `name`'s entries in `path` (kReplicated for a replicated one), with their dtype.
std::map<uint32_t, checkpoint::DType> entriesOf(const std::string& path, const std::string& name) {
  std::map<uint32_t, checkpoint::DType> out;
  auto reader = checkpoint::CheckpointReader::open(path);
  for (const auto* e : reader.find(name)) out[e->owner] = e->dtype;
  return out;
}

// The pickle an export wrote (torch::pickle_load reads what torch.save writes) holds `want`.
void expectExported(const std::string& path, const Params& want) {
  const std::string bytes = readFile(path);
  auto dict = torch::pickle_load(std::vector<char>(bytes.begin(), bytes.end())).toGenericDict();
  EXPECT_EQ(dict.size(), want.size());
  for (const auto& [name, t] : want) {
    ASSERT_TRUE(dict.contains(name)) << name;
    EXPECT_TRUE(torch::equal(dict.at(name).toTensor(), t)) << name;
  }
}

// Rewrites the file at `path` as a save before Note [One copy of a freed master]
// (shard_entries.cpp) wrote it: each owned module entry of "model" also as the `master` entry of
// optimizer "adam" over the same range.
void addMasterEntries(const std::string& path) {
  auto reader = checkpoint::CheckpointReader::open(path);
  std::vector<checkpoint::EntrySpec> specs;
  std::vector<std::vector<uint8_t>> bytes;
  auto add = [&](const checkpoint::Entry& e, const std::string& name) {
    checkpoint::EntrySpec spec;
    spec.name = name;
    spec.kind = e.kind;
    spec.dtype = e.dtype;
    spec.shape = e.shape;
    spec.owner = e.owner;
    spec.elementOffset = e.elementOffset;
    spec.elementCount = e.elementCount;
    specs.push_back(spec);
    bytes.emplace_back(e.size);
    reader.read(e, bytes.back().data());
  };
  const std::string module = "module/model/";
  for (const auto& e : reader.entries()) {
    add(e, e.name);
    if (e.owner != checkpoint::kReplicated && e.name.rfind(module, 0) == 0) {
      add(e, "optimizer/adam/" + e.name.substr(module.size()) + "/master");
    }
  }
  const checkpoint::Header& h = reader.header();
  checkpoint::Layout layout = checkpoint::planLayout(h.step, h.epoch, h.worldSize, h.torchVersion,
                                                     specs);
  checkpoint::EntryData data;
  for (const auto& b : bytes) data.push_back(b.data());
  checkpoint::FileOps ops;
  std::vector<uint8_t> scratch;
  checkpoint::writeCheckpointFile(ops, path + ".old", layout, data, scratch);
  std::filesystem::rename(path + ".old", path);
}

class ShardedCheckpointStage3 : public ::testing::TestWithParam<at::ScalarType> {};

// Saved at step 2 by 2 ranks on 2 nodes, restored by 2: the marked layers' parameters are owned
// entries in the parameters' dtype (bfloat16: the float32 master records rounded), the head and
// the buffer replicated; the restore loads bitwise what was saved, leaves the marked layers
// freed, and training goes on bitwise as the uninterrupted run.
TEST_P(ShardedCheckpointStage3, SavedAndRestoredAtTheSameWorldSizeTrainsOnBitwise) {
  TempDir tmp;
  const checkpoint::DType format = GetParam() == at::kFloat ? checkpoint::DType::Float32
                                                            : checkpoint::DType::BFloat16;
  Leg whole;
  whole.dir = tmp.file("whole");
  whole.dtype = GetParam();
  whole.to = 6;
  runLeg(whole);
  Leg first = whole;
  first.dir = tmp.file("ckpt");
  first.to = 3;
  first.saves = {2};
  runLeg(first);
  for (int node = 0; node < 2; ++node) {
    const std::string file = stepFile(first.dir, node, 2);
    EXPECT_EQ(verifyErrorOf(file), "");
    for (const char* layer : {"module/model/body.0.weight", "module/model/body.2.weight"}) {
      EXPECT_EQ(entriesOf(file, layer),
                (std::map<uint32_t, checkpoint::DType>{{0, format}, {1, format}}))
          << file << " " << layer << ": one owned range per rank, never gathered";
    }
    // Note [One copy of a freed master] in shard_entries.cpp: float32 layers' masters are
    // their module entries; bfloat16 ones keep their float32 masters beside them.
    EXPECT_EQ(entriesOf(file, "optimizer/adam/body.0.weight/master"),
              (GetParam() == at::kFloat
                   ? std::map<uint32_t, checkpoint::DType>{}
                   : std::map<uint32_t, checkpoint::DType>{{0, checkpoint::DType::Float32},
                                                           {1, checkpoint::DType::Float32}}))
        << file;
    EXPECT_EQ(entriesOf(file, "module/model/head.weight"),
              (std::map<uint32_t, checkpoint::DType>{{checkpoint::kReplicated, format}}));
    EXPECT_EQ(entriesOf(file, "module/model/shift").count(checkpoint::kReplicated), 1u);
  }
  Leg second = whole;
  second.dir = first.dir;
  second.from = 3;
  second.restore = true;
  runLeg(second);
  ASSERT_TRUE(second.restored[0].has_value());
  EXPECT_EQ(second.restored[0]->step, 2);
  expectSameParams(second.loaded, first.end, "restored");
  expectSameRecords(second.loadedRecords, first.endRecords, "restored");
  EXPECT_EQ(second.markedAfterRestore, 0u) << "the restore left a marked layer gathered";
  EXPECT_TRUE(second.ranksAgree);
  expectSameParams(second.end, whole.end, "trained on after the restore");
  expectSameRecords(second.endRecords, whole.endRecords, "trained on after the restore");
}

INSTANTIATE_TEST_SUITE_P(Dtype, ShardedCheckpointStage3,
                         ::testing::Values(at::kFloat, at::kBFloat16), [](const auto& info) {
                           return std::string(info.param == at::kFloat ? "float32" : "bfloat16");
                         });

// A float32 stage-3 step as saves wrote it before Note [One copy of a freed master]
// (shard_entries.cpp): every record's master also as its own entry. It restores bitwise at the
// same world size and at 3 ranks.
TEST(ShardedCheckpointStage3OldFormat, AFileWithMasterEntriesRestoresBitwise) {
  TempDir tmp;
  Leg first;
  first.dir = tmp.file("ckpt");
  first.to = 3;
  first.saves = {2};
  runLeg(first);
  for (int node = 0; node < 2; ++node) {
    addMasterEntries(stepFile(first.dir, node, 2));
    EXPECT_EQ(entriesOf(stepFile(first.dir, node, 2), "optimizer/adam/body.0.weight/master").size(),
              2u);
  }
  for (int world : {2, 3}) {
    Leg second = first;
    second.world = world;
    second.from = second.to = 3;
    second.saves = {};
    second.restore = true;
    runLeg(second);
    ASSERT_TRUE(second.restored[0].has_value()) << world;
    EXPECT_EQ(second.restored[0]->step, 2) << world;
    expectSameParams(second.loaded, first.end, fmt::format("old format at {} ranks", world));
    expectSameRecords(second.loadedRecords, first.endRecords,
                      fmt::format("old format at {} ranks", world));
  }
}

// ZeroOptions::paramDtype (the marked layers gathered in bfloat16, under autocast): what a save
// keeps of them is the float32 masters, not their rounding -- owned float32 entries --, the
// restore loads bitwise what was saved and trains on bitwise, and an export of the step is the
// float32 model gatherFullParameters() gives.
TEST(ShardedCheckpointStage3ParamDtype, SavesTheFloat32MastersAndRestoresBitwise) {
  TempDir tmp;
  Leg whole;
  whole.dir = tmp.file("whole");
  whole.paramDtype = true;
  whole.to = 6;
  runLeg(whole);
  Leg first = whole;
  first.dir = tmp.file("ckpt");
  first.to = 3;
  first.saves = {2};
  runLeg(first);
  const std::string file = stepFile(first.dir, 0, 2);
  for (const char* layer : {"module/model/body.0.weight", "module/model/body.2.weight"}) {
    EXPECT_EQ(entriesOf(file, layer),
              (std::map<uint32_t, checkpoint::DType>{{0, checkpoint::DType::Float32},
                                                     {1, checkpoint::DType::Float32}}))
        << layer << ": the masters' values, in float32";
  }
  exportStateDict({file, stepFile(first.dir, 1, 2)}, tmp.file("model.pt"));
  for (const auto& [name, t] : first.end) EXPECT_EQ(t.scalar_type(), at::kFloat) << name;
  expectExported(tmp.file("model.pt"), first.end);
  Leg second = whole;
  second.dir = first.dir;
  second.from = 3;
  second.restore = true;
  runLeg(second);
  ASSERT_TRUE(second.restored[0].has_value());
  expectSameParams(second.loaded, first.end, "restored");
  expectSameRecords(second.loadedRecords, first.endRecords, "restored");
  EXPECT_EQ(second.markedAfterRestore, 0u);
  expectSameParams(second.end, whole.end, "trained on after the restore");
}

// 2 ranks on 2 nodes save step 2; 3 ranks on 3 nodes (node 2 new: it copies the step from a
// peer) load bitwise what was saved and train on within 1e-5 of the uninterrupted 2-rank run.
// Their save of step 5 spreads each layer over three files: export from one names what it
// lacks; from every node's file -- given as files, or the `checkpoint` tool given the
// directory -- it is the module the run ended with.
TEST(ShardedCheckpointStage3Resize, TwoRanksRestoreAtThreeAndExportFromEveryNode) {
  TempDir tmp;
  Leg whole;
  whole.dir = tmp.file("whole");
  whole.to = 6;
  runLeg(whole);
  Leg two = whole;
  two.dir = tmp.file("ckpt");
  two.to = 3;
  two.saves = {2};
  runLeg(two);
  Leg three = two;
  three.world = 3;
  three.from = 3;
  three.to = 6;
  three.saves = {5};
  three.restore = true;
  runLeg(three);
  ASSERT_TRUE(three.restored[2].has_value());
  EXPECT_EQ(three.restored[2]->savedWorldSize, 2);
  EXPECT_TRUE(three.restored[2]->copiedFromPeer);
  expectSameParams(three.loaded, two.end, "2 -> 3");
  expectSameRecords(three.loadedRecords, two.endRecords, "2 -> 3");
  EXPECT_TRUE(three.ranksAgree);
  for (const auto& [name, t] : whole.end) {
    EXPECT_LE(relativeError(three.end.at(name), t), 1e-5) << name;
  }

  const std::string alone = stepFile(three.dir, 0, 5);
  try {
    exportStateDict(alone, tmp.file("alone.pt"), "model", "libtorch");
    ADD_FAILURE() << "exported from one node's file of three";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("HINT: export the checkpoint's directory"),
              std::string::npos)
        << e.what();
  }
  exportStateDict({alone, stepFile(three.dir, 1, 5), stepFile(three.dir, 2, 5)},
                  tmp.file("model.pt"));
  expectExported(tmp.file("model.pt"), three.end);
  const std::string log = tmp.file("tool.out");
  const int status = std::system((binaryPath("checkpoint") + " export " + three.dir + " --to " +
                                  tmp.file("tool.pt") + " > " + log + " 2>&1")
                                     .c_str());
  ASSERT_EQ(WEXITSTATUS(status), 0) << readFile(log);
  expectExported(tmp.file("tool.pt"), three.end);
}

// A marked Linear(2, 1) at 4 ranks, one per node: 3 trained elements, so rank 3's block is all
// padding and it saves neither a record nor a parameter range. shards/records lists it as a
// saver all the same (Note [Sharded checkpoint files]): the `checkpoint` tool exports the layer
// from the directory (it wants every rank of the world an owner somewhere), and the step restores
// bitwise.
TEST(ShardedCheckpointStage3Padding, ARankWhoseBlockIsAllPaddingExportsAndRestoresBitwise) {
  TempDir tmp;
  const std::string dir = tmp.file("ckpt");
  constexpr int kWorld = 4;
  auto threads = ThreadWorld::create(kWorld);
  auto store = std::make_shared<store::HashStore>();
  struct Run {
    Params params;  // rank 0's, gathered
    ShardSnapshot records;
    std::vector<size_t> counts;                               // per rank: its records
    std::vector<std::optional<RestoredCheckpoint>> restored;  // per rank
  };
  // Trains steps 0 and 1 and saves step 1, or restores.
  auto run = [&](bool restore) {
    Run out;
    out.counts.assign(kWorld, 0);
    out.restored.assign(kWorld, std::nullopt);
    std::mutex mutex;
    threads->run([&](int rank) {
      auto group = threadGroup(*threads, rank);
      auto net = buildSeeded(restore ? 9 : 3, [] {
        return shardEveryChild(torch::nn::Sequential(torch::nn::Linear(2, 1)));
      });
      DistributedDataParallel<torch::nn::Sequential> ddp(net, group);
      ZeroOptions zo;
      zo.stage = 3;
      ShardedOptimizer adam(ddp, factoryFor("adamw"), zo);
      CheckpointOptions options = optionsFor(dir);
      options.nodeId = rank;
      options.localRank = 0;
      options.store = store;
      Checkpointer checkpointer(group, options);
      checkpointer.addModule("model", net);
      checkpointer.addOptimizer("adam", adam);
      std::optional<RestoredCheckpoint> restored;
      if (restore) restored = checkpointer.restore();
      for (int s = 0; s < 2 && !restore; ++s) {
        auto x = randnSeeded({kGlobalBatch, 2}, 500 + s);
        auto y = randnSeeded({kGlobalBatch, 1}, 700 + s);
        adam.zero_grad();
        torch::mse_loss(ddp(shard(x, rank, kWorld)), shard(y, rank, kWorld)).backward();
        adam.step();
        if (s == 1) checkpointer.save(s);
      }
      auto records = adam.shardRecords();
      Params full;
      for (auto& [name, t] : gatherFullParameters(adam)) full[name] = t;
      std::lock_guard<std::mutex> lock(mutex);
      addRecords(out.records, records);
      out.counts[static_cast<size_t>(rank)] = records.size();
      out.restored[static_cast<size_t>(rank)] = restored;
      if (rank == 0) out.params = full;
    });
    return out;
  };
  const Run saved = run(false);
  ASSERT_EQ(saved.counts[3], 0u) << "rank 3 holds a record: not the case under test";

  const std::string log = tmp.file("tool.out");
  const int status = std::system((binaryPath("checkpoint") + " export " + dir + " --to " +
                                  tmp.file("probe.pt") + " > " + log + " 2>&1")
                                     .c_str());
  ASSERT_EQ(WEXITSTATUS(status), 0) << readFile(log);
  expectExported(tmp.file("probe.pt"), saved.params);

  const Run restored = run(true);
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(restored.restored[static_cast<size_t>(r)].has_value()) << "rank " << r;
    EXPECT_EQ(restored.restored[static_cast<size_t>(r)]->step, 1);
  }
  expectSameParams(restored.params, saved.params, "restored");
  expectSameRecords(restored.records, saved.records, "restored");
}

// Records go by parameter name and range: a stage-3 save restores bitwise into stage 2 and into
// other units (only the second layer marked), and a stage-2 save into stage 3.
TEST(ShardedCheckpointStage3Layouts, RestoresIntoStage2AndOtherUnitsAndStage2IntoStage3) {
  TempDir tmp;
  Leg saved;
  saved.dir = tmp.file("ckpt");
  saved.to = 3;
  saved.saves = {2};
  runLeg(saved);
  auto restoreAs = [&](int stage, bool everyLayer, const std::string& dir, int from) {
    Leg leg;
    leg.dir = dir;
    leg.stage = stage;
    leg.everyLayer = everyLayer;
    leg.from = from;
    leg.to = from;
    leg.restore = true;
    runLeg(leg);
    return leg;
  };
  const Leg asStage2 = restoreAs(2, true, saved.dir, 3);
  expectSameParams(asStage2.loaded, saved.end, "stage 3 -> stage 2");
  expectSameRecords(asStage2.loadedRecords, saved.endRecords, "stage 3 -> stage 2");
  const Leg otherUnits = restoreAs(3, false, saved.dir, 3);
  expectSameParams(otherUnits.loaded, saved.end, "stage 3 -> other units");
  expectSameRecords(otherUnits.loadedRecords, saved.endRecords, "stage 3 -> other units");
  EXPECT_EQ(otherUnits.markedAfterRestore, 0u);

  Leg stage2 = saved;
  stage2.dir = tmp.file("stage2");
  stage2.stage = 2;
  runLeg(stage2);
  const Leg intoStage3 = restoreAs(3, true, stage2.dir, 3);
  expectSameParams(intoStage3.loaded, stage2.end, "stage 2 -> stage 3");
  expectSameRecords(intoStage3.loadedRecords, stage2.endRecords, "stage 2 -> stage 3");
  EXPECT_EQ(intoStage3.markedAfterRestore, 0u);
}

// Without the stage-3 optimizer registered the Checkpointer has no values for the parameters
// its units freed: a save fails on every rank naming the parameter and the fix (instead of
// reading freed memory); a restore of a stage-3 save into a module without a ShardedOptimizer
// names the shards and how to get a full state_dict.
TEST(ShardedCheckpointStage3Refusals, FreedParametersNeedTheirShardedOptimizerRegistered) {
  TempDir tmp;
  Leg saved;
  saved.dir = tmp.file("ckpt");
  saved.to = 1;
  saved.saves = {0};
  runLeg(saved);
  auto threads = ThreadWorld::create(2);
  auto store = std::make_shared<store::HashStore>();
  threads->run([&](int rank) {
    auto group = threadGroup(*threads, rank);
    Z3Net net = buildSeeded(3, [] { return Z3Net(true); });
    DistributedDataParallel<Z3Net> ddp(net, group);
    ZeroOptions zo;
    zo.stage = 3;
    ShardedOptimizer adam(ddp, factoryFor("adamw"), zo);
    CheckpointOptions options = optionsFor(tmp.file("refused"));
    options.nodeId = rank;
    options.localRank = 0;
    options.store = store;
    Checkpointer checkpointer(group, options);
    checkpointer.addModule("model", net);
    try {
      checkpointer.save(1);
      ADD_FAILURE() << "a module whose units are freed was saved without their optimizer";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("parameter \"body.0.weight\" of module \"model\" holds "
                                           "no memory"),
                std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("HINT: addOptimizer() the stage-3 ShardedOptimizer"),
                std::string::npos)
          << e.what();
    }
  });
  threads->run([&](int rank) {
    auto group = threadGroup(*threads, rank);
    Z3Net plain = buildSeeded(3, [] { return Z3Net(true); });  // unbound: plain layers
    CheckpointOptions options = optionsFor(saved.dir);
    options.nodeId = rank;
    options.localRank = 0;
    options.store = store;
    Checkpointer checkpointer(group, options);
    checkpointer.addModule("model", plain);
    try {
      checkpointer.restore();
      ADD_FAILURE() << "a stage-3 save was restored without a ShardedOptimizer";
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find("was saved as the shards of the ranks that held it"),
                std::string::npos)
          << e.what();
    }
  });
}

}  // namespace
}  // namespace dtrain::testing::checkpoint_zero3_test
