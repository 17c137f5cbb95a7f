// The sampling side of launch's monitoring: /proc and cgroup parsers (tables), the memory
// cgroup found and read in a directory laid out like cgroupfs, nvidia-smi's CSV against a
// recorded output, and the process sampler on real processes.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "launcher/monitor/cgroup_memory.h"
#include "launcher/monitor/command.h"
#include "launcher/monitor/gpu_sampler.h"
#include "launcher/monitor/proc_files.h"
#include "launcher/monitor/process_sampler.h"
#include "test_support.h"

namespace dtrain::launcher::monitor::launcher_monitor_sampling_test {
namespace {

using dtrain::testing::readFile;
using dtrain::testing::sourceDir;
using dtrain::testing::TempDir;
using dtrain::testing::writeFile;

TEST(ProcFiles, StatCountsFieldsFromTheLastParenthesis) {
  // A command name with spaces and parentheses must not shift the fields.
  const std::string line =
      "4242 (my (odd) name) S 4200 4242 4200 0 -1 4194560 500 0 0 0 150 25 0 0 20 0 7 0 "
      "123456 1000000 2560 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n";
  auto s = parseProcStat(line);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->state, 'S');
  EXPECT_EQ(s->ppid, 4200);
  EXPECT_EQ(s->pgrp, 4242);
  EXPECT_EQ(s->cpuTicks, 175u);
  EXPECT_EQ(s->threads, 7);
  EXPECT_EQ(s->startTicks, 123456u);
  EXPECT_EQ(s->rssPages, 2560);
  EXPECT_FALSE(parseProcStat("4242 (x) S 1 2"));
  EXPECT_FALSE(parseProcStat("garbage"));
  EXPECT_FALSE(parseProcStat(""));
}

TEST(ProcFiles, StatusIoMeminfoAndLoadavg) {
  ProcStatus s = parseProcStatus("Name:\ttrain\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\n"
                                 "Threads:\t12\n");
  EXPECT_EQ(s.rssBytes, 102400 * 1024);
  EXPECT_EQ(s.peakRssBytes, 204800 * 1024);
  EXPECT_EQ(s.threads, 12);
  ProcStatus zombie = parseProcStatus("Name:\tx\nState:\tZ (zombie)\nThreads:\t1\n");
  EXPECT_EQ(zombie.rssBytes, -1);

  ProcIo io = parseProcIo("rchar: 6976\nwchar: 0\nsyscr: 10\nsyscw: 0\nread_bytes: 4096\n"
                          "write_bytes: 8192\ncancelled_write_bytes: 0\n");
  EXPECT_EQ(io.readBytes, 4096);
  EXPECT_EQ(io.writeBytes, 8192);
  EXPECT_EQ(parseProcIo("").readBytes, -1);

  MemInfo m = parseMemInfo("MemTotal:       24684084 kB\nMemFree:         9521792 kB\n"
                           "MemAvailable:   15747004 kB\n");
  EXPECT_EQ(m.totalBytes, int64_t{24684084} * 1024);
  EXPECT_EQ(m.availableBytes, int64_t{15747004} * 1024);

  EXPECT_DOUBLE_EQ(*parseLoadAvg("14.78 14.49 11.30 20/225 27925\n"), 14.78);
  EXPECT_FALSE(parseLoadAvg("x y"));
  // A key must match whole: "read_bytes" is not found in "cancelled_read_bytes".
  EXPECT_EQ(findKeyedValue("cancelled_read_bytes: 5\n", "read_bytes", ':'), -1);
}

TEST(ProcFiles, ReaderReadsLiveFilesAndSaysWhenOneIsGone) {
  FileReader reader;
  auto self = reader.read("/proc/self/stat");
  ASSERT_TRUE(self);
  auto stat = parseProcStat(*self);
  ASSERT_TRUE(stat);
  EXPECT_GE(stat->threads, 1);
  EXPECT_FALSE(reader.read("/proc/999999999/stat"));
}

struct CgroupCase {
  const char* name;
  const char* cgroup;
  const char* mountinfo;
  int version;
  const char* dir;
};

class LocateCgroup : public ::testing::TestWithParam<CgroupCase> {};

TEST_P(LocateCgroup, FindsTheMemoryCgroupsDirectory) {
  const CgroupCase& c = GetParam();
  CgroupLocation loc = locateMemoryCgroup(c.cgroup, c.mountinfo);
  EXPECT_EQ(loc.version, c.version);
  EXPECT_EQ(loc.dir, c.dir);
}

INSTANTIATE_TEST_SUITE_P(
    Table, LocateCgroup,
    ::testing::Values(
        CgroupCase{"v2", "0::/user.slice/job.scope\n",
                   "29 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n", 2,
                   "/sys/fs/cgroup/user.slice/job.scope"},
        CgroupCase{"v2_root", "0::/\n", "29 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n", 2,
                   "/sys/fs/cgroup"},
        // A hybrid machine (this one): v1 memory controller plus a v2 mount without it.
        CgroupCase{"hybrid_v1_wins", "4:memory:/process_api/abc\n1:cpu:/\n0::/\n",
                   "31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n"
                   "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
                   "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n",
                   1, "/sys/fs/cgroup/memory/process_api/abc"},
        CgroupCase{"v1_joined_controllers", "3:cpu,memory:/job\n",
                   "35 31 0:32 / /sys/fs/cgroup/cpu,memory rw - cgroup cgroup rw,cpu,memory\n", 1,
                   "/sys/fs/cgroup/cpu,memory/job"},
        // In a container the mount's root is the container's cgroup.
        CgroupCase{"container_root", "0::/docker/abc/sub\n",
                   "29 23 0:26 /docker/abc /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n", 2,
                   "/sys/fs/cgroup/sub"},
        CgroupCase{"escaped_mount_point", "0::/job\n",
                   "29 23 0:26 / /mnt/cg\\040root rw - cgroup2 cgroup2 rw\n", 2,
                   "/mnt/cg root/job"},
        CgroupCase{"none", "0::/\n", "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n", 0, ""}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(CgroupMemory, V2TakesTheSmallestLimitOnTheWayUp) {
  TempDir tmp;
  const std::string root = tmp.path();
  const std::string job = root + "/job.slice";
  const std::string leaf = job + "/run";
  std::filesystem::create_directories(leaf);
  writeFile(job + "/memory.max", "268435456\n");
  writeFile(job + "/memory.current", "251658240\n");
  writeFile(job + "/memory.stat", "anon 230000000\nfile 20000000\ninactive_file 16777216\n");
  writeFile(leaf + "/memory.max", "max\n");
  writeFile(leaf + "/memory.current", "1000\n");
  CgroupLocation loc;
  loc.version = 2;
  loc.dir = leaf;
  loc.mountDir = root;
  CgroupMemoryReader cgroup(loc);
  FileReader reader;
  auto m = cgroup.read(reader);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->limitBytes, 268435456);
  EXPECT_EQ(m->limitDir, job);
  EXPECT_EQ(m->usageBytes, 251658240) << "usage is the limiting cgroup's, not the leaf's";
  EXPECT_EQ(m->workingSetBytes(), 251658240 - 16777216);

  writeFile(job + "/memory.max", "max\n");
  CgroupMemoryReader unlimited(loc, 1);
  m = unlimited.read(reader);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->limitBytes, -1);
  EXPECT_EQ(m->usageBytes, 1000);
}

TEST(CgroupMemory, V1ReadsTheHierarchicalLimit) {
  TempDir tmp;
  writeFile(tmp.file("memory.usage_in_bytes"), "209715200\n");
  writeFile(tmp.file("memory.stat"), "cache 1000\nrss 2000\nhierarchical_memory_limit 268435456\n"
                                     "inactive_file 4096\ntotal_inactive_file 10485760\n");
  CgroupLocation loc;
  loc.version = 1;
  loc.dir = tmp.path();
  CgroupMemoryReader cgroup(loc);
  FileReader reader;
  auto m = cgroup.read(reader);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->limitBytes, 268435456);
  EXPECT_EQ(m->inactiveFileBytes, 10485760) << "the hierarchical total, not the cgroup's own";
  writeFile(tmp.file("memory.stat"), "hierarchical_memory_limit 9223372036854771712\n");
  m = cgroup.read(reader);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->limitBytes, -1) << "2^63 rounded to a page means no limit";
}

