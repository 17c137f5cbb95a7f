// The failure report: how ranks compare notes after a collective fails.
#include <gtest/gtest.h>

#include <thread>

#include "comm_support.h"
#include "dtrain/base/tcp_store.h"
#include "failure_report.h"

namespace dtrain::comm::failure_report_test {
namespace {

RankReport report(int rank, uint64_t seq, std::string collective, std::string error = "") {
  RankReport r;
  r.rank = rank;
  r.reported = true;
  r.seq = seq;
  r.collective = std::move(collective);
  r.error = std::move(error);
  return r;
}

RankReport silent(int rank) {
  RankReport r;
  r.rank = rank;
  return r;
}

struct Case {
  const char* name;
  std::vector<RankReport> reports;
  int me;
  std::vector<std::string> expected;  // substrings of the summary
};

TEST(FailureReport, SummariesNameWhoIsBehindAheadOrSilent) {
  const std::string ar = "allreduce(float32 x 1024, sum)";
  const std::vector<Case> cases = {
      {"peer behind",
       {report(0, 5, ar), report(1, 4, ar)},
       0,
       {"rank 1 is behind at seq 4", "this rank is at seq 5"}},
      {"peer ahead", {report(0, 4, ar), report(1, 5, ar)}, 0, {"rank 1 is ahead at seq 5"}},
      {"mismatch",
       {report(0, 3, ar), report(1, 3, "allreduce(float32 x 1023, sum)")},
       0,
       {"rank 1 calls allreduce(float32 x 1023, sum) at seq 3 where this rank calls " + ar,
        "disagree"}},
      {"silent",
       {report(0, 3, ar), silent(1), silent(2)},
       0,
       {"ranks 1, 2 did not report within 500 ms"}},
      {"same collective", {report(0, 3, ar), report(1, 3, ar)}, 1, {"rank 0 reached the same"}},
      {"root cause from a peer",
       {report(0, 3, ar, "connection closed by rank 2 (127.0.0.1:4000)"), report(1, 3, ar),
        silent(2)},
       1,
       {"rank 2 did not report", "rank 0 reported: connection closed by rank 2"}},
  };
  for (const auto& c : cases) {
    std::string summary = summarizeReports(c.reports, c.reports[c.me], Millis(500));
    for (const std::string& part : c.expected) {
      EXPECT_NE(summary.find(part), std::string::npos)
          << c.name << ": \"" << part << "\" missing from: " << summary;
    }
  }
}

TEST(FailureReport, ExchangeCollectsWhatArrivesWithinTheGrace) {
  auto store = std::make_shared<store::HashStore>();
  std::vector<RankReport> seen;
  std::thread late([&] {
    std::this_thread::sleep_for(Millis(50));
    exchangeReports(*store, "f", 3, report(1, 9, "barrier()", "boom"), Millis(10));
  });
  auto start = std::chrono::steady_clock::now();
  seen = exchangeReports(*store, "f", 3, report(0, 9, "barrier()"), Millis(400));
  double ms = testing::elapsedMs(start);
  late.join();
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_TRUE(seen[1].reported);
  EXPECT_EQ(seen[1].error, "boom");
  EXPECT_EQ(seen[1].seq, 9u);
  EXPECT_FALSE(seen[2].reported);
  EXPECT_GE(ms, 390) << "waited the whole grace for rank 2";
  EXPECT_LT(ms, 2000);
}

// Note [Store calls with a deadline]: the rank that hosted the store has gone too (the server
// stopped after this rank's report was stored). Polling for the others reconnects, which alone
// may take the client's connectTimeout (60 s); the exchange ends within its grace plus a second
// instead, with what it knows, and the deadline ends with it.
TEST(FailureReport, ExchangeEndsWithinTheGraceWhenTheStoreIsGone) {
  auto server = store::TcpStoreServer::start({});
  store::TcpStoreOptions options;
  options.port = server->port();
  store::TcpStore store(options);
  std::thread stopper([&] {
    std::this_thread::sleep_for(Millis(100));
    server->stop();
  });
  auto start = std::chrono::steady_clock::now();
  auto seen = exchangeReports(store, "f", 3, report(0, 9, "barrier()"), Millis(400));
  const double ms = testing::elapsedMs(start);
  stopper.join();
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_TRUE(seen[0].reported);
  EXPECT_FALSE(seen[1].reported);
  EXPECT_FALSE(seen[2].reported);
  EXPECT_LT(ms, 5000) << "the reconnect to the stopped store was not bounded by the grace";
  EXPECT_FALSE(store::ScopedStoreDeadline::current().has_value());
}

TEST(FailureReport, GraceKeepsFailuresWithinTimeoutPlusTwoSeconds) {
  EXPECT_EQ(reportGrace(Millis(3000)), Millis(1000));
  EXPECT_EQ(reportGrace(Millis(300000)), Millis(1000));
  EXPECT_EQ(reportGrace(Millis(300)), Millis(200));
}

}  // namespace
}  // namespace dtrain::comm::failure_report_test
