// Job-token authentication (docs/reliability.md S7, S8, S17; Note [Store authentication]).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <thread>

#include <gtest/gtest.h>

#include "dtrain/base/error.h"
#include "dtrain/base/logging.h"
#include "dtrain/base/tcp_store.h"
#include "store/auth.h"
#include "store/wire.h"
#include "store_support.h"

namespace dtrain::store::tcp_store_auth_test {
namespace {

using namespace testing;
using std::chrono::milliseconds;

constexpr const char* kToken = "t0ken-of-job-A";

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

class TcpStoreAuth : public ::testing::Test {
 protected:
  void SetUp() override { unsetenv("DTRAIN_STORE_TOKEN"); }
  void TearDown() override { unsetenv("DTRAIN_STORE_TOKEN"); }

  std::unique_ptr<TcpStoreServer> serverWith(const std::string& token) {
    TcpStoreServerOptions o = serverOptions();
    o.token = token;
    return TcpStoreServer::start(o);
  }
  TcpStoreOptions clientWith(const TcpStoreServer& server, const std::string& token) {
    TcpStoreOptions o = clientOptions(server);
    o.token = token;
    o.connectTimeout = Millis(2000);
    return o;
  }
  // The client's error; fails the test when the client connects.
  std::string refusal(const TcpStoreOptions& o) {
    try {
      TcpStore client(o);
      ADD_FAILURE() << "connected";
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
};

TEST_F(TcpStoreAuth, TheRightTokenIsAccepted) {
  auto server = serverWith(kToken);
  TcpStore client(clientWith(*server, kToken));
  client.setString("k", "v");
  EXPECT_EQ(client.getString("k"), "v");
}

TEST_F(TcpStoreAuth, TheTokenCanComeFromTheEnvironment) {
  auto server = serverWith(kToken);
  setenv("DTRAIN_STORE_TOKEN", kToken, 1);
  TcpStore client(clientWith(*server, ""));
  EXPECT_EQ(client.add("n", 2), 2);
}

TEST_F(TcpStoreAuth, AWrongTokenIsRefusedClearlyAndNeverLogged) {
  auto server = serverWith(kToken);
  log::setVerbosity(3);
  ::testing::internal::CaptureStderr();
  std::string what = refusal(clientWith(*server, "t0ken-of-job-B"));
  std::string logged = ::testing::internal::GetCapturedStderr();
  log::setVerbosity(0);
  std::string where = "127.0.0.1:" + std::to_string(server->port());
  EXPECT_TRUE(contains(what, "store " + where + " refused the job token")) << what;
  EXPECT_TRUE(contains(what, "HINT")) << what;
  for (const std::string& text : {what, logged}) {
    EXPECT_FALSE(contains(text, kToken)) << text;
    EXPECT_FALSE(contains(text, "t0ken-of-job-B")) << text;
  }
}

TEST_F(TcpStoreAuth, AMissingTokenIsRefusedClearly) {
  auto server = serverWith(kToken);
  std::string what = refusal(clientWith(*server, ""));
  EXPECT_TRUE(contains(what, "requires a job token")) << what;
  EXPECT_TRUE(contains(what, "DTRAIN_STORE_TOKEN")) << what;
}

TEST_F(TcpStoreAuth, AClientWithATokenRefusesAServerWithout) {
  // S8: a worker of a job with a token must not join a token-less store on the same port.
  auto server = serverWith("");
  std::string what = refusal(clientWith(*server, kToken));
  EXPECT_TRUE(contains(what, "runs without a job token")) << what;
  EXPECT_TRUE(contains(what, "HINT")) << what;
}

TEST_F(TcpStoreAuth, AForgedProofIsRefusedBeforeAnyKeyOperation) {
  auto server = serverWith(kToken);
  RawClient raw(server->port());
  wire::Hello hello;
  hello.nonce = auth::randomNonce();
  auto helloBytes = wire::encodeHello(hello);
  ASSERT_TRUE(raw.send(helloBytes.data(), helloBytes.size()));
  auto challenge = raw.recv(wire::kChallengeBytes, milliseconds(5000));
  ASSERT_EQ(challenge.size(), wire::kChallengeBytes);
  // A SET sent where the proof belongs: its first 32 bytes are taken as a (wrong) proof, and the
  // rest is never read as a request.
  wire::Request set;
  set.op = wire::Op::Set;
  set.keys = {"intruder"};
  set.value = Bytes(64, 'x');
  Bytes frame = wire::encodeRequest(set);
  raw.send(frame);
  auto verdict = raw.recv(wire::kVerdictBytes, milliseconds(5000));
  ASSERT_EQ(verdict.size(), wire::kVerdictBytes);
  EXPECT_EQ(wire::decodeVerdict(verdict.data()), wire::kVerdictWrongToken);
  EXPECT_TRUE(raw.closedByServer(milliseconds(5000)));
  TcpStore client(clientWith(*server, kToken));
  EXPECT_FALSE(client.check({"intruder"}));
  EXPECT_EQ(client.numKeys(), 0);
}

TEST_F(TcpStoreAuth, AnotherWireVersionIsToldTheServersVersionAndDropped) {
  auto server = serverWith("");
  RawClient raw(server->port());
  wire::Hello hello;
  hello.version = 9;
  auto bytes = wire::encodeHello(hello);
  ASSERT_TRUE(raw.send(bytes.data(), bytes.size()));
  auto challenge = raw.recv(wire::kChallengeBytes, milliseconds(5000));
  ASSERT_EQ(challenge.size(), wire::kChallengeBytes);
  EXPECT_EQ(challenge[4], wire::kVersion);
  EXPECT_TRUE(raw.closedByServer(milliseconds(5000)));
}

TEST_F(TcpStoreAuth, NonStoreServersAreNamedAsSuch) {
  // Something else answers on the port: a listener that greets like sshd.
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 4), 0);
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  std::thread greeter([fd] {
    int c = ::accept(fd, nullptr, nullptr);
    const char banner[] = "SSH-2.0-OpenSSH_9.2\r\n";
    ::send(c, banner, sizeof(banner) - 1, MSG_NOSIGNAL);
    ::usleep(50 * 1000);
    ::close(c);
  });
  TcpStoreOptions o;
  o.port = ntohs(addr.sin_port);
  o.connectTimeout = Millis(2000);
  try {
    TcpStore client(o);
    ADD_FAILURE() << "accepted an SSH server as a store";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "is not a dtrain store")) << e.what();
  }
  greeter.join();
  ::close(fd);
}

}  // namespace
}  // namespace dtrain::store::tcp_store_auth_test
