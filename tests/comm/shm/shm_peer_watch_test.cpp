// PeerWatch (Note [Watching peers] in runtime/comm/shm/shm_wait.h): a peer is dead when its pidfd
// says its process exited; a bare pid is trusted only within this process's PID namespace.
// Across namespaces with real processes: tests/comm/comm_processes_test.cpp.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "shm_wait.h"

namespace dtrain::comm::shm::shm_peer_watch_test {
namespace {

// A child that exited and was reaped: its pid names no process now.
pid_t reapedChild(int* pidfd) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::pause();
    ::_exit(0);
  }
  *pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  return pid;
}

TEST(PeerWatch, ADeadPeerIsSeenThroughItsPidfdWhateverItsPidSays) {
  int pidfd = -1;
  const pid_t gone = reapedChild(&pidfd);
  ASSERT_GE(pidfd, 0) << "pidfd_open";
  PeerWatch::Peer me{-1, ::getpid(), true, true};
  // The pid it published means another process here (another PID namespace): the pidfd decides.
  PeerWatch watch({me, PeerWatch::Peer{pidfd, static_cast<int>(::getpid()), false, false}});
  EXPECT_EQ(watch.firstDead(), 1);
  ::close(pidfd);
  (void)gone;
}

TEST(PeerWatch, ABarePidIsTrustedOnlyInThisPidNamespace) {
  int pidfd = -1;
  const pid_t gone = reapedChild(&pidfd);
  ::close(pidfd);
  PeerWatch::Peer me{-1, ::getpid(), true, true};
  // Without a pidfd (kernels before 5.3): a pid that names no process here is a dead peer only
  // when the peer shares this namespace; from another one it says nothing.
  PeerWatch sameNamespace({me, PeerWatch::Peer{-1, gone, true, false}});
  EXPECT_EQ(sameNamespace.firstDead(), 1);
  PeerWatch otherNamespace({me, PeerWatch::Peer{-1, gone, false, false}});
  EXPECT_EQ(otherNamespace.firstDead(), -1) << "never dead from kill(pid, 0) alone";
  PeerWatch alive({me, PeerWatch::Peer{-1, ::getpid(), true, false}});
  EXPECT_EQ(alive.firstDead(), -1);
}

TEST(PeerWatch, ALivePeersPidfdIsNotReadable) {
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, ::getpid(), 0));
  ASSERT_GE(pidfd, 0);
  PeerWatch watch(
      {PeerWatch::Peer{-1, 1, false, true}, PeerWatch::Peer{pidfd, 12345, false, false}});
  EXPECT_EQ(watch.firstDead(), -1);
  ::close(pidfd);
}

}  // namespace
}  // namespace dtrain::comm::shm::shm_peer_watch_test
