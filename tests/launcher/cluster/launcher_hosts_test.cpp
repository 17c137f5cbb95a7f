// Host lists (hostfile, --hosts, --include/--exclude, Slurm node lists) and the scheduler
// variables (SLURM_*, PET_*): tables of good and bad inputs.
#include <gtest/gtest.h>

#include "dtrain/base/error.h"
#include "launcher/config/hosts.h"
#include "launcher/config/scheduler_env.h"

namespace dtrain::launcher::launcher_hosts_test {
namespace {

std::string messageOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Hostfile, DeepSpeedAndMpiLines) {
  auto hosts = parseHostfile("# the cluster\nworker-0 slots=4\n\n  worker-1   slots=2 # gpu box\n"
                             "10.0.0.9\nnode7 slots=8 max_slots=8\r\n",
                             "hostfile h");
  ASSERT_EQ(hosts.size(), 4u);
  EXPECT_EQ(hosts[0], (HostEntry{"worker-0", 4, {}}));
  EXPECT_EQ(hosts[1], (HostEntry{"worker-1", 2, {}}));
  EXPECT_EQ(hosts[2], (HostEntry{"10.0.0.9", 0, {}}));
  EXPECT_EQ(hosts[3], (HostEntry{"node7", 8, {}}));
}

TEST(Hostfile, DuplicateNamesBothLines) {
  std::string m = messageOf([] { parseHostfile("a slots=1\nb\n# x\na slots=2\n", "hostfile h"); });
  EXPECT_NE(m.find("hostfile h line 4"), std::string::npos) << m;
  EXPECT_NE(m.find("first on line 1"), std::string::npos) << m;
}

TEST(Hostfile, BadLinesNamed) {
  const std::pair<const char*, const char*> kBad[] = {
      {"a slots=0", "line 1"},         {"a\nb slots=x", "line 2"},
      {"a gpus=2", "unknown field"},   {"-oProxyCommand=x", "not a host"},
      {"a;b", "not a host"},           {"", "lists no host"},
      {"# only\n\n", "lists no host"}, {"a slots=5000", "1..4096"},
  };
  for (const auto& [text, want] : kBad) {
    std::string m = messageOf([&] { parseHostfile(text, "hostfile h"); });
    EXPECT_NE(m.find(want), std::string::npos) << text << " -> " << m;
  }
}

TEST(HostsOption, NamesAndSlots) {
  auto h = parseHostsOption("a,b", "--hosts");
  EXPECT_EQ(h, (std::vector<HostEntry>{{"a", 0, {}}, {"b", 0, {}}}));
  h = parseHostsOption("a:4,10.1.0.2:2,[fe80::1]:3,[::1]", "--hosts");
  EXPECT_EQ(h, (std::vector<HostEntry>{
                   {"a", 4, {}}, {"10.1.0.2", 2, {}}, {"fe80::1", 3, {}}, {"::1", 0, {}}}));
  for (const char* bad : {"", "a,", "a,a", "a:0", "a:x", "a:", "a b", "[::1", "-x"}) {
    EXPECT_THROW(parseHostsOption(bad, "--hosts"), InvalidArgument) << bad;
  }
}

TEST(HostFilter, DeepSpeedSyntax) {
  auto t = parseHostFilter("worker-0@worker-1:0,2", "--include");
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].host, "worker-0");
  EXPECT_TRUE(t[0].slots.empty());
  EXPECT_EQ(t[1].slots, (std::vector<int>{0, 2}));
  for (const char* bad : {"", "a@", "a:", "a:x", "a:1,1", "a@a", "a:-1"}) {
    EXPECT_THROW(parseHostFilter(bad, "--include"), InvalidArgument) << bad;
  }
}

