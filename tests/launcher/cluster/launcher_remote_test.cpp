// Remote command lines (quoting checked by real shells), the ssh argv, the agent plan's
// encoding, the forwarded environment, the NCCL variables, and a session's process (stdin, end).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "dtrain/base/error.h"
#include "launcher/cluster/plan/forwarded_env.h"
#include "launcher/cluster/remote/remote_command.h"
#include "launcher/cluster/remote/session.h"
#include "launcher/node/nccl_env.h"
#include "test_support.h"

namespace dtrain::launcher::launcher_remote_test {
namespace {

// Arguments that break naive remote command lines (BashFAQ/096; DeepSpeed's issues with quotes).
const std::vector<std::string>& argumentCorpus() {
  static const std::vector<std::string> kCorpus = {
      "plain",
      "with space",
      "it's",
      "say \"hi\"",
      "$(id)",
      "`id`",
      "a;b",
      "x && y",
      "*",
      "~",
      "line1\nline2",
      "",
      "-leading-dash",
      "--lr=0.1",
      "caf\xc3\xa9",
      "\xff\xfe raw bytes",
      "back\\slash",
      "$HOME",
      "'",
      "''",
      "tab\there",
      "!event",
      "#hash",
      "{a,b}",
      "a|b",
      ">out",
  };
  return kCorpus;
}

// Runs `shell -c COMMAND` and returns the words the command printed, each ended by `separator`.
std::vector<std::string> runShell(const std::string& shell, const std::string& command,
                                  char separator = '\0') {
  int fds[2];
  EXPECT_EQ(::pipe(fds), 0);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(fds[1], 1);
    ::close(fds[0]);
    ::close(fds[1]);
    ::execl(shell.c_str(), shell.c_str(), "-c", command.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(fds[1]);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << shell << ": " << status;
  std::vector<std::string> words;
  size_t start = 0;
  for (size_t nul = out.find(separator); nul != std::string::npos;
       nul = out.find(separator, start)) {
    words.push_back(out.substr(start, nul - start));
    start = nul + 1;
  }
  return words;
}

// The login shells a remote user may have; the ones not installed here are skipped.
const std::vector<std::string>& loginShells() {
  static const std::vector<std::string> kShells = {"/bin/sh", "/bin/bash", "/bin/dash", "/bin/tcsh",
                                                   "/usr/bin/fish"};
  return kShells;
}

// Whatever the user's login shell: ssh hands it the command as `$SHELL -c COMMAND`.
TEST(RemoteCommand, EveryWordArrivesByteIdenticalUnderEveryLoginShell) {
  std::vector<std::string> plain;  // what the readable form carries
  for (const auto& a : argumentCorpus()) {
    if (a.find_first_of("\\\n!") == std::string::npos) plain.push_back(a);
  }
  ASSERT_LT(plain.size(), argumentCorpus().size());
  int shells = 0;
  for (bool readable : {true, false}) {
    const std::vector<std::string>& words = readable ? plain : argumentCorpus();
    // Each word ended by byte 1 (a format with \000 would hold a backslash itself).
    std::vector<std::string> argv{"/usr/bin/printf", "%s\x01"};
    argv.insert(argv.end(), words.begin(), words.end());
    const std::string command = remote::remoteShellCommand("/", argv);
    // Readable when it can be: the words themselves, not their encoding, show in `ps`.
    EXPECT_EQ(command.rfind(readable ? "exec sh -c 'cd '\"'\"'/'\"'\"' " : "exec sh -c 'c=", 0), 0u)
        << command;
    for (const auto& shell : loginShells()) {
      if (::access(shell.c_str(), X_OK) != 0) continue;
      ++shells;
      EXPECT_EQ(runShell(shell, command, '\x01'), words) << shell << ": " << command;
    }
  }
  EXPECT_GE(shells, 2);
}

TEST(RemoteCommand, QuotesAlwaysAndMissingDirectoryExits125UnderEveryLoginShell) {
  EXPECT_EQ(remote::singleQuote("a"), "'a'");
  EXPECT_EQ(remote::singleQuote(""), "''");
  EXPECT_EQ(remote::singleQuote("it's"), "'it'\"'\"'s'");
  for (const char* dir : {"/no/such dir", "/no/such\\dir!"}) {
    const std::string cmd = remote::remoteShellCommand(dir, {"/bin/true"});
    for (const auto& shell : loginShells()) {
      if (::access(shell.c_str(), X_OK) != 0) continue;
      int status = std::system(
          (shell + " -c " + remote::singleQuote(cmd) + " 2>/dev/null").c_str());
      EXPECT_EQ(WEXITSTATUS(status), 125) << shell << ": " << cmd;
    }
  }
}

TEST(RemoteCommand, Base64FollowsRfc4648) {
  const std::pair<const char*, const char*> kVectors[] = {{"", ""},
                                                          {"f", "Zg=="},
                                                          {"fo", "Zm8="},
                                                          {"foo", "Zm9v"},
                                                          {"foob", "Zm9vYg=="},
                                                          {"fooba", "Zm9vYmE="},
                                                          {"foobar", "Zm9vYmFy"}};
  for (const auto& [in, out] : kVectors) EXPECT_EQ(remote::base64(in), out) << in;
  EXPECT_EQ(remote::base64(std::string("\xff\xfe\x00", 3)), "//4A");
}

TEST(SshArgv, OptionsInOrder) {
  remote::SshOptions o;
  EXPECT_EQ(remote::sshArgv(o, "node1", "exec 'x'"),
            (std::vector<std::string>{"ssh", "-T", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10",
                                      "--", "node1", "exec 'x'"}));
  o.port = 2222;
  o.identity = "/k/id";
  o.configFile = "/k/cfg";
  o.options = {"ServerAliveInterval=1", "User=bob"};
  o.connectTimeout = 2.5;
  o.acceptNewHostKeys = true;
  EXPECT_EQ(remote::sshArgv(o, "10.9.0.2", "c"),
            (std::vector<std::string>{"ssh", "-T",
                                      "-o",  "ServerAliveInterval=1",
                                      "-o",  "User=bob",
                                      "-o",  "BatchMode=yes",
                                      "-o",  "ConnectTimeout=3",
                                      "-o",  "StrictHostKeyChecking=accept-new",
                                      "-p",  "2222",
                                      "-i",  "/k/id",
                                      "-F",  "/k/cfg",
                                      "--",  "10.9.0.2",
                                      "c"}));
}

TEST(SshArgv, FailureHints) {
  remote::SshOptions o;
  EXPECT_NE(remote::sshFailureHint("n1", "Host key verification failed.\r\n", o)
                .find("ssh-keyscan -H n1"),
            std::string::npos);
  EXPECT_NE(remote::sshFailureHint("n1", "Host key verification failed.", o)
                .find("--ssh-accept-new-host-keys"),
            std::string::npos);
  EXPECT_NE(
      remote::sshFailureHint("n1", "bob@n1: Permission denied (publickey).", o).find("ssh-copy-id"),
      std::string::npos);
  EXPECT_NE(remote::sshFailureHint("n1", "ssh: connect to host n1 port 22: Connection timed out", o)
                .find("port 22"),
            std::string::npos);
  EXPECT_EQ(remote::sshFailureHint("n1", "something else", o), "");
}

TEST(AgentPlan, RoundTripsAnyBytes) {
  remote::Records r{{"token", std::string(64, 'f')},
                    {"env", std::string("A=1\nB=\0x\n", 10)},
                    {"arg", "\xff\xfe\n\nend 0\n\n"},
                    {"empty", ""}};
  const std::string text = remote::encodePlan(r);
  EXPECT_EQ(remote::decodePlan(text), r);
  EXPECT_EQ(remote::planEnd(text), text.size());
  EXPECT_EQ(remote::planEnd(text + "more"), text.size());
  for (size_t cut = 0; cut < text.size(); ++cut) {
    EXPECT_EQ(remote::planEnd(text.substr(0, cut)), std::string::npos) << cut;
  }
  for (const std::string& bad : {std::string("nope"), text.substr(0, text.size() / 2),
                                 std::string("dtrain-agent-plan 1\nx 99999999999\n"),
                                 std::string("dtrain-agent-plan 2\nend 0\n\n")}) {
    EXPECT_THROW(remote::decodePlan(bad), InvalidArgument) << bad;
  }
}

TEST(ForwardedEnv, DesignListDotEnvAndEnvOption) {
  EnvMap inherited{{"PATH", "/p"},
                   {"LD_LIBRARY_PATH", "/l"},
                   {"PYTHONPATH", "/py"},
                   {"NCCL_IB_HCA", "mlx5"},
                   {"GLOO_X", "g"},
                   {"TORCH_SHOW_CPP_STACKTRACES", "1"},
                   {"DTRAIN_VERBOSE", "2"},
                   {"DTRAIN_FAULT", "f"},
                   {"HOME", "/root"},
                   {"DTRAIN_LAUNCH_NNODES", "2"},
                   {"DTRAIN_STORE_TOKEN", "secret"},
                   {"SSH_AUTH_SOCK", "/s"},
                   {"NCCL_DEBUG", "WARN"}};
  auto dot = parseDotEnv("# comment\n\nexport NCCL_DEBUG=INFO\nFOO=a=b c\r\n", ".dtrain_env");
  EnvMap f = forwardedEnvironment(inherited, dot, {{"FOO", "from --env"}, {"BAR", ""}});
  EXPECT_EQ(f, (EnvMap{{"PATH", "/p"},
                       {"LD_LIBRARY_PATH", "/l"},
                       {"PYTHONPATH", "/py"},
                       {"NCCL_IB_HCA", "mlx5"},
                       {"GLOO_X", "g"},
                       {"TORCH_SHOW_CPP_STACKTRACES", "1"},
                       {"DTRAIN_VERBOSE", "2"},
                       {"DTRAIN_FAULT", "f"},
                       {"NCCL_DEBUG", "INFO"},
                       {"FOO", "from --env"},
                       {"BAR", ""}}));
  for (const char* bad :
       {"FOO", "1X=2", "RANK=3", "DTRAIN_STORE_TOKEN=x", "DTRAIN_LAUNCH_NNODES=2", "A B=1"}) {
    EXPECT_THROW(parseDotEnv(bad, ".dtrain_env"), InvalidArgument) << bad;
  }
  try {
    parseDotEnv("A=1\n\nbad line\n", ".dtrain_env");
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(".dtrain_env line 3"), std::string::npos) << e.what();
  }
}

TEST(NcclEnv, InterfaceRule) {
  NcclOptions o;
  // The store's node uses the interface that owns the store's address; the others the route's.
  auto c = pickSocketInterface(o, true, "10.9.0.1", "veth0", "", "", "--nccl-socket-ifname");
  EXPECT_EQ(c.name, "veth0");
  c = pickSocketInterface(o, true, "10.9.0.1", "", "eth1", "10.9.0.2", "--nccl-socket-ifname");
  EXPECT_EQ(c.name, "eth1");
  EXPECT_EQ(c.address, "10.9.0.2");
  // One node: NCCL's own choice.
  EXPECT_EQ(pickSocketInterface(o, false, "127.0.0.1", "lo", "", "", "x").name, "");
  // Never loopback for a multi-node job -- unless every node is this machine (store on loopback).
  EXPECT_EQ(pickSocketInterface(o, true, "127.0.0.1", "lo", "", "", "x").name, "");
  EXPECT_THROW(pickSocketInterface(o, true, "10.9.0.1", "", "lo", "127.0.0.1", "x"),
               InvalidArgument);
  o.socketIfname = "ib0";
  EXPECT_EQ(pickSocketInterface(o, true, "10.9.0.1", "", "eth1", "", "x").name, "ib0");
}

TEST(NcclEnv, UserSettingsWin) {
  NcclOptions o;
  o.ibDisable = true;
  o.debug = "INFO";
  o.debugSubsys = "INIT,NET";
  InterfaceChoice eth{"eth1", "10.0.0.2", ""};
  EXPECT_EQ(ncclEnvironment(o, eth, {}), (EnvMap{{"NCCL_SOCKET_IFNAME", "eth1"},
                                                 {"GLOO_SOCKET_IFNAME", "eth1"},
                                                 {"NCCL_IB_DISABLE", "1"},
                                                 {"NCCL_DEBUG", "INFO"},
                                                 {"NCCL_DEBUG_SUBSYS", "INIT,NET"}}));
  EXPECT_EQ(ncclEnvironment(o, eth, {{"NCCL_DEBUG", "WARN"}, {"NCCL_SOCKET_IFNAME", "ib0"}}),
            (EnvMap{{"GLOO_SOCKET_IFNAME", "eth1"},
                    {"NCCL_IB_DISABLE", "1"},
                    {"NCCL_DEBUG_SUBSYS", "INIT,NET"}}));
  // NCCL's list syntax is not for Gloo.
  EXPECT_EQ(ncclEnvironment(NcclOptions{}, InterfaceChoice{"^docker,lo", "", ""}, {}),
            (EnvMap{{"NCCL_SOCKET_IFNAME", "^docker,lo"}}));
  EXPECT_TRUE(ncclEnvironment(NcclOptions{}, InterfaceChoice{}, {}).empty());
}

TEST(Session, WritesThePlanOnStdinAndPassesWholeLines) {
  const std::string plan = remote::encodePlan({{"env", "A=it's\nmultiline"}, {"token", "t"}});
  remote::Session s("0", "h0", {"/bin/sh", "-c", "exec /bin/cat"}, {}, plan,
                    /*captureStdout=*/true);
  s.finish(5);
  EXPECT_EQ(s.describeExit(), "exited with code 0");
  std::string got;
  for (const auto& line : s.stdoutLines()) got += line + "\n";
  EXPECT_EQ(got, plan);
}

TEST(Session, PlanThatDoesNotFitIsRefusedBeforeAnythingStarts) {
  dtrain::testing::TempDir dir;
  const std::string mark = dir.file("started");
  try {
    remote::Session s("1", "gpu7", {"/bin/sh", "-c", "/usr/bin/touch " + mark}, {},
                      std::string(4 << 20, 'x'));
    FAIL() << "a 4 MiB plan was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the agent plan for gpu7 (4194304 bytes) does not fit"),
              std::string::npos)
        << e.what();
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_NE(::access(mark.c_str(), F_OK), 0) << "the session's command ran";
}

TEST(Session, FinishEndsASessionThatIgnoresSigterm) {
  // The session ignores SIGTERM and never reads its stdin's end: SIGKILL after two graces.
  remote::Session s("0", "h0", {"/bin/sh", "-c", "trap '' TERM; while :; do /bin/sleep 0.05; done"},
                    {}, "");
  const auto start = std::chrono::steady_clock::now();
  s.finish(0.3);
  EXPECT_TRUE(s.exited());
  EXPECT_EQ(s.describeExit(), "was killed by SIGKILL");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

}  // namespace
}  // namespace dtrain::launcher::launcher_remote_test
