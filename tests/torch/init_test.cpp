// dtrain::init() with ranks as threads: explicit placement and store, rank 0 hosting the store
// without a launcher, and the errors for a missing or wrong environment. Real processes (launch,
// srun/mpirun-style variables) are in tests/comm/comm_processes_test.cpp.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <map>
#include <optional>
#include <thread>

#include <torch/torch.h>

#include "dtrain/base/error.h"
#include "dtrain/comm/gloo_communicator.h"
#include "dtrain/torch/init.h"
#include "test_support.h"

namespace dtrain::init_test {
namespace {

// Sets (or unsets, with nullopt) environment variables for one test and restores them after.
class EnvGuard {
 public:
  explicit EnvGuard(std::map<std::string, std::optional<std::string>> vars) {
    for (auto& [k, v] : vars) {
      const char* old = std::getenv(k.c_str());
      saved_[k] = old ? std::optional<std::string>(old) : std::nullopt;
      if (v) setenv(k.c_str(), v->c_str(), 1);
      else unsetenv(k.c_str());
    }
  }
  ~EnvGuard() {
    for (auto& [k, v] : saved_) {
      if (v) setenv(k.c_str(), v->c_str(), 1);
      else unsetenv(k.c_str());
    }
  }

 private:
  std::map<std::string, std::optional<std::string>> saved_;
};

const std::map<std::string, std::optional<std::string>> kNoLauncher = {
    {"RANK", std::nullopt},
    {"WORLD_SIZE", std::nullopt},
    {"LOCAL_RANK", std::nullopt},
    {"SLURM_PROCID", std::nullopt},
    {"OMPI_COMM_WORLD_RANK", std::nullopt},
    {"DTRAIN_STORE_ADDR", std::nullopt},
    {"MASTER_ADDR", std::nullopt},
    {"DTRAIN_BACKEND", std::nullopt},
    {"DTRAIN_FAULT", std::nullopt},
    {"GROUP_RANK", std::nullopt},
    {"SLURM_NODEID", std::nullopt},
    {"DTRAIN_SHM", std::nullopt}};

std::vector<std::shared_ptr<ProcessGroup>> initRanks(int n,
                                                     const std::function<InitOptions(int)>& make) {
  std::vector<std::shared_ptr<ProcessGroup>> pgs(n);
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        pgs[r] = init(make(r));
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  return pgs;
}

TEST(Init, ExplicitRankWorldSizeAndStore) {
  if (!comm::glooAvailable()) GTEST_SKIP() << "built without Gloo";
  EnvGuard env(kNoLauncher);
  auto store = std::make_shared<store::HashStore>();
  auto pgs = initRanks(2, [&](int r) {
    InitOptions o;
    o.rank = r;
    o.worldSize = 2;
    o.store = store;
    o.timeout = std::chrono::milliseconds(5000);
    return o;
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(pgs[r]);
    EXPECT_EQ(pgs[r]->rank(), r);
    EXPECT_EQ(pgs[r]->size(), 2);
    EXPECT_EQ(pgs[r]->localRank(), r);
    EXPECT_STREQ(pgs[r]->backend(), "shm") << "two ranks on this host share memory";
    EXPECT_EQ(pgs[r]->device(), c10::Device(c10::kCPU));
    EXPECT_EQ(pgs[r]->store(), store);
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto t = torch::full({3}, 1.0f + r);
      pgs[r]->allreduce(t);
      EXPECT_TRUE(t.eq(3.0f).all().item<bool>());
      pgs[r]->barrier();
      pgs[r]->shutdown();
      pgs[r]->shutdown();
    });
  }
  for (auto& t : threads) t.join();
  auto t = torch::ones({1});
  EXPECT_THROW(pgs[0]->allreduce(t), Error) << "collectives after shutdown fail";
}

TEST(Init, RankZeroHostsTheStoreWithoutALauncher) {
  if (!comm::glooAvailable()) GTEST_SKIP() << "built without Gloo";
  const int port = testing::freeLoopbackPort();
  auto vars = kNoLauncher;
  vars["MASTER_ADDR"] = "127.0.0.1";
  vars["MASTER_PORT"] = std::to_string(port);
  vars["DTRAIN_STORE_TOKEN"] = std::nullopt;
  EnvGuard env(vars);
  auto pgs = initRanks(3, [&](int r) {
    InitOptions o;
    o.rank = r;
    o.worldSize = 3;
    o.connectTimeout = std::chrono::milliseconds(10000);
    return o;
  });
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      ASSERT_TRUE(pgs[r]);
      auto t = torch::tensor({static_cast<int64_t>(r)});
      pgs[r]->allreduce(t, ReduceOp::Max);
      EXPECT_EQ(t.item<int64_t>(), 2);
      EXPECT_TRUE(pgs[r]->store() != nullptr);
      pgs[r]->shutdown();  // everyone meets at a barrier before rank 0 stops the store
    });
  }
  for (auto& t : threads) t.join();
}

