// One client connection of the store server: handshake, incremental framing, parking. Runs on
// the server's loop thread only.
#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "dtrain/base/logging.h"
#include "store/auth.h"
#include "store/server.h"

namespace dtrain::store {

namespace {

// A response bigger than this still queued to a client that does not read stops that client's
// further requests until the kernel takes it (its input is then capped; see blocked()).
constexpr size_t kMaxQueuedWriteBytes = 1 << 20;
// What a blocked client may send on top before it is cut off.
constexpr size_t kMaxPipelinedBytes = 1 << 20;
// Released instead of kept once drained, so one 64 MiB Set does not pin 64 MiB per connection.
constexpr size_t kKeepBufferBytes = 1 << 20;

std::string peerName(uv_tcp_t* tcp) {
  sockaddr_storage addr{};
  int len = sizeof(addr);
  if (uv_tcp_getpeername(tcp, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return "unknown peer";
  }
  char ip[64] = {};
  if (addr.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&addr);
    uv_ip6_name(a, ip, sizeof(ip));
    return fmt::format("[{}]:{}", ip, ntohs(a->sin6_port));
  }
  auto* a = reinterpret_cast<sockaddr_in*>(&addr);
  uv_ip4_name(a, ip, sizeof(ip));
  return fmt::format("{}:{}", ip, ntohs(a->sin_port));
}

std::string shownBytes(const uint8_t* p, size_t n) {
  std::string out;
  for (size_t i = 0; i < std::min<size_t>(n, 8); ++i) out += fmt::format("{:02x}", p[i]);
  return out;
}

}  // namespace

// A queued write: the libuv request and the bytes it points into.
struct WriteReq {
  uv_write_t req;
  Bytes data;
  Connection* connection;
};

Connection::Connection(UvStoreServer* server) : server_(server) {
  uv_tcp_init(server->loop(), &tcp_);
  uv_timer_init(server->loop(), &deadlineTimer_);
  uv_timer_init(server->loop(), &waitTimer_);
  tcp_.data = this;
  deadlineTimer_.data = this;
  waitTimer_.data = this;
  openHandles_ = 3;
}

template <typename F>
void Connection::guarded(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    try {
      dropOnLoop(fmt::format("internal error while serving it: {}", e.what()));
    } catch (...) {
      closeOnLoop();
    }
  }
}

void Connection::acceptOnLoop(uv_stream_t* listener) {
  int rc = uv_accept(listener, stream());
  if (rc != 0) {
    server_->logDropOnLoop("a new client", fmt::format("accept failed: {}", uv_strerror(rc)));
    closeOnLoop();
    return;
  }
  guarded([&] { startOnLoop(); });
}

void Connection::startOnLoop() {
  peer_ = peerName(&tcp_);
  uv_tcp_nodelay(&tcp_, 1);
  // Reaps peers whose host vanished without a FIN, so their parked requests go with them.
  uv_tcp_keepalive(&tcp_, 1, 60);
  serverNonce_ = auth::randomNonce();
  deadline_ = Deadline::Handshake;
  uv_timer_start(
      &deadlineTimer_,
      [](uv_timer_t* t) {
        auto* c = static_cast<Connection*>(t->data);
        c->guarded([c] { c->onDeadline(); });
      },
      static_cast<uint64_t>(server_->options().handshakeTimeout.count()), 0);
  int rc = uv_read_start(stream(), allocCb, readCb);
  if (rc != 0) {
    dropOnLoop(fmt::format("cannot read: {}", uv_strerror(rc)));
    return;
  }
  DTRAIN_LOG(Debug, "store {}: client {} connected", server_->where(), peer_);
}

void Connection::closeOnLoop() {
  if (closing_) return;
  closing_ = true;
  server_->table().cancel(this);
  if (parked_) server_->countWaitingOnLoop(-1);
  parked_ = false;
  server_->connectionClosingOnLoop(this);
  uv_close(reinterpret_cast<uv_handle_t*>(&tcp_), closeCb);
  uv_close(reinterpret_cast<uv_handle_t*>(&deadlineTimer_), closeCb);
  uv_close(reinterpret_cast<uv_handle_t*>(&waitTimer_), closeCb);
}