TEST(HostFilter, IncludeExcludeRules) {
  const std::vector<HostEntry> hosts{{"a", 4, {}}, {"b", 4, {}}, {"c", 0, {}}};
  auto inc = [](const char* s) { return parseHostFilter(s, "--include"); };
  auto exc = [](const char* s) { return parseHostFilter(s, "--exclude"); };
  // --include keeps the list's order and narrows slots.
  auto r = applyHostFilters(hosts, inc("c@a:1,3"), {}, 2, "--include", "--exclude");
  EXPECT_EQ(r, (std::vector<HostEntry>{{"a", 4, {1, 3}}, {"c", 0, {}}}));
  // --exclude drops a host, or slots of one (default slots for a host without slots=N).
  r = applyHostFilters(hosts, {}, exc("b@c:0"), 2, "--include", "--exclude");
  EXPECT_EQ(r, (std::vector<HostEntry>{{"a", 4, {}}, {"c", 0, {1}}}));
  r = applyHostFilters(hosts, inc("a:0,1,2"), exc("a:1"), 2, "--include", "--exclude");
  EXPECT_EQ(r, (std::vector<HostEntry>{{"a", 4, {0, 2}}}));
  const std::pair<const char*, const char*> kBad[] = {{"x", "not in the host list"},
                                                      {"a:4", "slots 0..3, not 4"}};
  for (const auto& [text, want] : kBad) {
    std::string m = messageOf(
        [&] { applyHostFilters(hosts, inc(text), {}, 2, "--include", "--exclude"); });
    EXPECT_NE(m.find(want), std::string::npos) << m;
  }
  std::string m = messageOf(
      [&] { applyHostFilters(hosts, {}, exc("a@b@c"), 2, "--include", "--exclude"); });
  EXPECT_NE(m.find("leaves no host"), std::string::npos) << m;
  m = messageOf([&] { applyHostFilters(hosts, {}, exc("c:0,1"), 2, "--include", "--exclude"); });
  EXPECT_NE(m.find("every slot of host c"), std::string::npos) << m;
}

TEST(SlurmNodelist, BracketExpansion) {
  using V = std::vector<std::string>;
  const std::pair<const char*, V> kGood[] = {
      {"gpu[01-04,07]", {"gpu01", "gpu02", "gpu03", "gpu04", "gpu07"}},
      {"node1", {"node1"}},
      {"a,b[1-2],c", {"a", "b1", "b2", "c"}},
      {"r[1-2]-n[08-10]", {"r1-n08", "r1-n09", "r1-n10", "r2-n08", "r2-n09", "r2-n10"}},
      {"x[9-11]", {"x9", "x10", "x11"}},
      {"login[007]", {"login007"}},
  };
  for (const auto& [text, want] : kGood) EXPECT_EQ(expandSlurmNodelist(text, "L"), want) << text;
  for (const char* bad : {"gpu[01-04", "gpu]", "gpu[4-1]", "gpu[a-b]", "gpu[]", "a,,b", "g[[1]]"}) {
    EXPECT_THROW(expandSlurmNodelist(bad, "L"), InvalidArgument) << bad;
  }
}

std::map<std::string, std::string> settingsMap(const std::map<std::string, std::string>& env) {
  std::map<std::string, std::string> out;
  for (const auto& s : schedulerSettings(env)) out[s.option] = s.value;
  return out;
}

TEST(SchedulerEnv, Slurm) {
  auto m = settingsMap(
      {{"SLURM_JOB_NODELIST", "gpu[01-02]"}, {"SLURM_NNODES", "2"}, {"SLURM_NODEID", "1"}});
  EXPECT_EQ(m, (std::map<std::string, std::string>{
                   {"nnodes", "2"}, {"node-rank", "1"}, {"rdzv-endpoint", "gpu01"}}));
  // One node: nothing to do.
  EXPECT_TRUE(
      settingsMap({{"SLURM_JOB_NODELIST", "gpu01"}, {"SLURM_NNODES", "1"}, {"SLURM_NODEID", "0"}})
          .empty());
  EXPECT_THROW(
      schedulerSettings(
          {{"SLURM_JOB_NODELIST", "gpu[01-03]"}, {"SLURM_NNODES", "2"}, {"SLURM_NODEID", "0"}}),
      InvalidArgument);
  EXPECT_THROW(
      schedulerSettings(
          {{"SLURM_JOB_NODELIST", "gpu[01-02]"}, {"SLURM_NNODES", "2"}, {"SLURM_NODEID", "2"}}),
      InvalidArgument);
}

TEST(SchedulerEnv, KubernetesPet) {
  auto m = settingsMap({{"PET_NNODES", "3"},
                        {"PET_NODE_RANK", "2"},
                        {"PET_NPROC_PER_NODE", "4"},
                        {"PET_MASTER_ADDR", "job-master-0"},
                        {"PET_MASTER_PORT", "23456"},
                        {"SLURM_NNODES", "9"}});
  EXPECT_EQ(m, (std::map<std::string, std::string>{{"nnodes", "3"},
                                                   {"node-rank", "2"},
                                                   {"nproc-per-node", "4"},
                                                   {"master-port", "23456"},
                                                   {"rdzv-endpoint", "job-master-0"}}));
  m = settingsMap({{"PET_NNODES", "1:4"},
                   {"PET_RDZV_ENDPOINT", "10.0.0.1:29400"},
                   {"PET_MASTER_ADDR", "ignored"}});
  EXPECT_EQ(m["rdzv-endpoint"], "10.0.0.1:29400");
  EXPECT_TRUE(settingsMap({{"PATH", "/bin"}}).empty());
}

}  // namespace
}  // namespace dtrain::launcher::launcher_hosts_test
