// Checkpointer with ranks as threads: what a checkpoint holds comes back bitwise, into the same
// tensors; keep-last and LATEST; asynchronous snapshots; world-size checks; several simulated
// nodes, one of which lost its directory or holds a damaged newest file; failed saves reported
// on every rank; preemption at an agreed step; exports PyTorch reads. Real processes under
// `launch` (kills, restarts, SIGTERM) are in tests/integration/checkpoint_processes_test.cpp.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include <cstdlib>
#include <fstream>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "checkpoint/file_io.h"
#include "ddp_models.h"
#include "ddp_test_util.h"
#include "dtrain/torch/checkpoint.h"
#include "dtrain/torch/distributed_sampler.h"
#include "dtrain/torch/grad_scaler.h"
#include "test_support.h"

namespace dtrain::testing {
namespace {

CheckpointOptions optionsFor(const std::string& dir) {
  CheckpointOptions o(dir);
  o.handlePreemption = false;
  return o;
}

std::string verifyErrorOf(const std::string& path) {
  try {
    checkpoint::CheckpointReader::open(path).verify();
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

// The same values on every rank, as DDP would make them: ranks run as threads share one random
// generator, so seeding it in each thread races.
void setSameOnEveryRank(torch::nn::Module& m) {
  torch::NoGradGuard g;
  float base = 0;
  for (auto& p : m.parameters()) {
    p.copy_(torch::arange(p.numel(), torch::kFloat).reshape(p.sizes()) * 0.001 + base);
    base += 1;
  }
}

// Inverts the byte at `offset` (always a change, whatever the byte was).
void flipByte(const std::string& path, uint64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.read(&c, 1);
  f.seekp(static_cast<std::streamoff>(offset));
  f.put(static_cast<char>(~c));
}

std::shared_ptr<ProcessGroup> soloGroup() { return threadGroup(*ThreadWorld::create(1), 0); }

std::vector<torch::Tensor> stateOf(torch::nn::Module& m) {
  std::vector<torch::Tensor> out;
  for (const auto& p : m.parameters()) out.push_back(p.detach().clone());
  for (const auto& b : m.buffers()) out.push_back(b.detach().clone());
  return out;
}

void expectBitwise(torch::nn::Module& m, const std::vector<torch::Tensor>& want, const std::string& what) {
  auto have = stateOf(m);
  ASSERT_EQ(have.size(), want.size());
  for (size_t i = 0; i < have.size(); ++i) EXPECT_TRUE(torch::equal(have[i], want[i])) << what << " tensor " << i;
}

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
  run([](std::vector<torch::Tensor> p) { return SGD(p, SGDOptions(0.1).momentum(0.9).nesterov(true)); }, "SGD");
  run([](std::vector<torch::Tensor> p) { return Adam(p, AdamOptions(0.01).amsgrad(true)); }, "Adam");
  run([](std::vector<torch::Tensor> p) { return AdamW(p, AdamWOptions(0.01)); }, "AdamW");
  run([](std::vector<torch::Tensor> p) { return Adagrad(p, AdagradOptions(0.1)); }, "Adagrad");
  run([](std::vector<torch::Tensor> p) { return RMSprop(p, RMSpropOptions(0.01).momentum(0.5).centered(true)); }, "RMSprop");
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

// Four ranks on two simulated nodes, each node writing its own directory.
struct TwoNodes {
  std::shared_ptr<ThreadWorld> world = ThreadWorld::create(4);
  std::string dir;
  explicit TwoNodes(std::string d) : dir(std::move(d)) {}
  CheckpointOptions options(int rank) const {
    CheckpointOptions o = optionsFor(dir);
    o.nodeRank = rank / 2;
    o.localRank = rank % 2;
    return o;
  }
};

TEST(Checkpointer, ANodeThatLostItsDirectoryGetsACopyFromAnother) {
  TempDir tmp;
  TwoNodes job(tmp.path() + "/ckpt");
  std::vector<std::vector<torch::Tensor>> saved(4);
  job.world->run([&](int rank) {
    Mlp net;
    setSameOnEveryRank(*net);
    Checkpointer c(threadGroup(*job.world, rank), job.options(rank));
    c.addModule("m", net);
    c.save(5);
    saved[rank] = stateOf(*net);
  });
  for (int node : {0, 1}) {
    EXPECT_EQ(checkpoint::listDirectory(job.dir + "/node" + std::to_string(node)).steps,
              (std::vector<int64_t>{5}));
  }
  // Node 1 comes back as a fresh machine.
  ASSERT_EQ(std::system(("rm -rf " + job.dir + "/node1").c_str()), 0);
  std::vector<RestoredCheckpoint> results(4);
  job.world->run([&](int rank) {
    Mlp net;  // whatever it starts with, restore() overwrites
    Checkpointer c(threadGroup(*job.world, rank), job.options(rank));
    c.addModule("m", net);
    results[rank] = c.restore().value();
    expectBitwise(*net, saved[0], "rank " + std::to_string(rank));
  });
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_EQ(results[rank].step, 5);
    EXPECT_EQ(results[rank].copiedFromPeer, rank >= 2) << rank;
  }
  auto copied = checkpoint::listDirectory(job.dir + "/node1");
  EXPECT_EQ(copied.steps, (std::vector<int64_t>{5}));
  EXPECT_EQ(copied.latest.value_or(-1), 5);
  EXPECT_EQ(verifyErrorOf(job.dir + "/node1/step-00000005"), "");
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
  std::vector<torch::Tensor> at6;
  job.world->run([&](int rank) {
    Mlp net;
    setSameOnEveryRank(*net);
    Checkpointer c(threadGroup(*job.world, rank), job.options(rank));
    c.addModule("m", net);
    c.save(5);
    torch::NoGradGuard g;
    net->fc1->weight.add_(1);
    c.save(6);
    if (rank == 0) at6 = stateOf(*net);
  });
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
TEST(Checkpointer, AStuckSaveFailsWithinItsTimeoutAndLaterSavesRecover) {
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
  struct sigaction mine {}, before {};
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
    ::raise(SIGTERM);  // would kill the test without the handler
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
  // pickle: torch::pickle_load here; Python's torch.load in the integration test.
  exportStateDict(file, dir.file("model.pt"));
  std::string bytes = readFile(dir.file("model.pt"));
  auto dict = torch::pickle_load(std::vector<char>(bytes.begin(), bytes.end())).toGenericDict();
  for (const auto& p : net->named_parameters()) {
    EXPECT_TRUE(torch::equal(dict.at(p.key()).toTensor(), p.value())) << p.key();
  }
  for (const auto& b : net->named_buffers()) {
    EXPECT_TRUE(torch::equal(dict.at(b.key()).toTensor(), b.value())) << b.key();
  }
  EXPECT_THROW(exportStateDict(file, dir.file("x.pt"), "nope"), InvalidArgument);
}

}  // namespace
}  // namespace dtrain::testing
