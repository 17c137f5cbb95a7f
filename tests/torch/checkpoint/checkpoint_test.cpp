// Checkpointer with ranks as threads on one node: what a checkpoint holds comes back bitwise, into
// the same tensors; keep-last and LATEST; asynchronous snapshots; a step saved twice written once;
// a prefetching loader resumed exactly; world-size checks; failed saves reported on every rank;
// preemption at an agreed step; exports PyTorch reads. Several simulated nodes are in
// checkpoint_nodes_test.cpp; real processes under `launch` (kills, restarts, SIGTERM) in
// tests/torch/checkpoint/checkpoint_processes_test.cpp.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <set>
#include <thread>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../../../runtime/torch/checkpoint/state.h"
#include "../ddp/ddp_models.h"
#include "../ddp/ddp_support.h"
#include "checkpoint/file_io.h"
#include "checkpoint_support.h"
#include "dtrain/torch/checkpoint.h"
#include "dtrain/torch/distributed_sampler.h"
#include "dtrain/torch/grad_scaler.h"
#include "test_support.h"

namespace dtrain::testing::checkpoint_test {
namespace {

// A small training setup with everything a checkpoint holds.
struct Trainer {
  BnCnn net;
  torch::optim::SGD sgd{net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9)};
  torch::optim::StepLR scheduler{sgd, 2, 0.5};
  GradScaler scaler;
  DistributedSampler sampler{40, 1, 0};

