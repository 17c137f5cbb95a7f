#pragma once
// The agent's heartbeat thread: beats for this node on the store, and wakes the agent's workers'
// supervisor when the round must stop -- the round's stop key appeared, the store stopped
// answering, or the master went away. One per agent; see Note [Heartbeat thread].

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "dtrain/base/tcp_store.h"

namespace dtrain::launcher {

// Note [Heartbeat thread]
// ~~~~~~~~~~~~~~~~~~~~~~~
// One thread per agent, on a store connection of its own (the main thread's may sit in a long
// wait): it increments the node's heartbeat counter every --heartbeat-interval and in between
// waits on the current round's stop key until the next beat is due (at most 5 s), so another
// node's failure reaches this node's workers within one store round trip while an idle agent
// costs the store two requests per interval (a server answers a wait at its deadline, so each
// also proves the store alive; a beat due within 50 ms of that answer is sent at once, so the
// remainder is never a wait of its own). It wakes the supervisor through an eventfd when the stop
// key appears, when the store has not answered for --heartbeat-timeout ("lost the store"), or
// when stdin ends (the master, or its ssh session, is gone: noticed within one wait).
//
// The master writes every round's stop key before its decision (Note [Rendezvous protocol]), so
// after a round the thread is not in a store wait but in pause() on a condition variable, and
// the agent ends without waiting out a slice. A wake belongs to one round: setRound() and the
// thread's "stop seen, wake" step hold mutex_, and setRound() discards a wake left from the
// round before, so a late stop of round R never stops round R+1's workers.
class HeartbeatThread {
 public:
  // `interval`: --heartbeat-interval; `timeout`: --heartbeat-timeout. `watchStdin`: stdin is the
  // master's pipe (or ssh channel), and its end means the master is gone.
  HeartbeatThread(store::TcpStoreOptions options, std::string node,
                  std::chrono::milliseconds interval, std::chrono::milliseconds timeout,
                  bool watchStdin);
  ~HeartbeatThread();
  HeartbeatThread(const HeartbeatThread&) = delete;
  HeartbeatThread& operator=(const HeartbeatThread&) = delete;

  // Readable (an eventfd) when the current round must stop.
  int wakeFd() const { return wakeFd_; }
  // The round whose stop key wakes wakeFd() from now on; a wake left from an earlier round is
  // discarded.
  void setRound(int round);
  // Why this node must stop on its own (store lost, master gone); empty while all is well.
  std::string lost();
  // Waits until the store has taken one more beat than before the call, this node is lost, or
  // `timeout` passed.
  void awaitNextBeat(std::chrono::milliseconds timeout);

 private:
  void wake();
  void fail(const std::string& why);
  // Sleeps up to `d`; returns early when the round changes or the agent ends.
  void pause(std::chrono::milliseconds d, int round);
  int round();
  bool quitting();
  void loop();

  store::TcpStoreOptions options_;
  std::string node_;
  std::chrono::milliseconds interval_;
  std::chrono::milliseconds timeout_;
  bool watchStdin_;
  int wakeFd_ = -1;
  std::mutex mutex_;
  std::condition_variable changed_;  // round_ or quit_ changed
  bool quit_ = false;                // guarded by mutex_
  int round_ = -1;                   // guarded by mutex_
  std::string lost_;                 // guarded by mutex_
  uint64_t beats_ = 0;               // guarded by mutex_
  std::thread thread_;
};

// True once stdin (the master's pipe, or its ssh channel) has ended; reads and drops what came.
bool stdinEnded();

}  // namespace dtrain::launcher
