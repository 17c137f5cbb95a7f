// Worker output through launch (docs/reliability.md L15): whole prefixed lines under a flood, log
// files and their layout across attempts, rotation, --redirects / --tee / --local-ranks-filter
// with torchrun's meaning, the prefix template.
#include <sys/stat.h>

#include <filesystem>
#include <map>
#include <regex>
#include <sstream>

#include <gtest/gtest.h>

#include "launcher_support.h"
#include "test_support.h"

namespace dtrain::testing::launcher_output_test {
namespace {

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

int64_t sizeOf(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? st.st_size : -1;
}

// Every console line of a worker is "<prefix><whole line>": count the flood lines per rank and
// stream, and fail on any line that is not whole.
void checkFloodLines(const std::string& text, const char* stream, int ranks, int lines) {
  static const std::regex kLine(
      R"(^\[rank (\d+)\]: rank (\d+) flood (out|err) (\d+) \.{150} end$)");
  std::map<int, int> perRank;
  std::istringstream in(text);
  std::string line;
  int broken = 0;
  while (std::getline(in, line)) {
    if (line.find(" flood ") == std::string::npos) continue;
    std::smatch m;
    if (!std::regex_match(line, m, kLine) || m[1] != m[2] || m[3] != stream) {
      if (++broken <= 3) ADD_FAILURE() << "not a whole prefixed line: " << line.substr(0, 300);
      continue;
    }
    ++perRank[std::stoi(m[1])];
  }
  EXPECT_EQ(broken, 0);
  for (int r = 0; r < ranks; ++r) EXPECT_EQ(perRank[r], lines) << stream << " of rank " << r;
}

// L15: four workers flood both streams with lines written in pieces; nothing deadlocks, every line
// arrives whole and once, logs rotate at their size limit.
TEST(LaunchOutput, FloodArrivesAsWholeLinesWithoutDeadlock) {
  TempDir logs;
  constexpr int kLines = 20000;  // x ~180 bytes x 2 streams x 4 workers: ~29 MB
  LaunchResult r = runLaunch(launchArgs({"--nproc-per-node", "4", "--log-dir", logs.path(),
                                         "--run-id", "flood", "--log-max-bytes", "1M"},
                                        {"--steps", "1"}),
                             {"DTRAIN_FAULT=flood:" + std::to_string(kLines) + "@step=0"}, 60);
  ASSERT_FALSE(r.timedOut) << "deadlock? " << r.err.substr(0, 2000);
  EXPECT_EQ(r.exitCode, 0) << r.err.substr(r.err.size() > 2000 ? r.err.size() - 2000 : 0);
  checkFloodLines(r.out, "out", 4, kLines);
  checkFloodLines(r.err, "err", 4, kLines);
  for (int rank = 0; rank < 4; ++rank) {
    std::string dir = logs.path() + "/flood/attempt_0/rank_" + std::to_string(rank);
    for (const char* stream : {"stdout.log", "stderr.log"}) {
      EXPECT_LE(sizeOf(dir + "/" + stream), 1 << 20) << dir << "/" << stream;
      EXPECT_GT(sizeOf(dir + "/" + stream + ".1"), 0) << "rotated copy of " << stream;
      EXPECT_LE(sizeOf(dir + "/" + stream + ".1"), 1 << 20);
    }
  }
  expectNoneLeft(r.out);
}

// --log-dir: DIR/<run-id>/attempt_<k>/rank_<N>/{stdout,stderr}.log, kept across attempts, raw
// (no console prefix); the report points at the root cause's stderr log.
TEST(LaunchOutput, LogDirLayoutKeptAcrossAttempts) {
  TempDir logs;
  LaunchResult r = runLaunch(launchArgs({"--nproc-per-node", "2", "--log-dir", logs.path(),
                                         "--run-id", "job7", "--max-restarts", "1"},
                                        {"--steps", "50", "--step-ms", "20"}),
                             {"DTRAIN_FAULT=exit:9@rank=1,step=5"});
  EXPECT_EQ(r.exitCode, 9) << r.all();
  for (int attempt : {0, 1}) {
    for (int rank : {0, 1}) {
      std::string dir = logs.path() + "/job7/attempt_" + std::to_string(attempt) + "/rank_" +
                        std::to_string(rank);
      EXPECT_TRUE(exists(dir + "/stdout.log")) << dir;
      EXPECT_TRUE(exists(dir + "/stderr.log")) << dir;
      std::string out = readFile(dir + "/stdout.log");
      EXPECT_EQ(out.rfind("worker rank=" + std::to_string(rank) + " ", 0), 0u)
          << "raw, unprefixed: " << out;
    }
  }
  std::string stderrLog = logs.path() + "/job7/attempt_1/rank_1/stderr.log";
  EXPECT_NE(r.err.find("stderr log:  " + stderrLog), std::string::npos) << r.err;
}

// --redirects sends a stream to its log file only (torchrun writes those to a temporary
// directory when no --log-dir is given); --tee keeps the console too.
TEST(LaunchOutput, RedirectsAndTee) {
  TempDir logs;
  const std::vector<std::string> prog = {"/bin/sh", "-c", "echo out-$RANK; echo err-$RANK >&2"};
  std::vector<std::string> args = {"--nproc-per-node", "2",         "--redirects", "0:1,1:3",
                                   "--log-dir",        logs.path(), "--run-id",    "rd"};
  args.insert(args.end(), prog.begin(), prog.end());
  LaunchResult r = runLaunch(args);
  ASSERT_EQ(r.exitCode, 0) << r.all();
  EXPECT_EQ(r.out.find("out-0"), std::string::npos) << "rank 0 stdout redirected: " << r.out;
  EXPECT_NE(r.err.find("[rank 0]: err-0"), std::string::npos) << r.err;
  EXPECT_EQ(r.all().find("-1"), std::string::npos) << "rank 1 fully redirected: " << r.all();
  EXPECT_EQ(readFile(logs.path() + "/rd/attempt_0/rank_0/stdout.log"), "out-0\n");
  EXPECT_EQ(readFile(logs.path() + "/rd/attempt_0/rank_1/stderr.log"), "err-1\n");

  std::vector<std::string> teeArgs = {"--nproc-per-node", "2", "--tee", "3", "--run-id", "tee"};
  teeArgs.insert(teeArgs.end(), prog.begin(), prog.end());
  LaunchResult t = runLaunch(teeArgs);
  ASSERT_EQ(t.exitCode, 0) << t.all();
  EXPECT_NE(t.out.find("[rank 1]: out-1"), std::string::npos) << t.out;
  std::smatch m;
  ASSERT_TRUE(
      std::regex_search(t.err, m, std::regex("worker logs \\(--redirects/--tee\\) are in (\\S+)")))
      << t.err;
  const std::string dir = m[1].str();
  EXPECT_EQ(readFile(dir + "/attempt_0/rank_1/stdout.log"), "out-1\n");
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

// --local-ranks-filter shows only those ranks; the template sets the prefix.
TEST(LaunchOutput, RanksFilterAndPrefixTemplate) {
  LaunchResult r = runLaunch({"--nproc-per-node", "3", "--local-ranks-filter", "0,2",
                              "--log-line-prefix-template", "<${role_name}:${rank}/${local_rank}> ",
                              "--role", "trainer", "/bin/sh", "-c", "echo hello-$RANK"});
  ASSERT_EQ(r.exitCode, 0) << r.all();
  EXPECT_NE(r.out.find("<trainer:0/0> hello-0\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("<trainer:2/2> hello-2\n"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("hello-1"), std::string::npos) << r.out;
}

// A last line without a newline still arrives, whole, with its prefix.
TEST(LaunchOutput, UnterminatedLastLine) {
  LaunchResult r = runLaunch({"/bin/sh", "-c", "printf 'partial'; printf 'tail' >&2; exit 3"});
  EXPECT_EQ(r.exitCode, 3) << r.all();
  EXPECT_EQ(r.out, "[rank 0]: partial\n");
  EXPECT_NE(r.err.find("[rank 0]: tail\n"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("      | tail"), std::string::npos)
      << "in the report's stderr tail: " << r.err;
}

}  // namespace
}  // namespace dtrain::testing::launcher_output_test
