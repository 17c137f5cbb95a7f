// Opening a TcpStore client connection: connect with retry and backoff, then the handshake.
#include "store/client_connect.h"

#include <algorithm>
#include <random>
#include <thread>

#include <fmt/format.h>

#include "dtrain/base/error.h"
#include "dtrain/base/logging.h"
#include "store/auth.h"
#include "store/wire.h"

namespace dtrain::store {

namespace {

using net::Clock;
using net::IoStatus;

constexpr Millis kFirstBackoff{10};
constexpr Millis kMaxBackoff{1000};

// A protocol or token problem: retrying will not help.
class HandshakeRefused : public Error {
 public:
  using Error::Error;
};

void expectIo(const net::IoResult& r, const TcpStoreOptions& options, const std::string& where,
              const char* doing) {
  switch (r.status) {
    case IoStatus::Ok: return;
    case IoStatus::Timeout:
      DTRAIN_THROW(TimeoutError, "store {}: handshake timed out after {} ms {}", where,
                   options.handshakeTimeout.count(), doing);
    case IoStatus::Closed:
      DTRAIN_THROW(NetworkError, "store {} closed the connection during the handshake ({})", where,
                   doing);
    default:
      DTRAIN_THROW(NetworkError, "store {}: handshake failed {}: {}", where, doing,
                   net::errnoText(r.err));
  }
}

// The client half of the handshake, Note [Store wire format].
void handshake(int fd, const TcpStoreOptions& options, const std::string& token,
               const std::string& where) {
  auto deadline = Clock::now() + options.handshakeTimeout;
  wire::Hello hello;
  hello.flags = token.empty() ? 0 : wire::kFlagToken;
  hello.nonce = auth::randomNonce();
  auto helloBytes = wire::encodeHello(hello);
  expectIo(net::sendAll(fd, helloBytes.data(), helloBytes.size(), deadline), options, where,
           "sending hello");

  uint8_t buf[wire::kChallengeBytes];
  net::IoResult first = net::recvAtLeast(fd, buf, wire::kMagic.size(), sizeof(buf), deadline);
  expectIo(first, options, where, "reading its challenge");
  if (!std::equal(wire::kMagic.begin(), wire::kMagic.end(), buf)) {
    throw HandshakeRefused(fmt::format(
        "{} is not a dtrain store (it answered with bytes {:02x} {:02x} {:02x} {:02x}). HINT: "
        "another service uses this port; check --rdzv-endpoint",
        where, buf[0], buf[1], buf[2], buf[3]));
  }
  // The magic is in; the rest of the fixed-size challenge follows.
  size_t have = first.done;
  if (have < sizeof(buf)) {
    expectIo(net::recvAtLeast(fd, buf + have, sizeof(buf) - have, sizeof(buf) - have, deadline),
             options, where, "reading its challenge");
  }
  wire::Challenge challenge;
  wire::decodeChallenge(buf, &challenge);
  if (challenge.version != wire::kVersion) {
    throw HandshakeRefused(fmt::format(
        "store {} speaks wire version {}, this client version {}. HINT: run the same dtrain "
        "build on every node",
        where, challenge.version, wire::kVersion));
  }
  bool serverWantsToken = (challenge.flags & wire::kFlagToken) != 0;
  if (serverWantsToken && token.empty()) {
    throw HandshakeRefused(fmt::format(
        "store {} requires a job token, and this client has none. HINT: DTRAIN_STORE_TOKEN "
        "is not set; start the program with `launch`, which sets it",
        where));
  }
  if (!serverWantsToken && !token.empty()) {
    throw HandshakeRefused(fmt::format(
        "store {} runs without a job token, but this client has one (DTRAIN_STORE_TOKEN). "
        "HINT: another job's store may be listening on this port; check --rdzv-endpoint",
        where));
  }
  wire::Mac proof{};
  if (serverWantsToken) {
    wire::Mac expected = auth::serverProof(token, hello.nonce, challenge.nonce);
    if (!auth::sameMac(challenge.proof, expected)) {
      throw HandshakeRefused(fmt::format(
          "store {} refused the job token: it does not hold the token this client has. HINT: "
          "another job's store on this port, or a stale DTRAIN_STORE_TOKEN; check "
          "--rdzv-endpoint and that every node runs under the same `launch`",
          where));
    }
    proof = auth::clientProof(token, challenge.nonce, hello.nonce);
  }
  expectIo(net::sendAll(fd, proof.data(), proof.size(), deadline), options, where,
           "sending its proof");
  uint8_t verdict[wire::kVerdictBytes];
  net::IoResult r = net::recvAtLeast(fd, verdict, sizeof(verdict), sizeof(verdict), deadline);
  if (r.status == IoStatus::Closed || (r.status == IoStatus::Ok && verdict[4] != 0)) {
    throw HandshakeRefused(
        fmt::format("store {} refused the job token. HINT: every process of a job needs the same "
                    "DTRAIN_STORE_TOKEN; start the program with `launch`",
                    where));
  }
  expectIo(r, options, where, "reading its verdict");
  if (wire::decodeVerdict(verdict) != wire::kVerdictAccepted) {
    throw HandshakeRefused(fmt::format("store {} sent a malformed handshake verdict", where));
  }
}

}  // namespace

net::Socket connectToStore(const TcpStoreOptions& options, const std::string& token,
                           const std::string& where) {
  auto start = Clock::now();
  auto deadline = start + options.connectTimeout;
  Millis backoff = kFirstBackoff;
  std::minstd_rand jitter(std::random_device{}());
  int attempts = 0;
  std::string why;
  for (;;) {
    ++attempts;
    net::Socket s = net::connectOnce(options.host, options.port, deadline, &why);
    if (s.valid()) {
      try {
        handshake(s.fd(), options, token, where);
        DTRAIN_LOG(Debug, "store client connected to {} after {} attempt(s)", where, attempts);
        return s;
      } catch (const HandshakeRefused&) {
        throw;
      } catch (const Error& e) {
        // The server went away mid-handshake (stopping, or at its fd limit): retry.
        why = e.what();
      }
    }
    auto now = Clock::now();
    if (now + Millis(1) >= deadline) break;
    auto sleep = std::min<Clock::duration>(
        Millis(backoff.count() / 2 + jitter() % (backoff.count() / 2 + 1)), deadline - now);
    std::this_thread::sleep_for(sleep);
    backoff = std::min(backoff * 2, kMaxBackoff);
  }
  DTRAIN_THROW(NetworkError,
               "could not connect to store {} within {} ms ({} attempts); last error: {}. HINT: "
               "is the launcher (which hosts the store) running, and is {} reachable from this "
               "host (firewall, --rdzv-endpoint)?",
               where, net::msSince(start), attempts, why, where);
}

}  // namespace dtrain::store