  void step(int i) {
    sgd.zero_grad();
    torch::manual_seed(500 + i);
    auto x = torch::randn({4, 3, 8, 8}) * (1 + torch::rand({}));
    auto loss = torch::nn::functional::cross_entropy(net->forward(x), torch::randint(0, 5, {4}));
    scaler.scale(loss).backward();
    scaler.step(sgd);
    scaler.update();
    scheduler.step();
    sampler.next(4);
  }
  void add(Checkpointer& c) {
    c.addModule("model", net);
    c.addOptimizer("sgd", sgd);
    c.addScheduler("lr", scheduler);
    c.addScaler("scaler", scaler);
    c.addSampler("data", sampler);
  }
};

TEST(Checkpointer, RestoresEverythingBitwiseIntoTheSameTensors) {
  TempDir dir;
  auto group = soloGroup();
  Trainer a;
  Checkpointer ca(group, optionsFor(dir.path()));
  a.add(ca);
  ca.setMetadata("note", std::string("hello"));
  ca.setMetadata("best_loss", 0.25);
  ca.setMetadata("samples", int64_t{1234});
  ca.setMetadata("mask", torch::arange(6, torch::kInt).reshape({2, 3}));
  EXPECT_FALSE(ca.restore().has_value());  // nothing saved yet
  for (int i = 0; i < 5; ++i) a.step(i);
  a.sampler.setEpoch(2);
  a.sampler.next(4);
  ca.save(5, 2);
  auto model = stateOf(*a.net);
  auto momentum = a.sgd.state().size();
  double lr = a.sgd.param_groups()[0].options().get_lr();
  auto scaler = a.scaler.state();
  auto sampler = a.sampler.state();
  auto rngAfterSave = torch::rand({3});

  // Train on: everything moves. Restore brings back step 5, into the very same tensors.
  std::vector<void*> pointers;
  for (const auto& p : a.net->parameters()) pointers.push_back(p.data_ptr());
  for (int i = 5; i < 8; ++i) a.step(i);
  ca.setMetadata("note", std::string("changed"));
  auto restored = ca.restore();
  ASSERT_TRUE(restored.has_value());
  EXPECT_EQ(restored->step, 5);
  EXPECT_EQ(restored->epoch, 2);
  EXPECT_EQ(restored->savedWorldSize, 1);
  expectBitwise(*a.net, model, "model");
  auto params = a.net->parameters();
  for (size_t i = 0; i < params.size(); ++i) EXPECT_EQ(params[i].data_ptr(), pointers[i]);
  EXPECT_EQ(a.sgd.state().size(), momentum);
  EXPECT_EQ(a.sgd.param_groups()[0].options().get_lr(), lr);
  EXPECT_EQ(a.scaler.state(), scaler);
  EXPECT_EQ(a.sampler.state(), sampler);
  EXPECT_TRUE(torch::equal(torch::rand({3}), rngAfterSave));
  EXPECT_EQ(std::get<std::string>(ca.metadata().at("note")), "hello");
  EXPECT_EQ(std::get<double>(ca.metadata().at("best_loss")), 0.25);
  EXPECT_EQ(std::get<int64_t>(ca.metadata().at("samples")), 1234);
  EXPECT_TRUE(torch::equal(std::get<at::Tensor>(ca.metadata().at("mask")),
                           torch::arange(6, torch::kInt).reshape({2, 3})));

  // A fresh program (new objects) restoring the same checkpoint continues exactly as `a` does.
  Trainer b;
  Checkpointer cb(group, optionsFor(dir.path()));
  b.add(cb);
  ASSERT_EQ(cb.restore()->step, 5);
  for (int i = 5; i < 8; ++i) {
    a.step(i);
    b.step(i);
  }
  expectBitwise(*b.net, stateOf(*a.net), "continued");
  EXPECT_EQ(b.scaler.state(), a.scaler.state());
  EXPECT_EQ(b.sampler.state(), a.sampler.state());
}

TEST(Checkpointer, EveryOptimizerContinuesBitwise) {
  auto group = soloGroup();
  auto run = [&](auto makeOptimizer, const char* name) {
    TempDir dir;
    torch::manual_seed(9);
    Mlp a, b;
    copyState(*a, *b);
    auto oa = makeOptimizer(a->parameters());
    auto ob = makeOptimizer(b->parameters());
    auto train = [](Mlp& net, torch::optim::Optimizer& opt, int i) {
      opt.zero_grad();
      torch::manual_seed(i);
      torch::mse_loss(net->forward(torch::randn({4, 8})), torch::randn({4, 4})).backward();
      opt.step();
    };
    for (int i = 0; i < 3; ++i) train(a, oa, i);
    {
      Checkpointer c(group, optionsFor(dir.path()));
      c.addModule("m", a);
      c.addOptimizer("o", oa);
      c.save(3);
    }
    Checkpointer c(group, optionsFor(dir.path()));
    c.addModule("m", b);
    c.addOptimizer("o", ob);
    ASSERT_TRUE(c.restore().has_value()) << name;
    for (int i = 3; i < 6; ++i) {
      train(a, oa, i);
      train(b, ob, i);
    }
    expectBitwise(*b, stateOf(*a), name);
  };
  using namespace torch::optim;
  run(
      [](std::vector<torch::Tensor> p) {
        return SGD(p, SGDOptions(0.1).momentum(0.9).nesterov(true));
      },
      "SGD");
  run([](std::vector<torch::Tensor> p) { return Adam(p, AdamOptions(0.01).amsgrad(true)); },
      "Adam");
  run([](std::vector<torch::Tensor> p) { return AdamW(p, AdamWOptions(0.01)); }, "AdamW");
  run([](std::vector<torch::Tensor> p) { return Adagrad(p, AdagradOptions(0.1)); }, "Adagrad");
  run(
      [](std::vector<torch::Tensor> p) {
        return RMSprop(p, RMSpropOptions(0.01).momentum(0.5).centered(true));
      },
      "RMSprop");
}

TEST(Checkpointer, KeepsTheLastKAndRefusesFewerThanTwo) {
  TempDir dir;
  auto group = soloGroup();
  Mlp net;
  Checkpointer c(group, optionsFor(dir.path()));
  c.addModule("m", net);
  for (int s = 1; s <= 5; ++s) c.save(s * 10);
  EXPECT_EQ(c.committedSteps(), (std::vector<int64_t>{50, 40, 30}));
  EXPECT_EQ(c.nodeDirectory(), dir.path() + "/node0");
  EXPECT_EQ(readFile(c.nodeDirectory() + "/LATEST"), "step-00000050\n");
  CheckpointOptions one = optionsFor(dir.path());
  one.keepLast = 1;
  EXPECT_THROW(Checkpointer(group, one), InvalidArgument);
}

TEST(Checkpointer, AsyncSaveKeepsTheStateOfTheMomentItWasCalled) {
  TempDir dir;
  auto group = soloGroup();
  Mlp net;
  Checkpointer c(group, optionsFor(dir.path()));
  c.addModule("m", net);
  auto atSave = stateOf(*net);
  c.saveAsync(1);
  {
    torch::NoGradGuard g;
    for (auto& p : net->parameters()) p.add_(1.0);  // training goes on meanwhile
  }
  c.saveAsync(2);  // waits for the first
  c.wait();
  EXPECT_EQ(c.committedSteps(), (std::vector<int64_t>{2, 1}));
  Mlp fresh;
  auto reader = checkpoint::CheckpointReader::open(c.nodeDirectory() + "/step-00000001");
  reader.verify();
  Checkpointer again(group, optionsFor(dir.path()));
  again.addModule("m", fresh);
  ::unlink((c.nodeDirectory() + "/step-00000002").c_str());
  ASSERT_EQ(again.restore()->step, 1);
  expectBitwise(*fresh, atSave, "snapshot");
}

// saveAsync(S), then SIGTERM within that step: preempted(S) saves S again. A step that every node
// committed is not written again, so the grace period holds one write, not two.
TEST(Checkpointer, AStepSavedAsynchronouslyAndThenPreemptedIsWrittenOnce) {
  TempDir dir;
  auto world = ThreadWorld::create(2);
  std::vector<std::vector<CheckpointWrite>> writes(2);
  world->run([&](int rank) {
    Mlp net;
    Checkpointer c(threadGroup(*world, rank), optionsFor(dir.path()));
    c.addModule("m", net);
    c.saveAsync(4);
    if (rank == 1) requestStop();  // SIGTERM during step 4
    EXPECT_TRUE(c.preempted(4));
    writes[rank] = c.finishedWrites();
    EXPECT_EQ(c.committedSteps(), (std::vector<int64_t>{4}));
  });
  clearStopRequest();
  ASSERT_EQ(writes[0].size(), 1u) << "step 4 was written more than once";
  EXPECT_EQ(writes[0][0].step, 4);
  EXPECT_TRUE(writes[1].empty());
  // The same after a restore: saving the restored step again writes nothing.
  auto group = soloGroup();
  TempDir solo;
  Mlp net;
  {
    Checkpointer c(group, optionsFor(solo.path()));
    c.addModule("m", net);
    c.save(7);
  }
  Checkpointer c(group, optionsFor(solo.path()));
  c.addModule("m", net);
  ASSERT_EQ(c.restore()->step, 7);
  c.save(7);
  EXPECT_TRUE(c.finishedWrites().empty());
  c.save(8);
  EXPECT_EQ(c.finishedWrites().size(), 1u);
}

// A dataset whose samples are their own indices.
struct IndexDataset : torch::data::datasets::Dataset<IndexDataset> {
  torch::data::Example<> get(size_t i) override {
    return {torch::tensor(static_cast<int64_t>(i)), torch::tensor(int64_t{0})};
  }
  torch::optional<size_t> size() const override { return 64; }
};

// What a run sees after 5 batches of libtorch's loader with 2 workers, which asks its sampler for
// 2 x workers batches ahead: `continuation`, the next 10 batches of the run itself; `resumed`, the
// first 3 of a fresh run restored from a checkpoint taken after the 5. `counted`: the program
// tells the Checkpointer how many samples training consumed.
struct PrefetchRun {
  std::vector<int64_t> continuation, resumed;
  uint64_t handedOutCursor = 0, consumedCursor = 0;
};

PrefetchRun runWithPrefetchingLoader(const std::string& dir, bool counted) {
  auto group = soloGroup();
  SamplerOptions so;
  so.seed = 3;
  auto loaderOver = [](DistributedSampler& sampler) {
    return torch::data::make_data_loader(IndexDataset().map(torch::data::transforms::Stack<>()),
                                         sampler,
                                         torch::data::DataLoaderOptions().batch_size(4).workers(2));
  };
  auto take = [](auto& it, int batches, size_t& consumed) {
    std::vector<int64_t> out;
    for (int b = 0; b < batches; ++b, ++it) {
      for (int64_t i = 0; i < it->data.size(0); ++i)
        out.push_back(it->data[i].template item<int64_t>());
      consumed += static_cast<size_t>(it->data.size(0));
    }
    return out;
  };
  PrefetchRun run;
  {
    DistributedSampler sampler(64, 1, 0, so);
    size_t consumed = 0;
    Checkpointer c(group, optionsFor(dir));
    c.addSampler("data", sampler,
                 counted ? std::function<size_t()>([&] { return consumed; }) : nullptr);
    auto loader = loaderOver(sampler);
    auto it = loader->begin();
    take(it, 5, consumed);
    run.handedOutCursor = sampler.state().cursor;
    run.consumedCursor = sampler.state(consumed).cursor;
    c.save(5);
    run.continuation = take(it, 10, consumed);
  }
  DistributedSampler sampler(64, 1, 0, so);
  size_t consumed = 0;
  Checkpointer c(group, optionsFor(dir));
  c.addSampler("data", sampler,
               counted ? std::function<size_t()>([&] { return consumed; }) : nullptr);
  EXPECT_EQ(c.restore()->step, 5);
  auto loader = loaderOver(sampler);
  auto it = loader->begin();
  run.resumed = take(it, 3, consumed);
  return run;
}

TEST(Checkpointer, APrefetchingLoaderResumesExactlyWhenTheConsumedCountIsGiven) {
  TempDir dir;
  PrefetchRun counted = runWithPrefetchingLoader(dir.file("counted"), true);
  EXPECT_EQ(counted.consumedCursor, 20u);
  EXPECT_GT(counted.handedOutCursor, counted.consumedCursor) << "the loader did not prefetch";
  EXPECT_EQ(counted.resumed,
            std::vector<int64_t>(counted.continuation.begin(), counted.continuation.begin() + 12));
  // Without the count, the position saved is what the loader had prefetched: the resumed run
  // starts that many samples later, and skips them.
  PrefetchRun uncounted = runWithPrefetchingLoader(dir.file("uncounted"), false);
  const auto skipped = static_cast<std::ptrdiff_t>(uncounted.handedOutCursor -
                                                   uncounted.consumedCursor);
  ASSERT_GT(skipped, 0);
  ASSERT_LE(skipped + 12, static_cast<std::ptrdiff_t>(uncounted.continuation.size()));
  EXPECT_EQ(uncounted.resumed, std::vector<int64_t>(uncounted.continuation.begin() + skipped,
                                                    uncounted.continuation.begin() + skipped + 12));
}

// The refusal every rank reports names the others, not the rank that prints it.
TEST(Checkpointer, AFailureOnSeveralRanksNamesTheOthersOnEach) {
  TempDir dir;
  auto two = ThreadWorld::create(2);
  two->run([&](int rank) {
    Mlp net;
    Checkpointer c(threadGroup(*two, rank), optionsFor(dir.path()));
    c.addModule("m", net);
    c.save(4);
  });
  auto three = ThreadWorld::create(3);
  std::vector<std::string> errors(3);
  three->run([&](int rank) {
    Mlp net;
    Checkpointer c(threadGroup(*three, rank), optionsFor(dir.path()));
    c.addModule("m", net);
    try {
      c.restore();
    } catch (const CheckpointError& e) {
      errors[rank] = e.what();
    }
  });
  EXPECT_NE(errors[0].find("world size 2, this job has world size 3"), std::string::npos)
      << errors[0];
  EXPECT_NE(errors[0].find("(it failed on rank 1 (node 0) and rank 2 (node 0) too)"),
            std::string::npos)
      << errors[0];
  EXPECT_NE(errors[1].find("(it failed on rank 0 (node 0) and rank 2 (node 0) too)"),
            std::string::npos)
      << errors[1];
  for (int r = 0; r < 3; ++r) {
    const std::string self = "rank " + std::to_string(r) + " (node";
    EXPECT_EQ(errors[r].find(self), std::string::npos) << "rank " << r << ": " << errors[r];
  }
}

TEST(Checkpointer, AnotherWorldSizeIsRefusedNamingBothUnlessAllowed) {
  TempDir dir;
  auto world = ThreadWorld::create(2);
  world->run([&](int rank) {
    Mlp net;
    Checkpointer c(threadGroup(*world, rank), optionsFor(dir.path()));
    c.addModule("m", net);
    c.save(4);
  });
  auto group = soloGroup();
  Mlp net;
  Checkpointer c(group, optionsFor(dir.path()));
  c.addModule("m", net);
  try {
    c.restore();
    FAIL() << "restored a world-size-2 checkpoint at world size 1";
  } catch (const CheckpointError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("world size 2"), std::string::npos) << what;
    EXPECT_NE(what.find("world size 1"), std::string::npos) << what;
    EXPECT_NE(what.find("allowWorldSizeChange"), std::string::npos) << what;
  }
  CheckpointOptions allow = optionsFor(dir.path());
  allow.allowWorldSizeChange = true;
  Checkpointer ok(group, allow);
  ok.addModule("m", net);
  auto r = ok.restore();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->savedWorldSize, 2);
}

