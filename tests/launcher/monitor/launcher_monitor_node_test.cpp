// A node's network, disk and scheduler figures (launcher/monitor/node_sampler.h): the kernel
// files' parsers on recorded text (tables), the directories launch watches, the sampler's rates
// over a directory laid out like /proc with two recorded samples, and the records, labels and
// Prometheus series they become.
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "dtrain/base/metrics.h"
#include "dtrain/base/tensorboard.h"
#include "launcher/monitor/gpu_sampler.h"
#include "launcher/monitor/node_files.h"
#include "launcher/monitor/node_sampler.h"
#include "launcher/monitor/proc_files.h"
#include "launcher/monitor/records.h"
#include "prometheus_text_support.h"
#include "test_support.h"

namespace dtrain::launcher::monitor::launcher_monitor_node_test {
namespace {

using dtrain::testing::readFile;
using dtrain::testing::sourceDir;
using dtrain::testing::TempDir;
using dtrain::testing::writeFile;

// /proc/net/dev of a GPU node (recorded, trimmed): its two header lines, loopback, an idle ifb,
// the collectives' NIC and a name at IFNAMSIZ - 1.
constexpr const char* kNetDev =
    "Inter-|   Receive                                                |  Transmit\n"
    " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs "
    "drop fifo colls carrier compressed\n"
    "    lo:  629964    5424    0    0    0     0          0         0   629964    5424    0    "
    "0    0     0       0          0\n"
    "  ifb0:       0       0    0    0    0     0          0         0        0       0    0    "
    "0    0     0       0          0\n"
    "  eth0: 112954662  168159    3   17    0     0          0         0  8041329   60105    1 "
    "   2    0     0       0          0\n"
    "enp175s0f0np0: 18446744073709551615 1 0 0 0 0 0 0 5 1 0 0 0 0 0 0\n";

struct NetDevCase {
  const char* name;
  const char* text;
  size_t interfaces;
};

class NetDev : public ::testing::TestWithParam<NetDevCase> {};

TEST_P(NetDev, ReadsEveryInterfaceLineAndNothingElse) {
  std::vector<NetDevCounters> out(3);  // stale entries are cleared
  parseNetDev(GetParam().text, out);
  EXPECT_EQ(out.size(), GetParam().interfaces);
}

INSTANTIATE_TEST_SUITE_P(
    Texts, NetDev,
    ::testing::Values(NetDevCase{"recorded", kNetDev, 4},
                      NetDevCase{"headers_only", "Inter-| Receive | Transmit\n face |bytes\n", 0},
                      NetDevCase{"empty", "", 0}, NetDevCase{"short_line", "  eth0: 1 2 3\n", 0},
                      NetDevCase{"name_too_long",
                                 "abcdefghijklmnopq: 1 2 3 4 5 6 7 8 9 10 11 12 "
                                 "13 14 15 16\n",
                                 0},
                      NetDevCase{"no_trailing_newline",
                                 "eth1: 1 2 3 4 5 6 7 8 9 10 11 12 13 14 "
                                 "15 16",
                                 1}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(NodeFiles, NetDevCountersAreTheRightColumns) {
  std::vector<NetDevCounters> out;
  parseNetDev(kNetDev, out);
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[2].interface(), "eth0");
  EXPECT_EQ(out[2].rxBytes, 112954662u);
  EXPECT_EQ(out[2].rxErrors, 3u);
  EXPECT_EQ(out[2].rxDrops, 17u);
  EXPECT_EQ(out[2].txBytes, 8041329u);
  EXPECT_EQ(out[2].txErrors, 1u);
  EXPECT_EQ(out[2].txDrops, 2u);
  EXPECT_EQ(out[3].interface(), "enp175s0f0np0");
  EXPECT_EQ(out[3].rxBytes, 18446744073709551615u);
}

// /proc/diskstats (recorded): a whole disk, its partition, a loop device, and an older kernel's
// line with 11 counters.
constexpr const char* kDiskStats =
    "   7       0 loop0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n"
    " 252       0 vda 1204 27 86734 512 51920 30102 2217552 48420 0 40332 48932 0 0 0 0 1022 "
    "0\n"
    " 252       1 vda1 1100 27 80000 500 51900 30102 2217000 48400 0 40300 48900 0 0 0 0 0 0\n"
    " 259       3 nvme0n1p3 10 0 4 1 2 0 8 1 0 2 2\n";

struct DiskCase {
  const char* name;
  unsigned major;
  unsigned minor;
  const char* device;
  bool found;
  uint64_t readBytes;
  uint64_t writtenBytes;
};

class DiskStats : public ::testing::TestWithParam<DiskCase> {};

TEST_P(DiskStats, FindsTheDeviceByNumberElseByName) {
  const DiskCase& c = GetParam();
  auto d = findDiskStats(kDiskStats, c.major, c.minor, c.device);
  ASSERT_EQ(d.has_value(), c.found);
  if (!d) return;
  EXPECT_EQ(d->readBytes, c.readBytes);
  EXPECT_EQ(d->writtenBytes, c.writtenBytes);
}

INSTANTIATE_TEST_SUITE_P(
    Devices, DiskStats,
    ::testing::Values(DiskCase{"partition", 252, 1, "", true, 80000u * 512, 2217000u * 512},
                      DiskCase{"whole_disk", 252, 0, "", true, 86734u * 512, 2217552u * 512},
                      // btrfs gives an anonymous device number; its source names the partition.
                      DiskCase{"by_name", 0, 33, "vda1", true, 80000u * 512, 2217000u * 512},
                      DiskCase{"number_wins_over_name", 252, 0, "vda1", true, 86734u * 512,
                               2217552u * 512},
                      DiskCase{"old_kernel_line", 259, 3, "", true, 4u * 512, 8u * 512},
                      DiskCase{"tmpfs", 0, 45, "", false, 0, 0},
                      DiskCase{"unknown_name", 0, 45, "sdz", false, 0, 0}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(NodeFiles, ContextSwitchesAndSwap) {
  EXPECT_EQ(*parseContextSwitches("cpu  10 0 5 100 0 0 0 0 0 0\nintr 12 0\nctxt 2441816\n"
                                  "btime 1700000000\n"),
            2441816u);
  EXPECT_FALSE(parseContextSwitches("cpu  10 0 5 100\nctxtx 5\n"));
  EXPECT_FALSE(parseContextSwitches(""));

  MemInfo m = parseMemInfo("MemTotal:       24684084 kB\nMemAvailable:   15747004 kB\n"
                           "SwapCached:            0 kB\nSwapTotal:       2097148 kB\n"
                           "SwapFree:        1048572 kB\n");
  EXPECT_EQ(m.swapTotalBytes, int64_t{2097148} * 1024);
  EXPECT_EQ(m.swapFreeBytes, int64_t{1048572} * 1024);
  MemInfo none = parseMemInfo("MemTotal: 1 kB\nSwapTotal:             0 kB\nSwapFree:     0 kB\n");
  EXPECT_EQ(none.swapTotalBytes, 0);
}

// /proc/self/mountinfo (recorded, trimmed): the root, a bind mount of the same device at
// /work, a scratch disk whose mount point has a space, a tmpfs.
constexpr const char* kMountInfo =
    "27 1 252:0 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
    "22 27 0:21 / /proc rw,relatime - proc proc rw\n"
    "90 27 252:0 /srv/work /work rw,relatime shared:1 - ext4 /dev/vda rw\n"
    "91 27 259:3 / /mnt/scratch\\040disk rw,noatime - xfs /dev/nvme0n1p3 rw\n"
    "92 27 0:45 / /dev/shm rw - tmpfs tmpfs rw\n";

struct MountCase {
  const char* name;
  const char* path;
  unsigned major;
  unsigned minor;
  const char* mountPoint;  // nullptr: none
  const char* source;
};

class Mounts : public ::testing::TestWithParam<MountCase> {};

TEST_P(Mounts, TheLongestMountOfTheDeviceAboveThePath) {
  const MountCase& c = GetParam();
  auto m = findMount(kMountInfo, c.path, c.major, c.minor);
  ASSERT_EQ(m.has_value(), c.mountPoint != nullptr);
  if (!m) return;
  EXPECT_EQ(m->mountPoint, c.mountPoint);
  EXPECT_EQ(m->source, c.source);
}

INSTANTIATE_TEST_SUITE_P(
    Paths, Mounts,
    ::testing::Values(MountCase{"root", "/home/u/ckpt", 252, 0, "/", "/dev/vda"},
                      MountCase{"bind_mount", "/work/ckpt", 252, 0, "/work", "/dev/vda"},
                      MountCase{"not_a_prefix", "/workspace", 252, 0, "/", "/dev/vda"},
                      MountCase{"escaped_space", "/mnt/scratch disk/data", 259, 3,
                                "/mnt/scratch disk", "/dev/nvme0n1p3"},
                      MountCase{"tmpfs", "/dev/shm/x", 0, 45, "/dev/shm", "tmpfs"},
                      MountCase{"other_device", "/work/ckpt", 259, 3, nullptr, ""}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(WatchedDirectories, LaunchsDirsTheProgramsArgsAndTheEnvironment) {
  auto dirs = watchedDirectories(
      {"/logs", "", "/logs"},
      {"--epochs", "3", "--checkpoint-dir", "ckpt", "--data-dir=/data", "--save-dir"}, "/env/ckpt",
      "/data");
  std::vector<std::string> got;
  for (const auto& d : dirs) got.push_back(fmt::format("{}={}", directoryRoleName(d.role), d.path));
  EXPECT_EQ(got, (std::vector<std::string>{"log=/logs", "checkpoint=ckpt", "data=/data",
                                           "checkpoint=/env/ckpt"}))
      << "empty and repeated ones left out; a flag without its value is no directory";
}

// A directory laid out like /proc, holding one recorded sample at a time.
struct FakeProc {
  TempDir dir;
  FakeProc() {
    std::filesystem::create_directories(dir.file("net"));
    std::filesystem::create_directories(dir.file("self"));
  }
  void write(const std::string& netDev, const std::string& diskStats, uint64_t ctxt,
             const std::string& mountInfo) {
    writeFile(dir.file("net/dev"), netDev);
    writeFile(dir.file("diskstats"), diskStats);
    writeFile(dir.file("stat"), fmt::format("cpu  1 2 3 4\nctxt {}\n", ctxt));
    writeFile(dir.file("self/mountinfo"), mountInfo);
  }
};

std::string netDevLine(const char* name, uint64_t rx, uint64_t rxErr, uint64_t rxDrop, uint64_t tx,
                       uint64_t txErr, uint64_t txDrop) {
  return fmt::format("{}: {} 10 {} {} 0 0 0 0 {} 10 {} {} 0 0 0 0\n", name, rx, rxErr, rxDrop, tx,
                     txErr, txDrop);
}

TEST(NodeFigureSampler, RatesBetweenTwoSamplesOfEveryInterfaceAndFilesystem) {
  FakeProc proc;
  TempDir work;
  const std::string ckpt = work.file("ckpt");  // created between the samples
  std::filesystem::create_directories(work.file("logs"));
  struct stat st {};
  ASSERT_EQ(::stat(work.path().c_str(), &st), 0);
  const unsigned maj = major(st.st_dev);
  const unsigned min = minor(st.st_dev);
  const std::string real = std::filesystem::canonical(work.path()).string();
  // The temporary directory is its own mount here, on device "fake0".
  const std::string mountInfo = fmt::format("1 0 {}:{} / {} rw - ext4 /dev/fake0 rw\n", maj, min,
                                            real);
  const std::string header = "Inter-| Receive | Transmit\n face |bytes packets\n";

  NodeFigureOptions o;
  o.procDir = proc.dir.path();
  o.collectiveInterface = "ib0";
  o.directories = {{DirectoryRole::Log, work.file("logs")}, {DirectoryRole::Checkpoint, ckpt}};
  NodeFigureSampler sampler(o);

  proc.write(header + netDevLine("lo", 100, 0, 0, 100, 0, 0) +
                 netDevLine("eth0", 1000, 0, 0, 2000, 0, 0) + netDevLine("ib0", 0, 0, 0, 0, 0, 0) +
                 netDevLine("docker0", 0, 0, 0, 0, 0, 0),
             fmt::format("{} {} fake0 1 0 8 0 1 0 16 0 0 0 0\n", maj, min), 1000, mountInfo);
  const NodeFigures& first = sampler.sample(10.0);
  ASSERT_EQ(first.interfaces.size(), 2u) << "lo and an idle bridge are left out, the "
                                            "collectives' interface is not";
  EXPECT_EQ(first.interfaces[0].name, "eth0");
  EXPECT_FALSE(first.interfaces[0].hasRates);
  EXPECT_EQ(first.interfaces[1].name, "ib0");
  EXPECT_TRUE(first.interfaces[1].collectives);
  ASSERT_EQ(first.filesystems.size(), 1u) << "both directories are on one filesystem";
  EXPECT_EQ(first.filesystems[0].mountPoint, real);
  EXPECT_TRUE(first.filesystems[0].logs);
  EXPECT_TRUE(first.filesystems[0].checkpoints)
      << "a directory not made yet counts on its parent's";
  EXPECT_FALSE(first.filesystems[0].data);
  EXPECT_GT(first.filesystems[0].totalBytes, 0);
  ASSERT_TRUE(first.filesystems[0].freeRatio());
  EXPECT_FALSE(first.filesystems[0].hasRates);
  EXPECT_FALSE(first.contextSwitchesPerS);

  std::filesystem::create_directories(ckpt);
  proc.write(header + netDevLine("lo", 100, 0, 0, 100, 0, 0) +
                 netDevLine("eth0", 3000, 4, 6, 2500, 2, 0) +
                 netDevLine("ib0", 800, 0, 0, 400, 0, 0) + netDevLine("docker0", 0, 0, 0, 0, 0, 0),
             fmt::format("{} {} fake0 1 0 408 0 1 0 2016 0 0 0 0\n", maj, min), 3000, mountInfo);
  const NodeFigures& second = sampler.sample(12.0);
  ASSERT_EQ(second.interfaces.size(), 2u);
  const InterfaceFigures& eth = second.interfaces[0];
  ASSERT_TRUE(eth.hasRates);
  EXPECT_DOUBLE_EQ(eth.rxBytesPerS, 1000.0);
  EXPECT_DOUBLE_EQ(eth.txBytesPerS, 250.0);
  EXPECT_DOUBLE_EQ(eth.rxErrorsPerS, 2.0);
  EXPECT_DOUBLE_EQ(eth.txErrorsPerS, 1.0);
  EXPECT_DOUBLE_EQ(eth.rxDropsPerS, 3.0);
  EXPECT_DOUBLE_EQ(eth.txDropsPerS, 0.0);
  EXPECT_DOUBLE_EQ(second.interfaces[1].rxBytesPerS, 400.0);
  ASSERT_EQ(second.filesystems.size(), 1u);
  ASSERT_TRUE(second.filesystems[0].hasRates);
  EXPECT_DOUBLE_EQ(second.filesystems[0].readBytesPerS, 400.0 * 512 / 2);
  EXPECT_DOUBLE_EQ(second.filesystems[0].writeBytesPerS, 2000.0 * 512 / 2);
  ASSERT_TRUE(second.contextSwitchesPerS);
  EXPECT_DOUBLE_EQ(*second.contextSwitchesPerS, 1000.0);

  // Counters that went back (the interface was recreated) give no rate, not a huge one.
  proc.write(header + netDevLine("eth0", 10, 0, 0, 10, 0, 0), "", 3500, mountInfo);
  const NodeFigures& third = sampler.sample(13.0);
  ASSERT_EQ(third.interfaces.size(), 1u) << "an interface that went away is no longer reported";
  EXPECT_FALSE(third.interfaces[0].hasRates);
  EXPECT_FALSE(third.filesystems[0].hasRates) << "no diskstats line: no disk rates";

  // A directory removed again is measured on its parent's filesystem once more.
  std::filesystem::remove(ckpt);
  const NodeFigures& fourth = sampler.sample(14.0);
  ASSERT_EQ(fourth.filesystems.size(), 1u);
  EXPECT_TRUE(fourth.filesystems[0].checkpoints);
  EXPECT_GT(fourth.filesystems[0].freeBytes, 0);
}

TEST(NodeFigureSampler, ReadsThisMachine) {
  TempDir work;
  NodeFigureOptions o;
  o.directories = {{DirectoryRole::Checkpoint, work.path()}};
  NodeFigureSampler sampler(o);
  sampler.sample(1.0);
  const NodeFigures& f = sampler.sample(2.0);
  ASSERT_EQ(f.filesystems.size(), 1u);
  EXPECT_TRUE(f.filesystems[0].checkpoints);
  EXPECT_FALSE(f.filesystems[0].mountPoint.empty());
  EXPECT_GT(f.filesystems[0].freeBytes, 0);
  EXPECT_TRUE(f.contextSwitchesPerS);
}

TEST(NodeFigureRecords, LabelledByInterfaceAndMountInEverySink) {
  SampleContext ctx;
  ctx.time = 1700000000.0;
  ctx.runId = "r";
  ctx.node = "node-a";
  NodeSample node;
  node.mem = parseMemInfo("MemTotal: 1000 kB\nMemAvailable: 500 kB\nSwapTotal: 0 kB\n"
                          "SwapFree: 0 kB\n");
  NodeFigures f;
  f.contextSwitchesPerS = 1234.0;
  InterfaceFigures eth;
  eth.name = "eth0";
  eth.collectives = true;
  eth.hasRates = true;
  eth.rxBytesPerS = 1e6;
  eth.rxDropsPerS = 2;
  f.interfaces.push_back(eth);
  FilesystemFigures fs;
  fs.mountPoint = "/scratch";
  fs.checkpoints = true;
  fs.freeBytes = 150;
  fs.totalBytes = 1000;
  f.filesystems.push_back(fs);

  std::vector<Record> records = sampleRecords(ctx, node, {}, {}, {});
  addNodeFigures(records, ctx, f);
  ASSERT_EQ(records.size(), 3u);
  EXPECT_EQ(records[0].field("context_switches_per_s"), 1234.0);
  EXPECT_EQ(records[0].field("swap_total_bytes"), 0.0);
  EXPECT_EQ(records[0].field("swap_used_bytes"), 0.0) << "a swap-free machine reports 0";
  EXPECT_EQ(records[1].interface, "eth0");
  EXPECT_EQ(records[2].mount, "/scratch");
  EXPECT_DOUBLE_EQ(*records[2].field("disk_free_ratio"), 0.15);
  EXPECT_FALSE(records[2].field("disk_read_bytes_per_s")) << "no rate before a second sample";

  // JSONL: the labels are schema keys and read back.
  const std::string line = metrics::toJsonLine(records[1]);
  EXPECT_NE(line.find("\"interface\":\"eth0\""), std::string::npos) << line;
  EXPECT_EQ(metrics::parseJsonLine(line).interface, "eth0");
  EXPECT_EQ(metrics::parseJsonLine(metrics::toJsonLine(records[2])).mount, "/scratch");
  EXPECT_FALSE(metrics::validFieldName("mount"));
  // TensorBoard tags.
  EXPECT_EQ(metrics::tensorBoardTag(records[1], "net_rx_bytes_per_s"),
            "net_rx_bytes_per_s/node-a/eth0");
  EXPECT_EQ(metrics::tensorBoardTag(records[2], "disk_free_ratio"),
            "disk_free_ratio/node-a/fs/scratch");
  // Prometheus labels.
  auto scrape = dtrain::testing::parsePrometheusText(exposition(records, JobState{}));
  EXPECT_EQ(scrape.value("dtrain_net_rx_bytes_per_s", {{"node", "node-a"}, {"interface", "eth0"}}),
            1e6);
  EXPECT_EQ(scrape.value("dtrain_net_collectives", {{"node", "node-a"}, {"interface", "eth0"}}), 1);
  EXPECT_EQ(scrape.value("dtrain_disk_free_ratio", {{"node", "node-a"}, {"mount", "/scratch"}}),
            0.15);
  EXPECT_EQ(scrape.value("dtrain_disk_checkpoints", {{"node", "node-a"}, {"mount", "/scratch"}}),
            1);
  EXPECT_EQ(scrape.value("dtrain_swap_used_bytes", {{"node", "node-a"}}), 0);
  EXPECT_FALSE(scrape.value("dtrain_heartbeat_timeout_seconds")) << "one node: no heartbeats";
  JobState multiNode;
  multiNode.heartbeatTimeout = 30;
  multiNode.heartbeatAge["node-a"] = 2;
  auto master = dtrain::testing::parsePrometheusText(exposition(records, multiNode));
  EXPECT_EQ(master.value("dtrain_heartbeat_timeout_seconds"), 30)
      << "what the heartbeat alert compares each node's age with";
}

// DtrainStalled names the ranks launch's stall report blames: a series per rank launch samples.
TEST(NodeFigureRecords, TheRanksAStallBlamesAreSeriesOfTheirOwn) {
  SampleContext ctx;
  ctx.node = "node-a";
  RankSample r0;
  r0.rank = 0;
  RankSample r1;
  r1.rank = 1;
  auto records = sampleRecords(ctx, NodeSample{}, {r0, r1}, {}, {});
  JobState job;
  job.stalled = true;
  job.stalledRanks = {1};
  auto scrape = dtrain::testing::parsePrometheusText(exposition(records, job));
  EXPECT_EQ(scrape.value("dtrain_rank_stalled", {{"node", "node-a"}, {"rank", "1"}}), 1);
  EXPECT_EQ(scrape.value("dtrain_rank_stalled", {{"node", "node-a"}, {"rank", "0"}}), 0);
  job.stalledRanks.clear();
  scrape = dtrain::testing::parsePrometheusText(exposition(records, job));
  EXPECT_EQ(scrape.value("dtrain_rank_stalled", {{"node", "node-a"}, {"rank", "1"}}), 0);
}

TEST(GpuHealth, NvidiaSmiEccCountsBecomeSeries) {
  auto gpus = parseGpuQueryCsv(readFile(sourceDir() + "/tests/data/nvidia_smi/query_gpu.csv"));
  ASSERT_EQ(gpus.size(), 4u);
  EXPECT_EQ(gpus[1].eccCorrected, 12.0);
  EXPECT_EQ(gpus[2].eccUncorrected, 2.0);
  EXPECT_FALSE(gpus[3].eccCorrected) << "[N/A]: no ECC";
  EXPECT_FALSE(gpus[0].xidEvents) << "nvidia-smi has no XID query";
  SampleContext ctx;
  ctx.node = "n";
  auto records = sampleRecords(ctx, NodeSample{}, {}, gpus, {});
  auto scrape = dtrain::testing::parsePrometheusText(exposition(records, JobState{}));
  EXPECT_EQ(scrape.value("dtrain_gpu_ecc_uncorrected_errors", {{"node", "n"}, {"gpu", "2"}}), 2);
  EXPECT_EQ(scrape.value("dtrain_gpu_ecc_corrected_errors", {{"node", "n"}, {"gpu", "1"}}), 12);
  EXPECT_FALSE(scrape.value("dtrain_gpu_ecc_corrected_errors", {{"node", "n"}, {"gpu", "3"}}));
}

}  // namespace
}  // namespace dtrain::launcher::monitor::launcher_monitor_node_test
