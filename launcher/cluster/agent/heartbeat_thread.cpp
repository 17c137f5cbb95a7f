#include "launcher/cluster/agent/heartbeat_thread.h"

#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

#include "dtrain/base/error.h"
#include "launcher/cluster/protocol/rendezvous.h"

namespace dtrain::launcher {

namespace {

using Clock = std::chrono::steady_clock;
using store::Millis;

// The longest store wait of the thread: a fan-out agent looks at stdin (the master's pipe) at
// least this often.
constexpr Millis kMaxSlice{5000};
// A beat due within this much (a tenth of the interval when that is less) is sent now. A stop
// wait is answered at the server's deadline, which lies a round trip after the agent's, so
// waiting until the beat is due left a remainder of a few milliseconds -- and a second wait, a
// store request for nothing, every interval.
constexpr Millis kBeatSlack{50};

}  // namespace

bool stdinEnded() {
  pollfd p{STDIN_FILENO, POLLIN, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  char buf[256];
  ssize_t n = ::read(STDIN_FILENO, buf, sizeof buf);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR);
}

HeartbeatThread::HeartbeatThread(store::TcpStoreOptions options, std::string node, Millis interval,
                                 Millis timeout, bool watchStdin)
    : options_(std::move(options)),
      node_(std::move(node)),
      interval_(interval),
      timeout_(timeout),
      watchStdin_(watchStdin) {
  wakeFd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  DTRAIN_CHECK(wakeFd_ >= 0, "launch: eventfd failed: {}", std::strerror(errno));
  thread_ = std::thread([this] { loop(); });
}

HeartbeatThread::~HeartbeatThread() {
  {
    std::lock_guard<std::mutex> g(mutex_);
    quit_ = true;
  }
  changed_.notify_all();
  if (thread_.joinable()) thread_.join();
  ::close(wakeFd_);
}

void HeartbeatThread::setRound(int round) {
  {
    std::lock_guard<std::mutex> g(mutex_);
    round_ = round;
    uint64_t stale = 0;
    (void)!::read(wakeFd_, &stale, sizeof stale);
  }
  changed_.notify_all();
}

std::string HeartbeatThread::lost() {
  std::lock_guard<std::mutex> g(mutex_);
  return lost_;
}

void HeartbeatThread::awaitNextBeat(Millis timeout) {
  std::unique_lock<std::mutex> g(mutex_);
  const uint64_t seen = beats_;
  changed_.wait_for(g, timeout, [&] { return beats_ > seen || !lost_.empty(); });
}

void HeartbeatThread::wake() {
  uint64_t one = 1;
  (void)!::write(wakeFd_, &one, sizeof one);
}

void HeartbeatThread::fail(const std::string& why) {
  {
    std::lock_guard<std::mutex> g(mutex_);
    if (lost_.empty()) lost_ = why;
  }
  changed_.notify_all();
  wake();
}

void HeartbeatThread::pause(Millis d, int round) {
  std::unique_lock<std::mutex> g(mutex_);
  changed_.wait_for(g, d, [&] { return quit_ || round_ != round; });
}

int HeartbeatThread::round() {
  std::lock_guard<std::mutex> g(mutex_);
  return round_;
}

bool HeartbeatThread::quitting() {
  std::lock_guard<std::mutex> g(mutex_);
  return quit_;
}

void HeartbeatThread::loop() {
  ::pthread_setname_np(::pthread_self(), "launch-beat");
  const std::string where = fmt::format("{}:{}", options_.host, options_.port);
  std::unique_ptr<store::TcpStore> store;
  auto lastOk = Clock::now();
  auto lastBeat = Clock::time_point{};
  int stopSeen = -1;
  while (!quitting()) {
    if (watchStdin_ && stdinEnded()) {
      fail("the master's launch is gone (its ssh session or pipe closed)");
      return;
    }
    const int round = this->round();
    try {
      if (!store) store = std::make_unique<store::TcpStore>(options_);
      if (Clock::now() - lastBeat >= interval_ - std::min(kBeatSlack, interval_ / 10)) {
        store->add(keys::heartbeat(node_), 1);
        lastBeat = lastOk = Clock::now();
        {
          std::lock_guard<std::mutex> g(mutex_);
          ++beats_;
        }
        changed_.notify_all();
      }
      // Until the next beat: at most kMaxSlice, so that stdin's end is noticed in time.
      const auto slice = std::clamp(
          std::chrono::duration_cast<Millis>(lastBeat + interval_ - Clock::now()), Millis(1),
          kMaxSlice);
      if (round < 0 || stopSeen == round) {
        pause(slice, round);
        continue;
      }
      const auto asked = Clock::now();
      try {
        store->wait({keys::stop(round)}, slice);
        stopSeen = round;
        std::lock_guard<std::mutex> g(mutex_);
        if (round_ == round) wake();
      } catch (const TimeoutError&) {
        // The server answers a wait at its deadline; a partitioned one does not.
        if (Clock::now() - asked > slice + Millis(1000)) throw;
      }
      lastOk = Clock::now();
    } catch (const Error& e) {
      if (quitting()) return;
      if (Clock::now() - lastOk >= timeout_) {
        fail(fmt::format("lost the store at {}: no answer for {:.1f} s ({})", where,
                         std::chrono::duration<double>(Clock::now() - lastOk).count(), e.what()));
        return;
      }
      store.reset();  // reconnect on the next turn
      pause(Millis(100), round);
    }
  }
}

}  // namespace dtrain::launcher