TEST(Checkpointer, RefusesACheckpointThatLacksWhatIsRegisteredBeforeTouchingAnything) {
  TempDir dir;
  auto group = soloGroup();
  Mlp net;
  {
    Checkpointer c(group, optionsFor(dir.path()));
    c.addModule("m", net);
    c.save(1);
  }
  Mlp other(8, 17, 4);  // another shape
  auto before = stateOf(*other);
  torch::optim::Adam adam(other->parameters());
  Checkpointer c(group, optionsFor(dir.path()));
  c.addModule("m", other);
  try {
    c.restore();
    FAIL();
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("fc1.weight"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[16, 8]"), std::string::npos) << e.what();
  }
  expectBitwise(*other, before, "untouched");
  Checkpointer d(group, optionsFor(dir.path()));
  d.addModule("m", net);
  d.addOptimizer("adam", adam);
  try {
    d.restore();
    FAIL();
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer/adam/type"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("HINT"), std::string::npos) << e.what();
  }
}

// The newest file's data is damaged (its header and manifest are fine): the damage is found while
// reading it into the model, and the older checkpoint replaces everything it had written.
TEST(Checkpointer, DamageFoundWhileReadingFallsBackToTheOlderCheckpoint) {
  TempDir dir;
  auto group = soloGroup();
  Trainer a;
  Checkpointer c(group, optionsFor(dir.path()));
  a.add(c);
  a.step(0);
  c.save(1);
  auto at1 = stateOf(*a.net);
  auto scalerAt1 = a.scaler.state();
  a.step(1);
  c.save(2);
  std::string newest = c.nodeDirectory() + "/step-00000002";
  auto reader = checkpoint::CheckpointReader::open(newest);
  const auto* last = reader.find("module/model/fc.bias").front();  // late in the file
  flipByte(newest, last->offset);
  a.step(2);
  auto r = c.restore();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->step, 1);
  expectBitwise(*a.net, at1, "fell back");
  EXPECT_EQ(a.scaler.state(), scalerAt1);
}