void Connection::dropOnLoop(const std::string& why) {
  if (closing_) return;
  server_->logDropOnLoop(peer_, why);
  closeOnLoop();
}

void Connection::closeCb(uv_handle_t* h) {
  auto* c = static_cast<Connection*>(h->data);
  if (--c->openHandles_ == 0) delete c;
}

void Connection::allocCb(uv_handle_t* h, size_t, uv_buf_t* buf) {
  // One shared buffer: its bytes are copied out in readCb before libuv reads again.
  *buf = static_cast<Connection*>(h->data)->server_->readBufferOnLoop();
}

void Connection::readCb(uv_stream_t* s, ssize_t n, const uv_buf_t* buf) {
  auto* c = static_cast<Connection*>(s->data);
  UvStoreServer* server = c->server_;
  c->guarded([&] { c->onRead(n, buf); });
  server->drainResumesOnLoop();
}

void Connection::onRead(ssize_t n, const uv_buf_t* buf) {
  if (closing_) return;
  if (n < 0) {
    if (n == UV_EOF) {
      DTRAIN_LOG(Debug, "store {}: client {} disconnected", server_->where(), peer_);
    } else {
      DTRAIN_LOG(Info, "store {}: client {} lost: {}", server_->where(), peer_,
                 uv_strerror(static_cast<int>(n)));
    }
    closeOnLoop();
    return;
  }
  if (n == 0) return;
  in_.insert(in_.end(), buf->base, buf->base + n);
  resumeUnguarded();
}

bool Connection::blocked() {
  return parked_ || uv_stream_get_write_queue_size(stream()) > kMaxQueuedWriteBytes;
}

void Connection::resumeOnLoop() {
  guarded([&] { resumeUnguarded(); });
}

void Connection::resumeUnguarded() {
  if (closing_) return;
  for (;;) {
    bool more = false;
    switch (phase_) {
      case Phase::Hello: more = stepHello(); break;
      case Phase::Proof: more = stepProof(); break;
      case Phase::Ready: more = !blocked() && stepFrame(); break;
    }
    if (closing_) return;
    if (!more) break;
  }
  // Bound what a peer can make us hold. Unblocked, the parser already bounds the buffer by one
  // frame; blocked (parked, or its replies unread), a well-behaved client sends little or
  // nothing: it waits for the answer to anything but a Set, and reads the answers to its Sets
  // long before 1 MiB of them could queue up here (Note [Pipelined sets]).
  if (phase_ != Phase::Ready && buffered() > wire::kHelloBytes + wire::kProofBytes) {
    dropOnLoop(fmt::format("sent {} bytes before finishing the handshake", buffered()));
    return;
  }
  if (phase_ == Phase::Ready && buffered() > kMaxPipelinedBytes && blocked()) {
    dropOnLoop(
        fmt::format("sent {} bytes of requests without waiting for the replies", buffered()));
    return;
  }
  if (inStart_ == in_.size()) {
    if (in_.capacity() > kKeepBufferBytes) {
      Bytes().swap(in_);
    } else {
      in_.clear();
    }
    inStart_ = 0;
  } else if (inStart_ > 0) {
    in_.erase(in_.begin(), in_.begin() + static_cast<std::ptrdiff_t>(inStart_));
    inStart_ = 0;
  }
  armDeadline();
}

