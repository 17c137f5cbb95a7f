// TcpStore and TcpStoreServer beyond the conformance suite: binding (B9), connect errors (B1),
// wait-then-reuse (B12), EINTR (B13), server stop (B14), limits, 1,000 connections, job store.
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <cstdlib>
#include <thread>

#include <gtest/gtest.h>

#include "dtrain/error.h"
#include "dtrain/job_store.h"
#include "dtrain/tcp_store.h"
#include "store/wire.h"
#include "store_test_support.h"

namespace dtrain::store {
namespace {

using namespace testing;
using std::chrono::milliseconds;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// A port nobody listens on (bound, then released).
uint16_t freePort() {
  auto server = TcpStoreServer::start(serverOptions());
  uint16_t port = server->port();
  server->stop();
  return port;
}

TEST(TcpStoreServer, ReportsThePortItBoundAndBindsOnlyThatAddress) {
  auto server = TcpStoreServer::start(serverOptions());
  EXPECT_NE(server->port(), 0);
  EXPECT_EQ(server->host(), "127.0.0.1");
  TcpStore client(clientOptions(*server));
  client.setString("k", "v");
  EXPECT_EQ(client.describe(), "127.0.0.1:" + std::to_string(server->port()));
  // 127.0.0.2 is loopback too, but not the address the server was given.
  TcpStoreOptions other = clientOptions(*server);
  other.host = "127.0.0.2";
  other.connectTimeout = Millis(200);
  EXPECT_THROW(TcpStore{other}, NetworkError);
}

TEST(TcpStoreServer, ABusyPortIsAnErrorNamingAddressAndPortNeverAClient) {
  auto first = TcpStoreServer::start(serverOptions());
  TcpStoreServerOptions o = serverOptions();
  o.port = first->port();
  try {
    TcpStoreServer::start(o);
    FAIL() << "a second server bound port " << o.port;
  } catch (const NetworkError& e) {
    std::string what = e.what();
    EXPECT_TRUE(contains(what, "127.0.0.1:" + std::to_string(o.port))) << what;
    EXPECT_TRUE(contains(what, "EADDRINUSE")) << what;
    EXPECT_TRUE(contains(what, "HINT: another job uses this port?")) << what;
  }
  // The first server is unaffected.
  TcpStore client(clientOptions(*first));
  EXPECT_EQ(client.add("n", 1), 1);
}

TEST(TcpStoreServer, AnAddressOfAnotherHostIsRefused) {
  TcpStoreServerOptions o = serverOptions();
  o.host = "192.0.2.1";  // TEST-NET-1: never an address of this machine
  o.token = "secret";    // off loopback a token is needed before binding is even tried
  try {
    TcpStoreServer::start(o);
    FAIL() << "bound " << o.host;
  } catch (const NetworkError& e) {
    EXPECT_TRUE(contains(e.what(), "192.0.2.1")) << e.what();
    EXPECT_TRUE(contains(e.what(), "HINT")) << e.what();
  }
}

TEST(TcpStoreServer, OffLoopbackItNeedsATokenOrAnExplicitOptIn) {  // F7
  TcpStoreServerOptions o = serverOptions();
  o.host = "0.0.0.0";
  try {
    TcpStoreServer::start(o);
    FAIL() << "served every interface without a token";
  } catch (const InvalidArgument& e) {
    EXPECT_TRUE(contains(e.what(), "without a job token")) << e.what();
  }
  o.token = "secret";
  auto withToken = TcpStoreServer::start(o);
  TcpStoreOptions c = clientOptions(*withToken);
  c.token = "secret";
  TcpStore client(c);  // reached through 127.0.0.1, one of "every interface"
  EXPECT_EQ(client.add("n", 1), 1);
  o.token.clear();
  o.allowNoTokenOffLoopback = true;
  EXPECT_NO_THROW(TcpStoreServer::start(o));
}

TEST(TcpStoreServer, ServesIPv6Loopback) {
  TcpStoreServerOptions o = serverOptions();
  o.host = "::1";
  std::unique_ptr<TcpStoreServer> server;
  try {
    server = TcpStoreServer::start(o);
  } catch (const NetworkError& e) {
    GTEST_SKIP() << "no IPv6 loopback here: " << e.what();
  }
  TcpStoreOptions c = clientOptions(*server);
  c.host = "::1";
  TcpStore client(c);
  EXPECT_EQ(client.describe(), "[::1]:" + std::to_string(server->port()));
  client.setString("v6", "yes");
  EXPECT_EQ(client.getString("v6"), "yes");
}

TEST(TcpStoreClient, NoListenerIsANetworkErrorNamingHostPortAndErrno) {
  TcpStoreOptions o;
  o.port = freePort();
  o.connectTimeout = Millis(300);
  try {
    TcpStore client(o);
    FAIL() << "connected to a closed port";
  } catch (const NetworkError& e) {
    std::string what = e.what();
    EXPECT_TRUE(contains(what, "127.0.0.1:" + std::to_string(o.port))) << what;
    EXPECT_TRUE(contains(what, "ECONNREFUSED")) << what;
    EXPECT_TRUE(contains(what, "attempts")) << what;
  }
}

TEST(TcpStoreClient, AnUnresolvableHostNamesTheResolverError) {
  TcpStoreOptions o;
  o.host = "no-such-host.invalid";
  o.port = 29400;
  o.connectTimeout = Millis(200);
  try {
    TcpStore client(o);
    FAIL();
  } catch (const NetworkError& e) {
    EXPECT_TRUE(contains(e.what(), "no-such-host.invalid:29400")) << e.what();
    EXPECT_TRUE(contains(e.what(), "cannot resolve")) << e.what();
  }
}

TEST(TcpStoreClient, AWaitTimeoutKeepsTheSameConnectionUsable) {  // B12
  auto server = TcpStoreServer::start(serverOptions());
  TcpStore client(clientOptions(*server));
  for (int i = 0; i < 3; ++i) {
    EXPECT_THROW(client.wait({"never"}, Millis(20)), TimeoutError);
    client.setTimeout(Millis(20));
    EXPECT_THROW(client.get("never"), TimeoutError);
    client.setTimeout(Millis(10000));
    client.setString("k" + std::to_string(i), "v");
    EXPECT_EQ(client.getString("k" + std::to_string(i)), "v");
  }
  EXPECT_EQ(server->numConnections(), 1u) << "the client reconnected instead of reusing";
  EXPECT_EQ(server->numWaiting(), 0u);
}

std::atomic<int> gSignals{0};
void countSignal(int) { gSignals.fetch_add(1); }

TEST(TcpStoreClient, SignalsWithoutSaRestartDoNotBreakABlockingGetOrWait) {  // B13
  struct sigaction sa{};
  struct sigaction old{};
  sa.sa_handler = countSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: blocking calls return EINTR
  ASSERT_EQ(sigaction(SIGUSR1, &sa, &old), 0);

  auto server = TcpStoreServer::start(serverOptions());
  TcpStore waiter(clientOptions(*server));
  TcpStore setter(clientOptions(*server));
  for (const char* mode : {"get", "wait"}) {
    gSignals = 0;
    std::atomic<bool> done{false};
    pthread_t target = pthread_self();
    std::thread pester([&] {
      while (!done) {
        pthread_kill(target, SIGUSR1);
        std::this_thread::sleep_for(milliseconds(2));
      }
    });
    std::thread later([&] {
      // Set the key only once the blocked call has been interrupted many times.
      eventually([&] { return gSignals.load() >= 50; }, milliseconds(20000));
      setter.setString(std::string("eintr-") + mode, "ok");
    });
    if (std::string(mode) == "get") {
      EXPECT_EQ(waiter.getString("eintr-get"), "ok");
    } else {
      EXPECT_NO_THROW(waiter.wait({"eintr-wait"}, Millis(10000)));
    }
    done = true;
    pester.join();
    later.join();
    EXPECT_GE(gSignals.load(), 50) << mode << ": too few signals arrived to mean anything";
  }
  sigaction(SIGUSR1, &old, nullptr);
}

TEST(TcpStoreClient, AServerStoppingDuringAGetIsANetworkErrorNotAHang) {  // B14
  auto server = TcpStoreServer::start(serverOptions());
  TcpStoreOptions o = clientOptions(*server);
  o.timeout = Millis(60000);
  o.connectTimeout = Millis(300);
  TcpStore client(o);
  std::string where = client.describe();
  std::thread stopper([&] {
    EXPECT_TRUE(eventually([&] { return server->numWaiting() == 1; }, milliseconds(10000)));
    server->stop();
  });
  auto start = Clock::now();
  try {
    client.get("never-set");
    FAIL() << "get returned from a stopped server";
  } catch (const NetworkError& e) {
    EXPECT_TRUE(contains(e.what(), where)) << e.what();
    EXPECT_TRUE(contains(e.what(), "\"never-set\"")) << e.what();
  }
  stopper.join();
  EXPECT_LT(Clock::now() - start, milliseconds(30000));
  // Later calls fail too (a reconnect finds nobody), naming the address.
  try {
    client.setString("k", "v");
    FAIL();
  } catch (const NetworkError& e) {
    EXPECT_TRUE(contains(e.what(), where)) << e.what();
  }
  server->stop();  // idempotent
}

TEST(TcpStoreServer, ParkedRequestsOfClientsThatLeaveAreReleased) {
  auto server = TcpStoreServer::start(serverOptions());
  wire::Request wait;
  wait.op = wire::Op::Wait;
  wait.keys = {"never", "nor-this"};
  wait.timeoutMs = 600000;
  for (int i = 0; i < 50; ++i) {
    auto raw = std::make_unique<RawClient>(server->port());
    ASSERT_TRUE(raw->handshake());
    ASSERT_TRUE(raw->send(wire::encodeRequest(wait)));
    ASSERT_TRUE(eventually([&] { return server->numWaiting() == 1; }, milliseconds(10000)));
    raw.reset();  // the client goes away while its request is parked
    ASSERT_TRUE(eventually([&] { return server->numWaiting() == 0; }, milliseconds(10000)));
  }
  EXPECT_TRUE(eventually([&] { return server->numConnections() == 0; }, milliseconds(10000)));
  // Setting the keys now wakes nobody and breaks nothing.
  TcpStore client(clientOptions(*server));
  client.setString("never", "1");
  client.setString("nor-this", "2");
  client.wait({"never", "nor-this"}, Millis(1000));
}

TEST(TcpStoreClient, ClientSideLimitsFailBeforeSending) {
  auto server = TcpStoreServer::start(serverOptions());
  TcpStoreOptions o = clientOptions(*server);
  o.limits.maxKeyBytes = 16;
  o.limits.maxValueBytes = 32;
  o.limits.maxKeysPerRequest = 2;
  TcpStore client(o);
  EXPECT_THROW(client.set(std::string(17, 'k'), {}), InvalidArgument);
  EXPECT_THROW(client.set("k", Bytes(33)), InvalidArgument);
  EXPECT_THROW(client.check({"a", "b", "c"}), InvalidArgument);
  EXPECT_THROW(client.wait({"a", "b", "c"}, Millis(1)), InvalidArgument);
  client.set(std::string(16, 'k'), Bytes(32));
  EXPECT_TRUE(client.check({std::string(16, 'k')}));
}

TEST(TcpStoreClient, ServerSideLimitsRefuseAndTheNextCallReconnects) {
  TcpStoreServerOptions so = serverOptions();
  so.limits.maxValueBytes = 1024;
  auto server = TcpStoreServer::start(so);
  TcpStore client(clientOptions(*server));  // default (larger) limits
  try {
    client.set("big", Bytes(4096));
    FAIL() << "the server took a value over its limit";
  } catch (const InvalidArgument& e) {
    EXPECT_TRUE(contains(e.what(), "longer than 1024 bytes")) << e.what();
    EXPECT_TRUE(contains(e.what(), "\"big\"")) << e.what();
  }
  client.setString("small", "ok");
  EXPECT_EQ(client.getString("small"), "ok");
  EXPECT_FALSE(client.check({"big"}));
}

TEST(TcpStoreClient, LargeValuesRoundTrip) {
  auto server = TcpStoreServer::start(serverOptions());
  TcpStore client(clientOptions(*server));
  Bytes value(8 << 20);
  for (size_t i = 0; i < value.size(); ++i) value[i] = static_cast<uint8_t>(i * 31 + 7);
  client.set("big", value);
  EXPECT_EQ(client.get("big"), value);
  TcpStore other(clientOptions(*server));
  EXPECT_EQ(toString(other.compareSet("big", value, toBytes("small"))), "small");
}

TEST(TcpStoreClient, OneClientIsSafeToShareBetweenThreads) {
  auto server = TcpStoreServer::start(serverOptions());
  TcpStore client(clientOptions(*server));
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 200; ++i) client.add("shared", 1);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(client.add("shared", 0), 1600);
  EXPECT_EQ(server->numConnections(), 1u);
}

TEST(TcpStoreServer, ServesAThousandConcurrentConnectionsAndParksWithoutThreads) {
  ASSERT_GE(raiseFdLimit(), 2200u) << "need ~2 descriptors per connection in one process";
  auto server = TcpStoreServer::start(serverOptions());
  constexpr int kClients = 1000;
  std::vector<std::unique_ptr<TcpStore>> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.push_back(std::make_unique<TcpStore>(clientOptions(*server)));
    clients.back()->add("joined", 1);
  }
  EXPECT_EQ(server->numConnections(), static_cast<size_t>(kClients));
  EXPECT_EQ(clients[0]->add("joined", 0), kClients);