TEST(Checkpointer, RefusesToStartOverWhenNoCheckpointVerifies) {
  TempDir dir;
  auto group = soloGroup();
  Mlp net;
  Checkpointer c(group, optionsFor(dir.path()));
  c.addModule("m", net);
  c.save(3);
  ASSERT_EQ(::truncate((c.nodeDirectory() + "/step-00000003").c_str(), 100), 0);
  try {
    c.restore();
    FAIL() << "started over although a checkpoint exists";
  } catch (const CheckpointError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("none is intact"), std::string::npos) << what;
    EXPECT_NE(what.find("truncated"), std::string::npos) << what;
  }
}

TEST(Checkpointer, AFailedSaveFailsOnEveryRankAndKeepsTheEarlierOne) {
  TempDir dir;
  auto world = ThreadWorld::create(2);
  // Writes of the first save: data, manifest, header, LATEST; the 5th is the second save's data.
  ::setenv("DTRAIN_IO_FAULT", "write:ENOSPC@5,rank=0", 1);
  std::vector<std::string> errors(2);
  world->run([&](int rank) {
    Mlp net;
    Checkpointer c(threadGroup(*world, rank), optionsFor(dir.path()));
    c.addModule("m", net);
    c.save(1);
    try {
      c.save(2);
    } catch (const CheckpointError& e) {
      errors[rank] = e.what();
    }
  });
  ::unsetenv("DTRAIN_IO_FAULT");
  EXPECT_NE(errors[0].find("ENOSPC"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("step 2"), std::string::npos) << errors[0];
  EXPECT_NE(errors[1].find("failed on rank 0 (node 0)"), std::string::npos) << errors[1];
  auto listing = checkpoint::listDirectory(dir.path() + "/node0");
  EXPECT_EQ(listing.steps, (std::vector<int64_t>{1}));
  EXPECT_EQ(listing.latest.value_or(-1), 1);
  EXPECT_TRUE(listing.temporaries.empty());
}

// A save stuck in the kernel (opening a FIFO nobody reads stands in for a hung disk) fails within
// the timeout saying where it is; a save while it is stuck is refused; once it ends, saving works.
TEST(CheckpointerTimeouts, AStuckSaveFailsWithinItsTimeoutAndLaterSavesRecover) {
  TempDir dir;
  auto group = soloGroup();
  Mlp net;
  CheckpointOptions o = optionsFor(dir.path());
  o.timeout = std::chrono::seconds(3);  // long enough for a healthy save on a loaded machine
  Checkpointer c(group, o);
  c.addModule("m", net);
  std::string fifo = c.nodeDirectory() + "/step-00000001.tmp";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto start = std::chrono::steady_clock::now();
  try {
    c.save(1);
    FAIL() << "a stuck save returned";
  } catch (const CheckpointError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("did not finish within 3000 ms"), std::string::npos) << what;
    EXPECT_NE(what.find("step 1"), std::string::npos) << what;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  try {
    c.save(2);
    FAIL() << "started a save beside a stuck one";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("still running"), std::string::npos) << e.what();
  }
  int reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);  // the disk comes back
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ::close(reader);
  ::unlink(fifo.c_str());
  c.save(3);
  EXPECT_EQ(c.committedSteps(), (std::vector<int64_t>{3}));
}