bool Connection::stepHello() {
  const uint8_t* p = in_.data() + inStart_;
  size_t n = std::min(buffered(), wire::kMagic.size());
  // Garbage goes as soon as its first byte differs from the magic.
  if (!std::equal(p, p + n, wire::kMagic.begin())) {
    dropOnLoop(
        fmt::format("not a dtrain store client (first bytes {})", shownBytes(p, buffered())));
    return false;
  }
  if (buffered() < wire::kHelloBytes) return false;
  wire::Hello hello;
  wire::decodeHello(p, &hello);
  consume(wire::kHelloBytes);
  clientNonce_ = hello.nonce;
  const std::string& token = server_->options().token;
  wire::Challenge challenge;
  challenge.flags = token.empty() ? 0 : wire::kFlagToken;
  challenge.nonce = serverNonce_;
  if (!token.empty()) challenge.proof = auth::serverProof(token, clientNonce_, serverNonce_);
  auto bytes = wire::encodeChallenge(challenge);
  if (hello.version != wire::kVersion) {
    // The client says which versions met; see Note [Store wire format].
    sendNow(bytes.data(), bytes.size());
    dropOnLoop(
        fmt::format("speaks wire version {}, this server {}", hello.version, wire::kVersion));
    return false;
  }
  send(Bytes(bytes.begin(), bytes.end()));
  phase_ = Phase::Proof;
  return !closing_;
}

bool Connection::stepProof() {
  if (buffered() < wire::kProofBytes) return false;
  wire::Mac got;
  std::copy(in_.data() + inStart_, in_.data() + inStart_ + wire::kProofBytes, got.begin());
  consume(wire::kProofBytes);
  const std::string& token = server_->options().token;
  if (!token.empty() && !auth::sameMac(got, auth::clientProof(token, serverNonce_, clientNonce_))) {
    auto verdict = wire::encodeVerdict(wire::kVerdictWrongToken);
    sendNow(verdict.data(), verdict.size());
    dropOnLoop("wrong or missing job token");
    return false;
  }
  auto verdict = wire::encodeVerdict(wire::kVerdictAccepted);
  send(Bytes(verdict.begin(), verdict.end()));
  phase_ = Phase::Ready;
  deadline_ = Deadline::None;
  uv_timer_stop(&deadlineTimer_);
  return !closing_;
}

bool Connection::stepFrame() {
  wire::ParseResult r = wire::parseRequest(in_.data() + inStart_, buffered(),
                                           server_->options().limits, &request_);
  if (r.status == wire::ParseStatus::NeedMore) return false;
  if (r.status == wire::ParseStatus::Bad) {
    Bytes error = wire::encodeErrorResponse(r.error, wire::Status::Refused);
    sendNow(error.data(), error.size());
    dropOnLoop(r.error);
    return false;
  }
  consume(r.consumed);
  deadline_ = Deadline::None;  // the next frame gets its own frame deadline
  server_->countRequestOnLoop(request_);
  std::optional<Bytes> response = server_->table().execute(request_, this);
  // parseRequest() reuses these buffers; one 64 MiB request must not pin 64 MiB per connection.
  if (request_.value.capacity() > kKeepBufferBytes) Bytes().swap(request_.value);
  if (request_.expected.capacity() > kKeepBufferBytes) Bytes().swap(request_.expected);
  if (response) {
    send(std::move(*response));
    return !closing_;
  }
  parked_ = true;
  server_->countWaitingOnLoop(1);
  uv_timer_start(
      &waitTimer_,
      [](uv_timer_t* t) {
        auto* c = static_cast<Connection*>(t->data);
        UvStoreServer* server = c->server_;
        c->guarded([c] { c->onWaitTimeout(); });
        server->drainResumesOnLoop();
      },
      request_.timeoutMs, 0);
  return false;
}

void Connection::consume(size_t n) { inStart_ += n; }

void Connection::onKeysReady() {
  // Called from inside KvTable::execute() for another connection's request: answer, but leave
  // our own next frame to drainResumesOnLoop().
  if (closing_ || !parked_) return;
  uv_timer_stop(&waitTimer_);
  parked_ = false;
  server_->countWaitingOnLoop(-1);
  guarded([&] { send(server_->table().answerParked(request_)); });
  server_->scheduleResumeOnLoop(this);
}

void Connection::onWaitTimeout() {
  if (closing_ || !parked_) return;
  server_->table().cancel(this);
  parked_ = false;
  server_->countWaitingOnLoop(-1);
  send(server_->table().timeoutResponse(request_));
  resumeUnguarded();
}