  // A thousand parked GETs, from raw sockets so that no thread blocks on any of them.
  std::vector<std::unique_ptr<RawClient>> raws;
  wire::Request get;
  get.op = wire::Op::Get;
  get.keys = {"go"};
  get.timeoutMs = 60000;
  Bytes frame = wire::encodeRequest(get);
  for (int i = 0; i < kClients; ++i) {
    raws.push_back(std::make_unique<RawClient>(server->port()));
    ASSERT_TRUE(raws.back()->handshake());
    ASSERT_TRUE(raws.back()->send(frame));
  }
  ASSERT_TRUE(eventually([&] { return server->numWaiting() == kClients; }, milliseconds(20000)))
      << server->numWaiting();
  clients[7]->setString("go", "now");
  Bytes expected = wire::encodeResponse(wire::Status::Ok, wire::encodeBytes(toBytes("now")));
  for (auto& raw : raws) EXPECT_EQ(raw->recv(expected.size(), milliseconds(10000)), expected);
  EXPECT_EQ(server->numWaiting(), 0u);
  clients.clear();
  raws.clear();
  EXPECT_TRUE(eventually([&] { return server->numConnections() == 0; }, milliseconds(10000)));
}

// --- connectToJobStore ------------------------------------------------------------------------

class JobStoreEnv : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : kVars) unsetenv(v);
  }
  void TearDown() override {
    for (const char* v : kVars) unsetenv(v);
  }
  static constexpr const char* kVars[] = {"DTRAIN_STORE_ADDR", "DTRAIN_STORE_PORT",
                                          "DTRAIN_STORE_TOKEN", "DTRAIN_RESTART_COUNT"};
};