TEST(NodeSample, TheFractionThatMattersIsTheTighterOne) {
  NodeSample n;
  n.mem.totalBytes = 1000;
  n.mem.availableBytes = 600;  // machine 40 % in use
  EXPECT_DOUBLE_EQ(*n.memUsedFraction(), 0.4);
  CgroupMemory c;
  c.usageBytes = 95;
  c.inactiveFileBytes = 5;
  c.limitBytes = 100;  // cgroup 90 % in use
  n.cgroup = c;
  EXPECT_DOUBLE_EQ(*n.memUsedFraction(), 0.9);
  EXPECT_EQ(*n.memHeadroomBytes(), 10);
  n.cgroup->limitBytes = -1;
  EXPECT_DOUBLE_EQ(*n.memUsedFraction(), 0.4) << "no limit: the machine decides";
  EXPECT_EQ(*n.memHeadroomBytes(), 600);
}

TEST(NvidiaSmiCsv, ParsesTheRecordedQuery) {
  const std::string csv = readFile(sourceDir() + "/tests/data/nvidia_smi/query_gpu.csv");
  std::vector<std::string> problems;
  auto gpus = parseGpuQueryCsv(csv, &problems);
  EXPECT_TRUE(problems.empty()) << problems.front();
  ASSERT_EQ(gpus.size(), 4u);
  EXPECT_EQ(gpus[0].index, 0);
  EXPECT_EQ(gpus[0].uuid, "GPU-8c3e1a52-4f0b-2d6e-91a7-5b2f0c7d9e13");
  EXPECT_DOUBLE_EQ(*gpus[0].utilPercent, 97);
  EXPECT_DOUBLE_EQ(*gpus[0].memUsedBytes, 61234.0 * 1024 * 1024);
  EXPECT_DOUBLE_EQ(*gpus[0].memTotalBytes, 143771.0 * 1024 * 1024);
  EXPECT_DOUBLE_EQ(*gpus[0].temperatureC, 71);
  EXPECT_DOUBLE_EQ(*gpus[0].powerW, 652.31);
  EXPECT_FALSE(gpus[3].utilPercent) << "[Not Supported] is no value, not zero";
  EXPECT_FALSE(gpus[3].powerW) << "[N/A] is no value";
  EXPECT_DOUBLE_EQ(*gpus[3].temperatureC, 30);

  auto apps = parseComputeAppsCsv(readFile(sourceDir() + "/tests/data/nvidia_smi/compute_apps.csv"),
                                  &problems);
  EXPECT_TRUE(problems.empty());
  ASSERT_EQ(apps.size(), 3u);
  EXPECT_EQ(apps[2].process.pid, 41301);
  EXPECT_EQ(apps[2].process.usedBytes, -1);
  attachApps(gpus, apps);
  ASSERT_EQ(gpus[0].processes.size(), 1u);
  EXPECT_EQ(gpus[0].processes[0].pid, 41235);
  EXPECT_EQ(gpus[0].processes[0].usedBytes, int64_t{61200} * 1024 * 1024);
  EXPECT_EQ(gpus[1].processes.size(), 2u);
  EXPECT_TRUE(gpus[2].processes.empty());
}

