#pragma once
// Handover: what the ranks of one node cannot exchange through the store -- file descriptors.
// Rank 0 listens on a short-lived abstract Unix socket (its random name goes through the store);
// every other rank connects once, sends its rank and a pidfd of its own process, and receives the
// segment's memfd and every rank's pidfd. See Note [Segment lifetime] in shm_segment.cpp and Note
// [Watching peers] in shm_wait.h.

#include <chrono>
#include <string>
#include <vector>

#include "dtrain/base/store.h"

namespace dtrain::comm::shm {

using HandoverClock = std::chrono::steady_clock;

struct Handover {
  int memfd = -1;
  // By rank: a pidfd of that rank's process, or -1 where its kernel has none (before Linux 5.3).
  // The receiver owns them.
  std::vector<int> pidfds;
};

// A pidfd of this process (pidfd_open(getpid())): valid in every PID namespace once passed over
// a socket. -1 when the kernel has no pidfd_open.
int openOwnPidfd();

// Rank 0: listens on a fresh abstract socket and posts its name under `key` for the others.
int listenForRanks(store::Store& store, const std::string& key, int size, const std::string& who);

// Rank 0: accepts one connection from every other rank (this user's processes only, each rank
// once), collects their pidfds, then sends each the memfd and all pidfds. Returns the pidfds by
// rank (`ownPidfd` at 0). Throws TimeoutError naming the ranks that never connected.
std::vector<int> serveHandover(int listenFd, int memfd, int ownPidfd, int size,
                               HandoverClock::time_point deadline, const std::string& who);

// Ranks 1..n-1: connects to rank 0's socket, sends `ownPidfd`, receives the memfd and the pidfds.
Handover receiveHandover(const std::string& socketName, int rank, int size, int ownPidfd,
                         HandoverClock::time_point deadline, const std::string& who);

// strerror(e), for messages.
std::string errnoText(int e);
// Milliseconds until `deadline`, 0 once it has passed (a poll() timeout).
int msLeft(HandoverClock::time_point deadline);

}  // namespace dtrain::comm::shm