void Connection::send(Bytes frame) {
  if (closing_) return;
  // Try the socket first: an answer usually fits, and then nothing is queued or allocated.
  size_t done = 0;
  if (uv_stream_get_write_queue_size(stream()) == 0) {
    uv_buf_t buf = uv_buf_init(reinterpret_cast<char*>(frame.data()),
                               static_cast<unsigned int>(frame.size()));
    int n = uv_try_write(stream(), &buf, 1);
    if (n >= 0) {
      done = static_cast<size_t>(n);
    } else if (n != UV_EAGAIN) {
      DTRAIN_LOG(Info, "store {}: client {} lost: {}", server_->where(), peer_, uv_strerror(n));
      closeOnLoop();
      return;
    }
  }
  if (done == frame.size()) return;
  auto* w = new WriteReq;
  w->data = std::move(frame);
  w->connection = this;
  w->req.data = w;
  uv_buf_t rest = uv_buf_init(reinterpret_cast<char*>(w->data.data() + done),
                              static_cast<unsigned int>(w->data.size() - done));
  int rc = uv_write(&w->req, stream(), &rest, 1, [](uv_write_t* req, int status) {
    auto* w = static_cast<WriteReq*>(req->data);
    Connection* c = w->connection;
    delete w;
    c->guarded([&] { c->onWritten(status); });
  });
  if (rc != 0) {
    delete w;
    DTRAIN_LOG(Info, "store {}: client {} lost: {}", server_->where(), peer_, uv_strerror(rc));
    closeOnLoop();
  }
}

void Connection::onWritten(int status) {
  if (closing_) return;
  if (status != 0) {
    DTRAIN_LOG(Info, "store {}: client {} lost: {}", server_->where(), peer_, uv_strerror(status));
    closeOnLoop();
    return;
  }
  if (phase_ == Phase::Ready && !blocked() && buffered() > 0) {
    server_->scheduleResumeOnLoop(this);
    server_->drainResumesOnLoop();
  }
}

void Connection::sendNow(const uint8_t* data, size_t size) {
  uv_buf_t buf = uv_buf_init(const_cast<char*>(reinterpret_cast<const char*>(data)),
                             static_cast<unsigned int>(size));
  uv_try_write(stream(), &buf, 1);
}

void Connection::armDeadline() {
  if (closing_ || phase_ != Phase::Ready) return;  // the handshake deadline runs from accept
  const auto& o = server_->options();
  auto start = [&](Deadline kind, Millis ms) {
    deadline_ = kind;
    uv_timer_start(
        &deadlineTimer_,
        [](uv_timer_t* t) {
          auto* c = static_cast<Connection*>(t->data);
          c->guarded([c] { c->onDeadline(); });
        },
        static_cast<uint64_t>(ms.count()), 0);
  };
  if (parked_) {
    deadline_ = Deadline::None;
    uv_timer_stop(&deadlineTimer_);
  } else if (buffered() > 0) {
    // A frame has begun: it gets frameTimeout from its first byte, not from its latest one, so
    // dripping a byte at a time does not keep it alive.
    if (deadline_ != Deadline::Frame) start(Deadline::Frame, o.frameTimeout);
  } else if (o.idleTimeout.count() > 0) {
    start(Deadline::Idle, o.idleTimeout);
  } else {
    deadline_ = Deadline::None;
    uv_timer_stop(&deadlineTimer_);
  }
}

void Connection::onDeadline() {
  if (closing_) return;
  const auto& o = server_->options();
  switch (deadline_) {
    case Deadline::Handshake:
      dropOnLoop(fmt::format("no complete handshake within {} ms ({} bytes received)",
                             o.handshakeTimeout.count(), buffered()));
      break;
    case Deadline::Frame:
      dropOnLoop(fmt::format("frame incomplete after {} ms ({} bytes of it received)",
                             o.frameTimeout.count(), buffered()));
      break;
    case Deadline::Idle: dropOnLoop(fmt::format("idle for {} ms", o.idleTimeout.count())); break;
    case Deadline::None: break;
  }
}

}  // namespace dtrain::store