TEST_F(JobStoreEnv, AMissingVariableIsNamedWithAHintAboutLaunch) {
  setenv("DTRAIN_STORE_ADDR", "127.0.0.1", 1);
  setenv("DTRAIN_RESTART_COUNT", "0", 1);
  try {
    connectToJobStore();
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_TRUE(contains(e.what(), "DTRAIN_STORE_PORT is not set")) << e.what();
    EXPECT_TRUE(contains(e.what(), "`launch`")) << e.what();
  }
  setenv("DTRAIN_STORE_PORT", "99999", 1);
  EXPECT_THROW(connectToJobStore(), InvalidArgument);
  setenv("DTRAIN_STORE_PORT", "12a", 1);
  EXPECT_THROW(connectToJobStore(), InvalidArgument);
}

TEST_F(JobStoreEnv, ConnectsWithTheTokenAndPrefixesTheRound) {
  TcpStoreServerOptions so = serverOptions();
  so.token = "job-secret";
  auto server = TcpStoreServer::start(so);
  setenv("DTRAIN_STORE_ADDR", "127.0.0.1", 1);
  setenv("DTRAIN_STORE_PORT", std::to_string(server->port()).c_str(), 1);
  setenv("DTRAIN_STORE_TOKEN", "job-secret", 1);
  setenv("DTRAIN_RESTART_COUNT", "2", 1);
  JobStoreOptions jo;
  jo.connectTimeout = Millis(10000);
  jo.timeout = Millis(10000);
  auto store = connectToJobStore(jo);
  EXPECT_EQ(store->prefix(), "round2");
  store->setString("k", "v");
  EXPECT_EQ(store->inner()->getString("round2/k"), "v");
}

}  // namespace
}  // namespace dtrain::store