TEST(NvidiaSmiCsv, MalformedLinesAreSkippedAndNamed) {
  std::vector<std::string> problems;
  auto gpus = parseGpuQueryCsv(
      "0, GPU-a, 5, 1, 2, 3, 4\nNVIDIA-SMI has failed because it couldn't communicate with the "
      "NVIDIA driver.\n1, GPU-b, 5\n\n",
      &problems);
  ASSERT_EQ(gpus.size(), 1u);
  ASSERT_EQ(problems.size(), 2u);
  EXPECT_NE(problems[0].find("line 2"), std::string::npos) << problems[0];
  EXPECT_TRUE(parseComputeAppsCsv("No running processes found\n").empty());
  // Some versions print units despite nounits.
  auto units = parseGpuQueryCsv("0, GPU-a, 5 %, 100 MiB, 200 MiB, 40, 250.00 W\n");
  ASSERT_EQ(units.size(), 1u);
  EXPECT_DOUBLE_EQ(*units[0].powerW, 250.0);
}

// The nvidia-smi source end to end, with a stand-in script that prints the recorded CSV.
TEST(NvidiaSmiSource, RunsTheQueriesAndAttributesProcesses) {
  TempDir tmp;
  const std::string data = sourceDir() + "/tests/data/nvidia_smi";
  writeFile(tmp.file("nvidia-smi"), "#!/bin/sh\ncase \"$1\" in\n  --query-gpu=*) cat '" + data +
                                        "/query_gpu.csv' ;;\n"
                                        "  --query-compute-apps=*) cat '" +
                                        data +
                                        "/compute_apps.csv' ;;\n  *) exit 9 ;;\n"
                                        "esac\n");
  ::chmod(tmp.file("nvidia-smi").c_str(), 0755);
  GpuSourceOptions o;
  o.nvidiaSmi = tmp.file("nvidia-smi");
  o.tryNvml = false;
  std::string why;
  auto source = openGpuSource(o, &why);
  ASSERT_TRUE(source) << why;
  auto gpus = source->sample();
  ASSERT_EQ(gpus.size(), 4u);
  EXPECT_EQ(gpus[1].processes.size(), 2u);

  // One that hangs is killed at the deadline.
  writeFile(tmp.file("nvidia-smi"), "#!/bin/sh\nsleep 30\n");
  o.timeout = std::chrono::milliseconds(300);
  auto hanging = nvidiaSmiSource(o);
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(hanging->sample().empty());
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 5.0);
  EXPECT_NE(hanging->lastError().find("did not finish"), std::string::npos) << hanging->lastError();

  o.nvidiaSmi = tmp.file("absent");
  EXPECT_FALSE(openGpuSource(o, &why));
  EXPECT_NE(why.find("not in PATH"), std::string::npos) << why;
}

