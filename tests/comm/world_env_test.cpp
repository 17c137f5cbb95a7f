// The pure parts of init: where rank, world size, local rank and the store come from; which
// backend; which NCCL variables are refused (docs/reliability.md P7).
#include <gtest/gtest.h>

#include <map>

#include "dtrain/base/error.h"
#include "dtrain/comm/nccl_communicator.h"
#include "dtrain/comm/world.h"

namespace dtrain::comm::world_env_test {
namespace {

using Env = std::map<std::string, std::string>;

EnvLookup lookup(const Env& env) {
  return [&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
}

std::string errorOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(WorldEnv, LaunchVariablesAndTheJobStore) {
  Env env{{"RANK", "3"},
          {"WORLD_SIZE", "8"},
          {"LOCAL_RANK", "1"},
          {"DTRAIN_STORE_ADDR", "10.0.0.1"},
          {"DTRAIN_STORE_PORT", "29400"},
          {"DTRAIN_RESTART_COUNT", "2"}};
  auto w = resolveWorldEnv({}, lookup(env));
  EXPECT_EQ(w.launcher, Launcher::Launch);
  EXPECT_EQ(w.rank, 3);
  EXPECT_EQ(w.worldSize, 8);
  EXPECT_EQ(w.localRank, 1);
  EXPECT_EQ(w.round, 2);
  EXPECT_TRUE(w.jobStore);
  EXPECT_FALSE(w.hostStore);
  EXPECT_EQ(w.storeHost, "10.0.0.1");
}

TEST(WorldEnv, CudaDeviceOfALocalRank) {
  EXPECT_EQ(chooseCudaDevice(0, 4, nullptr), 0);
  EXPECT_EQ(chooseCudaDevice(3, 4, "0,1,2,3"), 3);
  // Slurm's per-task GPU binding (--gpus-per-task=1): task with SLURM_LOCALID=3 sees one GPU, its
  // own, as device 0.
  EXPECT_EQ(chooseCudaDevice(3, 1, "3"), 0);
  std::string e = errorOf([] { chooseCudaDevice(2, 2, "4,5"); });
  EXPECT_NE(e.find("LOCAL_RANK=2 but only 2 CUDA devices are visible (CUDA_VISIBLE_DEVICES=4,5)"),
            std::string::npos)
      << e;
}

TEST(WorldEnv, SrunAndMpirunHostTheStoreOnRankZero) {
  Env slurm{{"SLURM_PROCID", "0"},
            {"SLURM_NTASKS", "4"},
            {"SLURM_LOCALID", "0"},
            {"MASTER_ADDR", "10.0.0.7"}};
  auto s = resolveWorldEnv({}, lookup(slurm));
  EXPECT_EQ(s.launcher, Launcher::Slurm);
  EXPECT_EQ(s.worldSize, 4);
  EXPECT_TRUE(s.hostStore);
  EXPECT_EQ(s.masterAddr, "10.0.0.7");
  EXPECT_EQ(s.masterPort, kDefaultMasterPort);

  Env mpi{{"OMPI_COMM_WORLD_RANK", "5"},
          {"OMPI_COMM_WORLD_SIZE", "6"},
          {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
          {"MASTER_ADDR", "127.0.0.1"},
          {"MASTER_PORT", "31000"}};
  auto m = resolveWorldEnv({}, lookup(mpi));
  EXPECT_EQ(m.launcher, Launcher::Mpi);
  EXPECT_EQ(m.rank, 5);
  EXPECT_EQ(m.localRank, 1);
  EXPECT_EQ(m.masterPort, 31000);
}

TEST(WorldEnv, EveryMissingOrBadVariableIsNamed) {
  struct Case {
    Env env;
    const char* expected;
  };
  const std::vector<Case> cases = {
      {{}, "RANK is not set"},
      {{{"RANK", "0"}},
       "WORLD_SIZE is not set. HINT: start the program with `launch`, which sets it"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "2"}}, "LOCAL_RANK is not set"},
      {{{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}},
       "RANK=\"2\" is not an integer in [0, 1]"},
      {{{"RANK", "x"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}}, "RANK=\"x\""},
      {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}},
       "neither DTRAIN_STORE_ADDR nor MASTER_ADDR is set"},
      {{{"SLURM_PROCID", "0"}}, "SLURM_NTASKS is not set. HINT: srun sets it"},
      {{{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "1"}},
       "OMPI_COMM_WORLD_LOCAL_RANK is not set. HINT: mpirun (Open MPI) sets it"},
      {{{"RANK", "0"},
        {"WORLD_SIZE", "1"},
        {"LOCAL_RANK", "0"},
        {"MASTER_ADDR", "h"},
        {"MASTER_PORT", "70000"}},
       "MASTER_PORT=\"70000\" is not an integer in [1, 65535]"},
  };
  for (const auto& c : cases) {
    std::string error = errorOf([&] { resolveWorldEnv({}, lookup(c.env)); });
    EXPECT_NE(error.find(c.expected), std::string::npos)
        << "expected \"" << c.expected << "\" in: " << error;
  }
}