// Note [Abandoned saves]: a synchronous save whose first write stalls past the timeout (a slow
// disk, `write:slow:6000@1`) is reported failed, and training changes the tensors it writes from.
// Once the stall is over, the save ends without committing: `step-2` never appears, its temporary
// is gone and LATEST still names step 1. The next save works.
TEST(CheckpointerTimeouts, ASaveReportedAsTimedOutNeverCommitsLater) {
  TempDir dir;
  auto group = soloGroup();
  Mlp net;
  CheckpointOptions o = optionsFor(dir.path());
  o.timeout = std::chrono::seconds(3);  // long enough for a healthy save on a loaded machine
  {
    Checkpointer first(group, o);
    first.addModule("m", net);
    first.save(1);
  }
  IoFaultScope slowDisk("write:slow:6000@1");  // the first write call of the next Checkpointer
  Checkpointer c(group, o);
  c.addModule("m", net);
  const auto start = std::chrono::steady_clock::now();
  try {
    c.save(2);
    FAIL() << "a save stalled past its timeout returned";
  } catch (const CheckpointError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("did not finish within 3000 ms"), std::string::npos) << what;
    EXPECT_NE(what.find("abandoned: it will not be committed"), std::string::npos) << what;
  }
  {
    torch::NoGradGuard g;
    net->fc1->weight.add_(1);  // training goes on
  }
  // Past the stall, until the save's temporary is gone (removed, or renamed by a late commit).
  const std::string node = c.nodeDirectory();
  while (std::chrono::steady_clock::now() - start < std::chrono::seconds(30) &&
         (std::chrono::steady_clock::now() - start < std::chrono::milliseconds(6200) ||
          !checkpoint::listDirectory(node).temporaries.empty())) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(c.committedSteps(), (std::vector<int64_t>{1}));  // once the save thread has ended
  auto listing = checkpoint::listDirectory(node);
  EXPECT_EQ(listing.latest.value_or(-1), 1);
  EXPECT_TRUE(listing.temporaries.empty());
  c.save(3);
  EXPECT_EQ(c.committedSteps(), (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(checkpoint::listDirectory(node).latest.value_or(-1), 3);
}

// Note [Background saves yield]: asynchronous saves write from a thread in the idle scheduling
// class, synchronous ones at the normal priority; once a save finds the previous asynchronous one
// still running, the Checkpointer's later asynchronous saves run at nice +10.
TEST(Checkpointer, AsynchronousSavesRunInTheIdleClassUntilASaveWaitsForOne) {
  auto classes = [](Checkpointer& c) {
    std::vector<bool> out;
    for (const auto& w : c.finishedWrites()) out.push_back(w.idleClass);
    return out;
  };
  auto group = soloGroup();
  Mlp net;
  {
    TempDir dir;
    Checkpointer c(group, optionsFor(dir.path()));
    c.addModule("m", net);
    c.saveAsync(1);
    c.wait();  // waiting is not a save: the class stays
    c.saveAsync(2);
    c.wait();
    c.save(3);
    c.saveAsync(4);
    c.wait();
    EXPECT_EQ(classes(c), (std::vector<bool>{true, true, false, true}));
  }
  TempDir dir;
  // The first write call of step 1 takes 0.5 s: the save of step 2 finds it running.
  IoFaultScope slowFirstWrite("write:slow:500@1");
  Checkpointer c(group, optionsFor(dir.path()));
  c.addModule("m", net);
  c.saveAsync(1);
  c.saveAsync(2);
  c.wait();
  c.saveAsync(3);
  c.wait();
  EXPECT_EQ(classes(c), (std::vector<bool>{true, false, false}));
  EXPECT_EQ(c.committedSteps(), (std::vector<int64_t>{3, 2, 1}));
}

TEST(Checkpointer, PreemptionSavesTheSameStepOnEveryRank) {
  TempDir dir;
  auto world = ThreadWorld::create(2);
  std::vector<int> stoppedAt(2, -1);
  world->run([&](int rank) {
    Mlp net;
    Checkpointer c(threadGroup(*world, rank), optionsFor(dir.path()));
    c.addModule("m", net);
    for (int step = 0; step < 10; ++step) {
      if (rank == 1 && step == 4) requestStop();  // SIGTERM reached one rank only, mid-step
      if (c.preempted(step)) {
        stoppedAt[rank] = step;
        break;
      }
    }
  });
  clearStopRequest();
  // Rank 1 set the flag before its check of step 4; rank 0 may have checked step 4 already, but
  // the MAX allreduce makes both see it at the same step.
  EXPECT_EQ(stoppedAt[0], stoppedAt[1]);
  EXPECT_EQ(stoppedAt[0], 4);
  EXPECT_EQ(checkpoint::listDirectory(dir.path() + "/node0").steps, (std::vector<int64_t>{4}));
}

std::atomic<int> gProgramHandlerCalls{0};
void programHandler(int) { gProgramHandlerCalls++; }

TEST(Checkpointer, SigtermSetsTheFlagAndStillCallsTheProgramsOwnHandler) {
  TempDir dir;
  auto group = soloGroup();
  struct sigaction mine {
  }, before{};
  mine.sa_handler = programHandler;
  sigemptyset(&mine.sa_mask);
  ::sigaction(SIGTERM, &mine, &before);
  {
    Checkpointer c(group, CheckpointOptions(dir.path()));  // handles SIGTERM
    ::raise(SIGTERM);
    EXPECT_TRUE(stopRequested());
    EXPECT_EQ(gProgramHandlerCalls.load(), 1);
  }
  clearStopRequest();
  ::raise(SIGTERM);  // the program's handler alone again
  EXPECT_EQ(gProgramHandlerCalls.load(), 2);
  EXPECT_FALSE(stopRequested());
  ::sigaction(SIGTERM, &before, nullptr);
}

TEST(Checkpointer, SigtermSetsTheFlagOnlyWhileACheckpointerHandlesIt) {
  TempDir dir;
  auto group = soloGroup();
  struct sigaction before {};
  ::sigaction(SIGTERM, nullptr, &before);
  {
    Checkpointer c(group, {dir.path()});  // SIGTERM handled by default
    ::raise(SIGTERM);                     // would kill the test without the handler
    EXPECT_TRUE(stopRequested());
    Mlp net;
    c.addModule("m", net);
    EXPECT_TRUE(c.preempted(9));
    EXPECT_EQ(c.committedSteps(), (std::vector<int64_t>{9}));
  }
  clearStopRequest();
  struct sigaction now {};
  ::sigaction(SIGTERM, nullptr, &now);
  EXPECT_EQ(now.sa_handler, before.sa_handler);  // the program's own handler is back
}

TEST(CheckpointExport, WritesWhatPythonAndLibtorchLoad) {
  TempDir dir;
  auto group = soloGroup();
  torch::manual_seed(4);
  BnCnn net;
  net->forward(torch::randn({2, 3, 8, 8}));  // running statistics move
  Checkpointer c(group, optionsFor(dir.path()));
  c.addModule("model", net);
  c.save(1);
  std::string file = c.nodeDirectory() + "/step-00000001";
  // libtorch: torch::load into a fresh module.
  exportStateDict(file, dir.file("model.libtorch.pt"), "model", "libtorch");
  BnCnn loaded;
  torch::load(loaded, dir.file("model.libtorch.pt"));
  expectBitwise(*loaded, stateOf(*net), "torch::load");
  // pickle: torch::pickle_load here; Python's torch.load(weights_only=True) in the integration
  // test. No typed-container tag (torch.jit._pickle.restore_type_tag), which weights_only refuses:
  // only what torch.save(state_dict) writes (Note [Exported pickles]).
  exportStateDict(file, dir.file("model.pt"));
  std::string bytes = readFile(dir.file("model.pt"));
  EXPECT_EQ(bytes.find("restore_type_tag"), std::string::npos);
  EXPECT_EQ(bytes.find("torch.jit"), std::string::npos);
  EXPECT_NE(bytes.find("_rebuild_tensor_v2"), std::string::npos);
  auto dict = torch::pickle_load(std::vector<char>(bytes.begin(), bytes.end())).toGenericDict();
  for (const auto& p : net->named_parameters()) {
    EXPECT_TRUE(torch::equal(dict.at(p.key()).toTensor(), p.value())) << p.key();
  }
  for (const auto& b : net->named_buffers()) {
    EXPECT_TRUE(torch::equal(dict.at(b.key()).toTensor(), b.value())) << b.key();
  }
  EXPECT_THROW(exportStateDict(file, dir.file("x.pt"), "nope"), InvalidArgument);
}

// Restore's reading threads copy into CUDA tensors: each first makes the group's device current
// (forEachSpread's hook), or a fresh thread would work on device 0 and create a context there in
// every rank. The hook runs on every helper thread before its first job, never on the caller's.
TEST(CheckpointState, HelperThreadsEnterTheDeviceBeforeTheirJobs) {
  const int threadsBefore = at::get_num_threads();
  at::set_num_threads(4);
  std::mutex mutex;
  std::set<std::thread::id> entered, ran;
  const auto caller = std::this_thread::get_id();
  checkpoint::forEachSpread(
      8, [](size_t) { return uint64_t{1} << 20; },
      [&](size_t) {
        std::lock_guard<std::mutex> lock(mutex);
        const auto id = std::this_thread::get_id();
        ran.insert(id);
        if (id != caller) {
          EXPECT_TRUE(entered.count(id)) << "a job ran before its thread's hook";
        }
      },
      [&] {
        std::lock_guard<std::mutex> lock(mutex);
        entered.insert(std::this_thread::get_id());
      });
  at::set_num_threads(threadsBefore);
  EXPECT_GE(ran.size(), 2u) << "the work was not spread";
  EXPECT_EQ(entered.size(), ran.size() - 1);
  EXPECT_FALSE(entered.count(caller));
  EXPECT_FALSE(static_cast<bool>(checkpoint::useDeviceInThread(c10::Device(c10::kCPU))));
}

}  // namespace
}  // namespace dtrain::testing::checkpoint_test