TEST(Command, CapturesOutputAndExitCode) {
  CommandResult r = runCommand({"sh", "-c", "echo out; echo err >&2; exit 3"},
                               std::chrono::milliseconds(5000));
  EXPECT_TRUE(r.started);
  EXPECT_EQ(r.exitCode, 3);
  EXPECT_EQ(r.out, "out\n");
  EXPECT_EQ(r.err, "err\n");
  CommandResult missing = runCommand({"no-such-program-xyz"}, std::chrono::milliseconds(5000));
  EXPECT_FALSE(missing.started);
}

// A worker whose child allocates: the child's memory and CPU count towards the worker's rank.
TEST(ProcessSampler, SumsTheWorkersProcessTree) {
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  pid_t worker = ::fork();
  ASSERT_GE(worker, 0);
  if (worker == 0) {
    ::setpgid(0, 0);  // the test kills the group: the child must not outlive it
    pid_t child = ::fork();
    if (child == 0) {
      std::vector<char> block(64 << 20, 1);  // 64 MiB, touched
      (void)!::write(ready[1], "x", 1);
      auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      volatile uint64_t spin = 0;
      while (std::chrono::steady_clock::now() < end) spin = spin + block[spin % block.size()];
      ::_exit(0);
    }
    ::pause();
    ::_exit(0);
  }
  ::setpgid(worker, worker);
  char c;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ProcessSampler sampler(CgroupLocation{}, /*discoverEvery=*/1);
  sampler.setWorkers({WorkerProcess{3, 1, worker}});
  auto now = [] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  };
  auto first = sampler.sampleWorkers(now());
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  auto second = sampler.sampleWorkers(now());
  ::kill(-worker, SIGKILL);
  int status = 0;
  ::waitpid(worker, &status, 0);
  ASSERT_EQ(first.size(), 1u);
  ASSERT_EQ(second.size(), 1u);
  const RankSample& s = second[0];
  EXPECT_EQ(s.rank, 3);
  EXPECT_EQ(s.localRank, 1);
  EXPECT_EQ(s.processes, 2) << "the worker and its child";
  EXPECT_GE(s.rssBytes, 64 << 20);
  EXPECT_GE(s.peakRssBytes, s.rssBytes);
  // The child spins (the worker itself only waits): whatever share of a core a loaded machine
  // gives it, it shows up as the rank's CPU.
  EXPECT_GT(s.cpuPercent, 1.0) << "the child spins";
  EXPECT_EQ(first[0].cpuPercent, -1) << "no rate from a single sample";
  EXPECT_GE(s.threads, 2);
  // The worker has ended: it is no longer sampled.
  EXPECT_TRUE(sampler.sampleWorkers(now()).empty());
}