TEST(WorldEnv, ExplicitOptionsWinOverTheEnvironment) {
  Env env{{"RANK", "7"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "7"}};
  WorldOptions o;
  o.rank = 1;
  o.worldSize = 2;
  o.store = std::make_shared<store::HashStore>();
  auto w = resolveWorldEnv(o, lookup(env));
  EXPECT_EQ(w.launcher, Launcher::Explicit);
  EXPECT_EQ(w.rank, 1);
  EXPECT_EQ(w.localRank, 7) << "LOCAL_RANK still applies when only rank/size are explicit";
  EXPECT_FALSE(w.jobStore);
  EXPECT_FALSE(w.hostStore);
  o.rank = 2;
  EXPECT_NE(errorOf([&] { resolveWorldEnv(o, lookup(env)); }).find("do not fit"),
            std::string::npos);
}

// A table like backendTable() whose entries' "built" answers are the test's.
std::vector<BackendEntry> tableWith(bool ncclBuilt, bool glooBuilt) {
  std::vector<BackendEntry> t = backendTable();
  static bool nccl, gloo;
  nccl = ncclBuilt;
  gloo = glooBuilt;
  for (auto& e : t) {
    if (std::string(e.name) == "nccl") e.built = [] { return nccl; };
    if (std::string(e.name) == "gloo") e.built = [] { return gloo; };
  }
  return t;
}

std::string chosen(const std::string& requested, const Env& env, int devices, bool shm = true,
                   bool ncclBuilt = true, bool glooBuilt = true) {
  return chooseBackend(requested, lookup(env), devices, shm, tableWith(ncclBuilt, glooBuilt)).name;
}

TEST(Backend, AutomaticExplicitAndRefused) {
  Env none;
  EXPECT_EQ(chosen("", none, 2), "nccl");
  EXPECT_EQ(chosen("", none, 0), "shm") << "CPU tensors: shared memory where ranks share a node";
  EXPECT_EQ(chosen("", none, 0, /*shm=*/false), "gloo") << "DTRAIN_SHM=0";
  EXPECT_EQ(chosen("", none, 2, true, /*ncclBuilt=*/false), "shm");
  Env gloo{{"DTRAIN_BACKEND", "gloo"}};
  EXPECT_EQ(chosen("", gloo, 2), "gloo");
  EXPECT_EQ(chosen("nccl", gloo, 1), "nccl") << "the option wins";
  Env shm{{"DTRAIN_BACKEND", "shm"}};
  EXPECT_EQ(chosen("", shm, 2), "shm");
  EXPECT_NE(errorOf([&] {
              chosen("", shm, 0, /*shm=*/false);
            }).find("DTRAIN_BACKEND=shm, but shared memory is turned off (DTRAIN_SHM=0"),
            std::string::npos);
  Env bad{{"DTRAIN_BACKEND", "NCCL2"}};
  const std::string unknown = errorOf([&] { chosen("", bad, 1); });
  EXPECT_NE(unknown.find("DTRAIN_BACKEND=\"NCCL2\" is not a backend: use nccl (CUDA tensors), "
                         "shm (CPU tensors: shared memory inside a node, Gloo across nodes), gloo"),
            std::string::npos)
      << unknown;
  Env nccl{{"DTRAIN_BACKEND", "nccl"}};
  EXPECT_NE(errorOf([&] {
              chosen("", nccl, 0);
            }).find("DTRAIN_BACKEND=nccl, but no CUDA device is usable"),
            std::string::npos);
  EXPECT_NE(errorOf([&] {
              chosen("", nccl, 1, true, /*ncclBuilt=*/false);
            }).find("DTRAIN_BACKEND=nccl, but this dtrain was built without it"),
            std::string::npos);
}

