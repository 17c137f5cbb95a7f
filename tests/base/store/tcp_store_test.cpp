// TcpStore and TcpStoreServer beyond the conformance suite (docs/reliability.md S1, S8, S11-S19):
// binding, connect errors, wait-then-reuse, EINTR, server stop, limits, 1,000 connections,
// pipelined sets, job store.
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <cstdlib>
#include <thread>

#include <gtest/gtest.h>

#include "dtrain/base/error.h"
#include "dtrain/base/job_store.h"
#include "dtrain/base/tcp_store.h"
#include "store/wire.h"
#include "store_support.h"

namespace dtrain::store::tcp_store_test {
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

TEST(TcpStoreServer, CountsRequestsByTheClassOfTheirFirstKey) {
  TcpStoreServerOptions so = serverOptions();
  so.requestClasses = 2;
  so.classify = [](const std::string& key) -> size_t {
    return key.rfind("beat/", 0) == 0 ? 0 : key == "far" ? 5 : 1;
  };
  auto server = TcpStoreServer::start(so);
  TcpStore client(clientOptions(*server));
  client.add("beat/0", 1);
  client.tryMultiGet({"beat/0", "other"});  // by its first key
  client.setString("other", "x");           // pipelined sets count too
  client.check({"other"});
  client.add("far", 1);  // class 5 is past the last class: it counts in the last one
  client.flush();
  EXPECT_EQ(server->requestCounts(), (std::vector<uint64_t>{2, 3}));
  auto plain = TcpStoreServer::start(serverOptions());
  TcpStore c2(clientOptions(*plain));
  c2.add("beat/0", 1);
  EXPECT_EQ(plain->requestCounts(), (std::vector<uint64_t>{1}));
}

TEST(TcpStore, ZeroTimeoutsInOptionsAreTheDefaults) {
  // Note [Zero timeouts]: a zero timeout in an options struct is that option's default, on the
  // server (which refused zero before) and on the client; negative is refused, naming the field.
  TcpStoreServerOptions so = serverOptions();
  so.handshakeTimeout = Millis(0);
  so.frameTimeout = Millis(0);
  so.idleTimeout = Millis(0);
  auto server = TcpStoreServer::start(so);
  TcpStoreOptions co = clientOptions(*server);
  co.timeout = Millis(0);
  co.connectTimeout = Millis(0);
  co.handshakeTimeout = Millis(0);
  TcpStore client(co);
  EXPECT_EQ(client.timeout(), kDefaultStoreTimeout);
  client.setString("k", "v");
  EXPECT_EQ(client.getString("k"), "v");
  co.timeout = Millis(-1);
  try {
    TcpStore bad(co);
    ADD_FAILURE() << "a negative timeout was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_TRUE(contains(e.what(), "TcpStoreOptions::timeout is -1 ms")) << e.what();
  }
  so.frameTimeout = Millis(-1);
  EXPECT_THROW(TcpStoreServer::start(so), InvalidArgument);
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

TEST(TcpStoreServer, OffLoopbackItNeedsATokenOrAnExplicitOptIn) {  // S17
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

TEST(TcpStoreClient, AWaitTimeoutKeepsTheSameConnectionUsable) {  // S11
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

// Interrupts the constructing thread with SIGUSR1 every 2 ms, handled without SA_RESTART, so its
// blocking system calls keep returning EINTR, until destroyed (the old handler is restored).
class SignalPester {
 public:
  SignalPester() : target_(pthread_self()) {
    struct sigaction sa {};
    sa.sa_handler = countSignal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;  // no SA_RESTART: blocking calls return EINTR
    installed_ = sigaction(SIGUSR1, &sa, &old_) == 0;
    gSignals = 0;
    thread_ = std::thread([this] {
      while (!done_) {
        pthread_kill(target_, SIGUSR1);
        std::this_thread::sleep_for(milliseconds(2));
      }
    });
  }
  ~SignalPester() {
    done_ = true;
    thread_.join();
    if (installed_) sigaction(SIGUSR1, &old_, nullptr);
  }
  bool installed() const { return installed_; }
  // Blocks until the target has been interrupted `n` times (or 20 s passed).
  static void awaitSignals(int n) {
    eventually([n] { return gSignals.load() >= n; }, milliseconds(20000));
  }

 private:
  pthread_t target_;
  struct sigaction old_ {};
  bool installed_ = false;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

TEST(TcpStoreClient, SignalsWithoutSaRestartDoNotBreakABlockingGetOrWait) {  // S12
  auto server = TcpStoreServer::start(serverOptions());
  TcpStore waiter(clientOptions(*server));
  TcpStore setter(clientOptions(*server));
  for (const char* mode : {"get", "wait"}) {
    SignalPester pester;
    ASSERT_TRUE(pester.installed());
    std::thread later([&] {
      // Set the key only once the blocked call has been interrupted many times.
      SignalPester::awaitSignals(50);
      setter.setString(std::string("eintr-") + mode, "ok");
    });
    if (std::string(mode) == "get") {
      EXPECT_EQ(waiter.getString("eintr-get"), "ok");
    } else {
      EXPECT_NO_THROW(waiter.wait({"eintr-wait"}, Millis(10000)));
    }
    later.join();
    EXPECT_GE(gSignals.load(), 50) << mode << ": too few signals arrived to mean anything";
  }
}

TEST(TcpStoreClient, SignalsWithoutSaRestartDoNotBreakAFlush) {  // S12, pipelined sets
  FakeServer fake;
  auto client = fake.connect();
  for (int i = 0; i < 20; ++i) client->setString("k" + std::to_string(i), "v");
  SignalPester pester;
  ASSERT_TRUE(pester.installed());
  std::thread server([&] {
    // Answer only once the waiting flush has been interrupted many times.
    SignalPester::awaitSignals(50);
    wire::Request r;
    for (int i = 0; i < 20; ++i) {
      if (fake.readRequest(&r, milliseconds(5000))) fake.sendAck();
    }
  });
  EXPECT_NO_THROW(client->flush());
  server.join();
  EXPECT_GE(gSignals.load(), 50);
}

TEST(TcpStoreClient, AServerStoppingDuringAGetIsANetworkErrorNotAHang) {  // S13
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

TEST(TcpStoreClient, ServerSideLimitsRefuseAndTheNextCallReportsItThenReconnects) {
  TcpStoreServerOptions so = serverOptions();
  so.limits.maxValueBytes = 1024;
  auto server = TcpStoreServer::start(so);
  TcpStore client(clientOptions(*server));  // default (larger) limits
  client.set("big", Bytes(4096));           // sent, not yet refused: see Note [Pipelined sets]
  try {
    client.add("n", 1);
    FAIL() << "the server took a value over its limit";
  } catch (const InvalidArgument& e) {
    EXPECT_TRUE(contains(e.what(), "longer than 1024 bytes")) << e.what();
    EXPECT_TRUE(contains(e.what(), "refused SET \"big\"")) << e.what();
  }
  // The add that reported it did not run; the next calls reconnect.
  client.setString("small", "ok");
  EXPECT_EQ(client.getString("small"), "ok");
  EXPECT_FALSE(client.check({"big", "n"}));
  // flush() reports it too, once.
  client.set("big", Bytes(4096));
  EXPECT_THROW(client.flush(), InvalidArgument);
  EXPECT_NO_THROW(client.flush());
  // Waiting for the acknowledgement, the old way, set() throws by itself.
  TcpStoreOptions acked = clientOptions(*server);
  acked.acknowledgedSets = true;
  TcpStore waiting(acked);
  EXPECT_THROW(waiting.set("big", Bytes(4096)), InvalidArgument);
  waiting.setString("small", "again");
  EXPECT_EQ(client.getString("small"), "again");
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

// --- pipelined sets (Note [Pipelined sets]) ------------------------------------------------------

TEST(TcpStorePipelining, SetReturnsBeforeTheServerAnswersAndFlushWaitsForEveryAnswer) {
  FakeServer fake;
  auto client = fake.connect();
  client->setString("a", "1");
  client->setString("b", "2");  // returns though "a" has no answer yet
  wire::Request r;
  ASSERT_TRUE(fake.readRequest(&r, milliseconds(5000)));
  EXPECT_EQ(r.op, wire::Op::Set);
  EXPECT_EQ(r.keys, std::vector<std::string>{"a"});
  ASSERT_TRUE(fake.readRequest(&r, milliseconds(5000)));
  EXPECT_EQ(r.keys, std::vector<std::string>{"b"});
  std::atomic<bool> flushed{false};
  std::thread flusher([&] {
    client->flush();
    flushed = true;
  });
  std::this_thread::sleep_for(milliseconds(100));
  EXPECT_FALSE(flushed) << "flush() returned before any set was acknowledged";
  ASSERT_TRUE(fake.sendAck());
  std::this_thread::sleep_for(milliseconds(100));
  EXPECT_FALSE(flushed) << "flush() returned with \"b\" unacknowledged";
  ASSERT_TRUE(fake.sendAck());
  flusher.join();
  EXPECT_TRUE(flushed);
}

TEST(TcpStorePipelining, AcknowledgedSetsWaitForTheServer) {
  FakeServer fake;
  auto client = fake.connect([](TcpStoreOptions& o) { o.acknowledgedSets = true; });
  std::atomic<bool> returned{false};
  std::thread setter([&] {
    client->setString("a", "1");
    returned = true;
  });
  wire::Request r;
  ASSERT_TRUE(fake.readRequest(&r, milliseconds(5000)));
  std::this_thread::sleep_for(milliseconds(100));
  EXPECT_FALSE(returned) << "set() returned without its acknowledgement";
  ASSERT_TRUE(fake.sendAck());
  setter.join();
}

TEST(TcpStorePipelining, AnErrorAnswerIsThrownByTheNextCallNamingTheKey) {
  FakeServer fake;
  auto client = fake.connect();
  client->setString("a", "1");
  client->setString("b", "2");
  wire::Request r;
  ASSERT_TRUE(fake.readRequest(&r, milliseconds(5000)));
  ASSERT_TRUE(fake.readRequest(&r, milliseconds(5000)));
  ASSERT_TRUE(fake.sendAck());
  ASSERT_TRUE(fake.send(wire::encodeErrorResponse("no room for it")));
  try {
    client->add("n", 1);
    FAIL() << "the error of SET \"b\" was not reported";
  } catch (const InvalidArgument& e) {
    EXPECT_TRUE(contains(e.what(), "refused SET \"b\": no room for it")) << e.what();
  }
  EXPECT_FALSE(fake.readRequest(&r, milliseconds(100))) << "the add ran after all";
  // An Error keeps the connection; the next add goes out on it.
  std::thread answer([&] {
    ASSERT_TRUE(fake.readRequest(&r, milliseconds(5000)));
    EXPECT_EQ(r.op, wire::Op::Add);
    fake.send(wire::encodeResponse(wire::Status::Ok, wire::encodeI64(7)));
  });
  EXPECT_EQ(client->add("n", 1), 7);
  answer.join();
}

TEST(TcpStorePipelining, ARefusalNamesTheSetAndTheLaterSetsItTookAlong) {
  FakeServer fake;
  auto client = fake.connect();
  for (const char* k : {"big", "b", "c"}) client->setString(k, "v");
  wire::Request r;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(fake.readRequest(&r, milliseconds(5000)));
  ASSERT_TRUE(fake.send(wire::encodeErrorResponse("too big", wire::Status::Refused)));
  fake.closeClient();
  try {
    client->flush();
    FAIL() << "the refusal was not reported";
  } catch (const InvalidArgument& e) {
    std::string what = e.what();
    EXPECT_TRUE(contains(what, "refused SET \"big\" and closed the connection: too big")) << what;
    EXPECT_TRUE(contains(what, "2 set(s) sent after it were not applied: \"b\", \"c\"")) << what;
  }
}

TEST(TcpStorePipelining, AConnectionLostWithSetsUnacknowledgedIsANetworkErrorNamingThem) {
  FakeServer fake;
  auto client = fake.connect();
  client->setString("a", "1");
  client->setString("b", "2");
  wire::Request r;
  ASSERT_TRUE(fake.readRequest(&r, milliseconds(5000)));
  ASSERT_TRUE(fake.readRequest(&r, milliseconds(5000)));
  ASSERT_TRUE(fake.sendAck());  // "a" was applied, "b" never will be
  fake.closeClient();
  auto start = Clock::now();
  try {
    client->flush();
    FAIL() << "a lost set was not reported";
  } catch (const NetworkError& e) {
    std::string what = e.what();
    EXPECT_TRUE(contains(what, "closed the connection with 1 set(s) unacknowledged")) << what;
    EXPECT_TRUE(contains(what, "\"b\"")) << what;
    EXPECT_FALSE(contains(what, "\"a\"")) << what;
  }
  EXPECT_LT(Clock::now() - start, milliseconds(2000)) << "waited for a connection that was gone";
}

TEST(TcpStorePipelining, TheDestructorWaitsOnlyBoundedTimeForAServerThatNeverAnswers) {
  FakeServer fake;  // reads nothing, answers nothing
  auto client = fake.connect([](TcpStoreOptions& o) { o.timeout = Millis(300); });
  for (int i = 0; i < 10; ++i) client->setString("k" + std::to_string(i), "v");
  auto start = Clock::now();
  client.reset();  // logs the sets it could not confirm; never throws
  auto took = Clock::now() - start;
  EXPECT_GE(took, milliseconds(250)) << "gave up without waiting for the acknowledgements";
  EXPECT_LT(took, milliseconds(3000));
}

TEST(TcpStorePipelining, AServerThatNeverAnswersStopsTheClientAfterBoundedSets) {
  FakeServer fake;  // reads nothing, answers nothing
  auto client = fake.connect([](TcpStoreOptions& o) { o.timeout = Millis(300); });
  int returned = 0;
  auto start = Clock::now();
  try {
    for (; returned < 100000; ++returned) client->setString("k" + std::to_string(returned), "v");
    FAIL() << "100,000 sets went out without a single answer";
  } catch (const TimeoutError& e) {
    EXPECT_TRUE(contains(e.what(), "did not acknowledge")) << e.what();
    EXPECT_TRUE(contains(e.what(), "\"k0\"")) << e.what();
  }
  EXPECT_GT(returned, 1);
  EXPECT_LT(returned, 5000) << "the client kept too many sets in flight";
  EXPECT_LT(Clock::now() - start, milliseconds(10000));
}

TEST(TcpStorePipelining, LargeValuesToAServerThatDoesNotReadFailInTime) {
  FakeServer fake;
  auto client = fake.connect([](TcpStoreOptions& o) { o.timeout = Millis(300); });
  Bytes value(8 << 20, 'x');
  auto start = Clock::now();
  EXPECT_THROW(for (int i = 0; i < 100; ++i) client->set("big" + std::to_string(i), value),
               TimeoutError);
  EXPECT_LT(Clock::now() - start, milliseconds(10000));
}

TEST(TcpStorePipelining, LongRunsOfSetsNeitherDeadlockNorGrowMemory) {
  auto server = TcpStoreServer::start(serverOptions());
  TcpStore client(clientOptions(*server));
  TcpStore observer(clientOptions(*server));
  constexpr int kKeys = 1000;
  for (int i = 0; i < 10000; ++i) client.setString("k" + std::to_string(i % kKeys), "warm-up");
  client.flush();
  size_t before = residentBytes();
  constexpr int kSets = 1000000;
  for (int i = 0; i < kSets; ++i) {
    client.setString("k" + std::to_string(i % kKeys), std::to_string(i));
  }
  client.flush();
  EXPECT_LT(residentBytes(), before + (32 << 20) + kSanitizerResidentSlack)
      << "memory grew during the run";
  EXPECT_EQ(observer.getString("k" + std::to_string((kSets - 1) % kKeys)),
            std::to_string(kSets - 1));

  // 64 MiB values, back to back: each is sent while the server is still taking the last.
  Bytes value(64 << 20);
  for (int i = 0; i < 6; ++i) {
    std::fill(value.begin(), value.end(), static_cast<uint8_t>('a' + i));
    client.set("huge", value);
  }
  EXPECT_EQ(observer.get("huge"), value);
}

TEST(TcpStorePipelining, DestroyingAClientRightAfterItsSetsLosesNone) {
  auto server = TcpStoreServer::start(serverOptions());
  TcpStore observer(clientOptions(*server));
  for (int run = 0; run < 300; ++run) {
    auto client = std::make_unique<TcpStore>(clientOptions(*server));
    const std::string prefix = "run" + std::to_string(run) + "/";
    for (int i = 0; i < 50; ++i) client->setString(prefix + std::to_string(i), "x");
    // Every tenth run ends on a large value: more bytes in flight when the client closes.
    Bytes last = run % 10 == 0 ? Bytes(1 << 20, 'L') : toBytes(std::to_string(run));
    client->set(prefix + "last", last);
    client.reset();
    // check() does not wait: the destructor must have seen every set applied.
    ASSERT_TRUE(observer.check({prefix + "0", prefix + "49", prefix + "last"})) << "run " << run;
    ASSERT_EQ(observer.get(prefix + "last"), last) << "run " << run;
  }
}

TEST(TcpStorePipelining, SixteenThreadsMixingSetGetAndAddOnOneClient) {
  auto server = TcpStoreServer::start(serverOptions());
  TcpStore client(clientOptions(*server));
  constexpr int kThreads = 16;
  constexpr int kRounds = 300;
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kRounds; ++i) {
        std::string key = "t" + std::to_string(t) + "/" + std::to_string(i % 7);
        std::string value = std::to_string(i);
        client.setString(key, value);
        client.setString("t" + std::to_string(t) + "/last", value);
        if (i % 3 == 0) client.add("count", 1);
        if (client.getString(key) != value) wrong.fetch_add(1);  // its own last write
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
  client.flush();
  TcpStore other(clientOptions(*server));
  EXPECT_EQ(other.add("count", 0), kThreads * ((kRounds + 2) / 3));
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(other.getString("t" + std::to_string(t) + "/last"), std::to_string(kRounds - 1));
  }
  EXPECT_EQ(server->numConnections(), 2u);
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
}  // namespace dtrain::store::tcp_store_test