TEST(Init, OffLoopbackWithoutATokenIsRefusedByName) {
  auto vars = kNoLauncher;
  vars["MASTER_ADDR"] = "10.255.255.1";
  vars["DTRAIN_STORE_TOKEN"] = std::nullopt;
  EnvGuard env(vars);
  InitOptions o;
  o.rank = 1;
  o.worldSize = 2;
  try {
    init(o);
    ADD_FAILURE() << "init succeeded";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("DTRAIN_STORE_TOKEN is not set"), std::string::npos)
        << e.what();
  }
}

TEST(Init, MissingRankSaysLaunchSetsIt) {
  EnvGuard env(kNoLauncher);
  try {
    init();
    ADD_FAILURE() << "init succeeded without any environment";
  } catch (const InvalidArgument& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("RANK is not set"), std::string::npos) << what;
    EXPECT_NE(what.find("`launch`, which sets it"), std::string::npos) << what;
  }
}

TEST(Init, BackendOverrideIsCheckedByName) {
  if (!comm::glooAvailable()) GTEST_SKIP() << "built without Gloo";
  auto vars = kNoLauncher;
  vars["DTRAIN_BACKEND"] = "mpi";
  EnvGuard env(vars);
  InitOptions o;
  o.rank = 0;
  o.worldSize = 1;
  o.store = std::make_shared<store::HashStore>();
  try {
    init(o);
    ADD_FAILURE() << "accepted DTRAIN_BACKEND=mpi";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("DTRAIN_BACKEND=\"mpi\" is not a backend"),
              std::string::npos)
        << e.what();
  }
  setenv("DTRAIN_BACKEND", "nccl", 1);
  EXPECT_THROW(init(o), InvalidArgument) << "no CUDA device is usable here";
  setenv("DTRAIN_BACKEND", "gloo", 1);
  EXPECT_STREQ(init(o)->backend(), "gloo");
}

TEST(Init, SharedMemoryCanBeTurnedOffByOptionOrVariable) {
  if (!comm::glooAvailable()) GTEST_SKIP() << "built without Gloo";
  for (bool byVariable : {false, true}) {
    auto vars = kNoLauncher;
    if (byVariable) vars["DTRAIN_SHM"] = "0";
    EnvGuard env(vars);
    auto store = std::make_shared<store::HashStore>();
    auto pgs = initRanks(2, [&](int r) {
      InitOptions o;
      o.rank = r;
      o.worldSize = 2;
      o.store = store;
      o.sharedMemory = byVariable;  // one or the other turns it off
      return o;
    });
    for (auto& pg : pgs) EXPECT_STREQ(pg->backend(), "gloo");
  }
}

// Four ranks as two pretend nodes of two (InitOptions::node): shared memory inside each, Gloo
// across; then the 2x2 grid of subgroups a tensor- and pipeline-parallel job builds, with
// collectives on rows and columns at the same time.
TEST(Init, HierarchicalWorldAndItsRowAndColumnGroups) {
  if (!comm::glooAvailable()) GTEST_SKIP() << "built without Gloo";
  EnvGuard env(kNoLauncher);
  auto store = std::make_shared<store::HashStore>();
  auto pgs = initRanks(4, [&](int r) {
    InitOptions o;
    o.rank = r;
    o.worldSize = 4;
    o.store = store;
    o.node = "node" + std::to_string(r / 2);
    o.timeout = std::chrono::milliseconds(10000);
    return o;
  });
  std::vector<std::thread> threads;
  for (int r = 0; r < 4; ++r) {
    threads.emplace_back([&, r] {
      auto& pg = pgs[r];
      EXPECT_STREQ(pg->backend(), "shm+gloo");
      auto row = pg->split(r / 2);  // the ranks of one node
      // As with torch.distributed.new_group, every rank creates every group.
      auto even = pg->newGroup({0, 2});
      auto odd = pg->newGroup({1, 3});
      auto col = r % 2 == 0 ? even : odd;
      auto other = r % 2 == 0 ? odd : even;
      ASSERT_TRUE(row && col);
      EXPECT_EQ(other, nullptr) << "not a member";
      EXPECT_STREQ(row->backend(), "shm") << "a group inside one node is shared memory only";
      EXPECT_STREQ(col->backend(), "gloo") << "one rank per node: Gloo";
      EXPECT_EQ(row->device(), pg->device());
      for (int i = 0; i < 10; ++i) {
        auto a = torch::full({1000, 33}, static_cast<float>(r + i));
        auto b = torch::full({77}, static_cast<int64_t>(r * 100 + i));
        auto wa = row->allreduceAsync(a);
        auto wb = col->allreduceAsync(b, ReduceOp::Max);
        wa->wait();
        wb->wait();
        const float rowSum = static_cast<float>(r / 2 * 4 + 1 + 2 * i);
        EXPECT_TRUE(a.eq(rowSum).all().item<bool>()) << "rank " << r << " iteration " << i;
        EXPECT_EQ(b[76].item<int64_t>(), (r % 2 + 2) * 100 + i) << "rank " << r;
      }
      auto t = torch::full({5}, static_cast<float>(r));
      pg->allreduce(t);
      EXPECT_EQ(t[0].item<float>(), 6.0f) << "the world still works beside its groups";
      pg->shutdown();
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace
}  // namespace dtrain::init_test