TEST(Backend, SharedMemorySwitchAndNodeKey) {
  Env launch{{"RANK", "1"},
             {"WORLD_SIZE", "4"},
             {"LOCAL_RANK", "1"},
             {"GROUP_RANK", "1"},
             {"DTRAIN_STORE_ADDR", "127.0.0.1"}};
  auto w = resolveWorldEnv({}, lookup(launch));
  EXPECT_TRUE(w.sharedMemory);
  EXPECT_EQ(w.node, "group1") << "launch numbers its nodes";
  launch["DTRAIN_SHM"] = "0";
  EXPECT_FALSE(resolveWorldEnv({}, lookup(launch)).sharedMemory);
  launch["DTRAIN_SHM"] = "maybe";
  EXPECT_NE(errorOf([&] {
              resolveWorldEnv({}, lookup(launch));
            }).find("DTRAIN_SHM=\"maybe\" is not a switch"),
            std::string::npos);
  launch.erase("DTRAIN_SHM");
  WorldOptions off;
  off.sharedMemory = false;
  EXPECT_FALSE(resolveWorldEnv(off, lookup(launch)).sharedMemory) << "the option turns it off";
  WorldOptions named;
  named.node = "rack3";
  EXPECT_EQ(resolveWorldEnv(named, lookup(launch)).node, "rack3") << "the option wins";
  Env srun{{"SLURM_PROCID", "0"},
           {"SLURM_NTASKS", "2"},
           {"SLURM_LOCALID", "0"},
           {"SLURM_NODEID", "5"},
           {"MASTER_ADDR", "127.0.0.1"}};
  EXPECT_EQ(resolveWorldEnv({}, lookup(srun)).node, "slurm5");
  Env bare{{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"LOCAL_RANK", "0"}, {"MASTER_ADDR", "127.0.0.1"}};
  EXPECT_EQ(resolveWorldEnv({}, lookup(bare)).node, "") << "connectWorld() asks the host";
}

TEST(NcclEnvironment, InvalidValuesAreRejectedNamingTheVariable) {
  struct Case {
    Env env;
    const char* expected;  // "" = accepted
  };
  const std::vector<Case> cases = {
      {{{"NCCL_DEBUG", "INFO"},
        {"NCCL_IB_DISABLE", "1"},
        {"NCCL_SOCKET_IFNAME", "^lo,docker"},
        {"NCCL_ALGO", "Ring,Tree"},
        {"NCCL_PROTO", "^LL128"},
        {"NCCL_NET_GDR_LEVEL", "PHB"},
        {"NCCL_BUFFSIZE", "4194304"},
        {"TORCH_NCCL_BLOCKING_WAIT", "1"},
        {"NCCL_ALGO", "allreduce:tree;broadcast:ring"}},
       ""},
      {{{"NCCL_DEBUG", "VERBOSE"}},
       "NCCL_DEBUG=\"VERBOSE\" is not a valid value: NCCL expects one of"},
      {{{"NCCL_IB_DISABLE", "yes"}},
       "NCCL_IB_DISABLE=\"yes\" is not a valid value: NCCL expects 0 or 1"},
      {{{"NCCL_BUFFSIZE", "4M"}}, "NCCL_BUFFSIZE=\"4M\""},
      {{{"NCCL_ALGO", "Ring,Star"}}, "NCCL_ALGO=\"Ring,Star\""},
      {{{"NCCL_SOCKET_IFNAME", "eth0, eth1"}}, "NCCL_SOCKET_IFNAME=\"eth0, eth1\""},
      {{{"TORCH_NCCL_BLOCKING_WAIT", "abc"}}, "TORCH_NCCL_BLOCKING_WAIT=\"abc\""},
      {{{"NCCL_ASYNC_ERROR_HANDLING", "4"}},
       "NCCL_ASYNC_ERROR_HANDLING=\"4\" is not a valid value: "
       "NCCL expects an integer in [0, 3]"},
      // NCCL's path levels are compared with strcmp: "pix" would silently be no setting at all.
      {{{"NCCL_P2P_LEVEL", "NVB"}, {"NCCL_NET_GDR_LEVEL", "PXN"}, {"NCCL_NVLS_ENABLE", "2"}}, ""},
      {{{"NCCL_P2P_LEVEL", "pix"}}, "NCCL_P2P_LEVEL=\"pix\" is not a valid value"},
      // NCCL_COMM_BLOCKING=1 overrides any configuration: init would have no deadline.
      {{{"NCCL_COMM_BLOCKING", "0"}}, ""},
      {{{"NCCL_COMM_BLOCKING", "1"}},
       "NCCL_COMM_BLOCKING=\"1\" is not a valid value: dtrain's NCCL communicators are "
       "non-blocking, so that init has a deadline"},
  };
  for (const auto& c : cases) {
    std::string error = errorOf([&] { validateNcclEnvironment(lookup(c.env)); });
    if (std::string(c.expected).empty()) {
      EXPECT_EQ(error, "");
    } else {
      EXPECT_NE(error.find(c.expected), std::string::npos)
          << "expected \"" << c.expected << "\" in: " << error;
    }
  }
}

}  // namespace
}  // namespace dtrain::comm::world_env_test