// Descendants come from the kernel's children lists, walked down from the worker: the same tree
// the scan of every /proc/<pid>/stat finds, including a child that one of the worker's other
// threads forked (it is on that thread's list, not the main thread's) and a grandchild.
TEST(ProcessSampler, ChildrenListsFindTheTreeTheProcScanFinds) {
  if (::access("/proc/thread-self/children", R_OK) != 0) {
    GTEST_SKIP() << "this kernel has no /proc/<pid>/task/<tid>/children (CONFIG_PROC_CHILDREN)";
  }
  int pids[2];
  ASSERT_EQ(::pipe(pids), 0);
  pid_t worker = ::fork();
  ASSERT_GE(worker, 0);
  if (worker == 0) {
    ::setpgid(0, 0);  // the test kills the group: nothing may outlive it
    auto park = [] {
      while (true) ::pause();
    };
    std::atomic<pid_t> fromThread{-1};
    std::thread other([&] {
      const pid_t child = ::fork();
      if (child == 0) park();
      fromThread = child;
      while (true) ::pause();  // the forking thread stays: its list holds the child
    });
    while (fromThread == -1) ::usleep(1000);
    int inner[2];
    if (::pipe(inner) != 0) ::_exit(1);
    pid_t child = ::fork();
    if (child == 0) {
      pid_t grandchild = ::fork();
      if (grandchild == 0) park();
      (void)!::write(inner[1], &grandchild, sizeof grandchild);
      park();
    }
    pid_t grandchild = -1;
    if (::read(inner[0], &grandchild, sizeof grandchild) != sizeof grandchild) ::_exit(1);
    pid_t tree[3] = {fromThread.load(), child, grandchild};
    (void)!::write(pids[1], tree, sizeof tree);
    park();
  }
  ::setpgid(worker, worker);
  pid_t tree[3] = {};
  ASSERT_EQ(::read(pids[0], tree, sizeof tree), static_cast<ssize_t>(sizeof tree));
  std::vector<pid_t> expected{worker, tree[0], tree[1], tree[2]};
  std::sort(expected.begin(), expected.end());
  auto found = [&](bool childrenLists) {
    ProcessSampler sampler(CgroupLocation{}, /*discoverEvery=*/1, childrenLists);
    sampler.setWorkers({WorkerProcess{0, 0, worker}});
    auto samples = sampler.sampleWorkers(1.0);
    std::vector<pid_t> pids = samples.empty() ? std::vector<pid_t>{} : samples[0].pids;
    std::sort(pids.begin(), pids.end());
    return pids;
  };
  const std::vector<pid_t> lists = found(true);
  const std::vector<pid_t> scan = found(false);
  ::kill(-worker, SIGKILL);
  ::waitpid(worker, nullptr, 0);
  EXPECT_EQ(lists, expected) << "children lists";
  EXPECT_EQ(scan, expected) << "the /proc scan";
}

// With children lists the tree is walked at every sample: a child the worker starts between two
// samples counts at the next one, where the /proc scan (every `discoverEvery` samples) would
// miss it until its next scan.
TEST(ProcessSampler, AChildStartedBetweenSamplesCountsAtTheNext) {
  if (::access("/proc/thread-self/children", R_OK) != 0) {
    GTEST_SKIP() << "this kernel has no /proc/<pid>/task/<tid>/children (CONFIG_PROC_CHILDREN)";
  }
  int go[2];
  int started[2];
  ASSERT_EQ(::pipe(go), 0);
  ASSERT_EQ(::pipe(started), 0);
  pid_t worker = ::fork();
  ASSERT_GE(worker, 0);
  if (worker == 0) {
    ::setpgid(0, 0);  // the test kills the group: the child must not outlive it
    char c;
    if (::read(go[0], &c, 1) != 1) ::_exit(1);
    pid_t child = ::fork();
    if (child == 0) {
      while (true) ::pause();
    }
    (void)!::write(started[1], &child, sizeof child);
    while (true) ::pause();
  }
  ::setpgid(worker, worker);
  ProcessSampler lists(CgroupLocation{}, /*discoverEvery=*/10, /*childrenLists=*/true);
  ProcessSampler scan(CgroupLocation{}, /*discoverEvery=*/10, /*childrenLists=*/false);
  lists.setWorkers({WorkerProcess{0, 0, worker}});
  scan.setWorkers({WorkerProcess{0, 0, worker}});
  auto before = lists.sampleWorkers(1.0);
  scan.sampleWorkers(1.0);  // its scan, before the child
  ASSERT_EQ(::write(go[1], "x", 1), 1);
  pid_t child = -1;
  ASSERT_EQ(::read(started[0], &child, sizeof child), static_cast<ssize_t>(sizeof child));
  auto after = lists.sampleWorkers(2.0);
  auto scanAfter = scan.sampleWorkers(2.0);
  ::kill(-worker, SIGKILL);
  ::waitpid(worker, nullptr, 0);
  ASSERT_EQ(before.size(), 1u);
  ASSERT_EQ(after.size(), 1u);
  ASSERT_EQ(scanAfter.size(), 1u);
  EXPECT_EQ(before[0].processes, 1);
  EXPECT_EQ(after[0].processes, 2) << "the child counts at the next sample";
  EXPECT_NE(std::find(after[0].pids.begin(), after[0].pids.end(), child), after[0].pids.end());
  EXPECT_EQ(scanAfter[0].processes, 1) << "the scan sees it only at its next scan";
}

TEST(ProcessSampler, NodeSampleReadsThisMachine) {
  ProcessSampler sampler(locateOwnMemoryCgroup());
  NodeSample n = sampler.sampleNode();
  EXPECT_TRUE(n.load1);
  EXPECT_GT(n.mem.totalBytes, 0);
  ASSERT_TRUE(n.memUsedFraction());
  EXPECT_GT(*n.memUsedFraction(), 0.0);
  EXPECT_LT(*n.memUsedFraction(), 1.0);
}

}  // namespace
}  // namespace dtrain::launcher::monitor::launcher_monitor_sampling_test
