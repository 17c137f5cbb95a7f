// The checkpoint directory protocol, torch-free (runtime/base/checkpoint/file_io.h): commits,
// LATEST, keep-last, leftovers, I/O errors injected at every kind of call, a SIGKILL after every
// single I/O call of three saves, and a real full disk (a small tmpfs, as root).
#include <fcntl.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <mutex>
#include <regex>
#include <thread>

#include <gtest/gtest.h>

#include "checkpoint/file_io.h"
#include "checkpoint_file_support.h"
#include "dtrain/base/error.h"
#include "test_support.h"

namespace dtrain::checkpoint::checkpoint_directory_test {
namespace {

using testing::TempDir;

FileOps cleanOps() { return FileOps(fault::IoFaultInjector({})); }

void save(FileOps& ops, const std::string& dir, int64_t step, int keep = 3, size_t payload = 1000) {
  saveStep(ops, dir, step, keep,
           [&](const std::string& tmp) { testing::writeSample(ops, tmp, step, payload); });
}

TEST(CheckpointDirectory, CommitsKeepsTheLastAndPointsLatestAtTheNewest) {
  TempDir dir;
  FileOps ops = cleanOps();
  for (int64_t step = 10; step <= 50; step += 10) save(ops, dir.path(), step, 3);
  auto listing = listDirectory(dir.path());
  EXPECT_EQ(listing.steps, (std::vector<int64_t>{50, 40, 30}));
  ASSERT_TRUE(listing.latest.has_value());
  EXPECT_EQ(*listing.latest, 50);
  EXPECT_TRUE(listing.temporaries.empty());
  EXPECT_EQ(testing::readFile(dir.file("LATEST")), "step-00000050\n");
  for (int64_t s : listing.steps) EXPECT_EQ(testing::verifyError(dir.file(stepFileName(s))), "");
  // keepLast below 2 still keeps 2.
  save(ops, dir.path(), 60, 1);
  EXPECT_EQ(listDirectory(dir.path()).steps, (std::vector<int64_t>{60, 50}));
  EXPECT_TRUE(listDirectory(dir.file("absent")).steps.empty());
}

TEST(CheckpointDirectory, RemovesOnlyItsOwnLeftovers) {
  TempDir dir;
  FileOps ops = cleanOps();
  save(ops, dir.path(), 1);
  testing::writeFile(dir.file("step-00000007.tmp"), "");  // crashed right after open
  testing::writeFile(dir.file("step-00000008.tmp"), std::string(200, '\0'));  // header not yet
  auto ours = testing::sampleFileBytes(9);
  testing::writeFile(dir.file("step-00000009.tmp"), std::string(ours.begin(), ours.end()));
  testing::writeFile(dir.file("LATEST.tmp"), "step-0");
  testing::writeFile(dir.file("step-00000010.tmp"), "my notes, not a checkpoint");
  testing::writeFile(dir.file("step-x.tmp"), "");
  testing::writeFile(dir.file("notes.txt"), "keep me");
  ::mkdir(dir.file("step-00000011.tmp").c_str(), 0755);
  auto listing = listDirectory(dir.path());
  EXPECT_EQ(listing.temporaries.size(), 4u);
  removeTemporaries(dir.path());
  for (const char* gone :
       {"step-00000007.tmp", "step-00000008.tmp", "step-00000009.tmp", "LATEST.tmp"}) {
    EXPECT_NE(::access(dir.file(gone).c_str(), F_OK), 0) << gone;
  }
  for (const char* kept : {"step-00000010.tmp", "step-x.tmp", "notes.txt", "step-00000011.tmp",
                           "step-00000001", "LATEST"}) {
    EXPECT_EQ(::access(dir.file(kept).c_str(), F_OK), 0) << kept;
  }
}

struct IoCase {
  const char* fault;
  const char* mentions;
  bool committed;  // the failure came after LATEST named the new step
};

// A save that fails at any I/O call leaves the previous checkpoint, LATEST and nothing else.
TEST(CheckpointDirectory, AFailedSaveLeavesTheEarlierCheckpointsAndLatest) {
  // Calls of one save: open tmp, 3 writes, fsync, rename, open dir, fsync dir, open LATEST.tmp,
  // write, fsync, rename, open dir, fsync dir.
  const IoCase cases[] = {
      {"open:EACCES@1", "EACCES", false},  {"write:ENOSPC@1", "ENOSPC", false},
      {"write:ENOSPC@2", "ENOSPC", false}, {"write:EIO@3", "EIO", false},
      {"fsync:EIO@1", "fsync", false},     {"rename:EXDEV@1", "EXDEV", false},
      {"open:EMFILE@2", "EMFILE", false},  {"fsync:EIO@2", "EIO", false},
      {"open:ENOSPC@3", "ENOSPC", false},  {"write:ENOSPC@4", "ENOSPC", false},
      {"fsync:EIO@3", "EIO", false},       {"rename:EIO@2", "EIO", false},
      {"fsync:EIO@4", "EIO", true},
  };
  for (const auto& c : cases) {
    TempDir dir;
    FileOps ok = cleanOps();
    save(ok, dir.path(), 1);
    auto before = testing::readFile(dir.file(stepFileName(1)));
    FileOps faulty{fault::IoFaultInjector(fault::parseIoFaults(c.fault))};
    try {
      save(faulty, dir.path(), 2);
      ADD_FAILURE() << c.fault << ": the save succeeded";
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find(c.mentions), std::string::npos)
          << c.fault << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find(dir.path()), std::string::npos) << e.what();
    }
    auto listing = listDirectory(dir.path());
    EXPECT_TRUE(listing.temporaries.empty()) << c.fault;
    EXPECT_EQ(::access(dir.file("LATEST.tmp").c_str(), F_OK), -1) << c.fault;
    EXPECT_EQ(testing::readFile(dir.file(stepFileName(1))), before) << c.fault;
    if (c.committed) {
      EXPECT_EQ(listing.steps, (std::vector<int64_t>{2, 1})) << c.fault;
      EXPECT_EQ(listing.latest.value_or(-1), 2) << c.fault;
      EXPECT_EQ(testing::verifyError(dir.file(stepFileName(2))), "") << c.fault;
    } else {
      EXPECT_EQ(listing.steps, (std::vector<int64_t>{1})) << c.fault;
      EXPECT_EQ(listing.latest.value_or(-1), 1) << c.fault;
    }
    // The next save works and cleans up.
    FileOps again = cleanOps();
    save(again, dir.path(), 3);
    EXPECT_EQ(listDirectory(dir.path()).latest.value_or(-1), 3);
  }
}

// Saving a committed step again (what a program that saveAsync()s a step and is then preempted at
// it used to do): a failure after the rename must not remove the new file, which replaced the one
// LATEST names and is complete and fsynced. A new step's failed save still leaves nothing.
TEST(CheckpointDirectory, ASecondSaveOfTheStepLatestNamesNeverDeletesIt) {
  TempDir dir;
  FileOps ok = cleanOps();
  save(ok, dir.path(), 1);
  save(ok, dir.path(), 2);
  // The second save's calls: fsync of the file (1), rename, then the directory's fsync (2) fails.
  FileOps faulty{fault::IoFaultInjector(fault::parseIoFaults("fsync:EIO@2"))};
  EXPECT_THROW(save(faulty, dir.path(), 2), CheckpointError);
  auto listing = listDirectory(dir.path());
  EXPECT_EQ(listing.steps, (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(listing.latest.value_or(-1), 2);
  EXPECT_EQ(testing::verifyError(dir.file(stepFileName(2))), "");
  EXPECT_TRUE(listing.temporaries.empty());
}

// The directories a Checkpointer creates survive a power loss: each new component's parent is
// fsynced (through FileOps, so the injected fault reaches it), existing ones are left alone.
TEST(CheckpointDirectory, NewDirectoriesAreMadeDurableThroughTheirParents) {
  TempDir dir;
  FileOps ops = cleanOps();
  makeDirectories(ops, dir.file("a/b/c"));
  EXPECT_EQ(ops.calls(), 6);  // open + fsync of the parent of a, of b and of c
  makeDirectories(ops, dir.file("a/b/c"));
  EXPECT_EQ(ops.calls(), 6);  // nothing new, nothing to sync
  FileOps faulty{fault::IoFaultInjector(fault::parseIoFaults("fsync:EIO@2"))};
  try {
    makeDirectories(faulty, dir.file("x/y"));
    ADD_FAILURE() << "a failed fsync of a new directory's parent went unnoticed";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find(dir.file("x")), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("EIO"), std::string::npos) << e.what();
  }
}

// A save above the threshold of Note [Hashing beside the write] hashes on a second thread: the
// checksums it writes are the data's.
TEST(CheckpointDirectory, ALargeSaveHashedBesideItsWriteVerifies) {
  TempDir dir;
  FileOps ops = cleanOps();
  save(ops, dir.path(), 7, 3, size_t{12} << 20);
  EXPECT_EQ(testing::verifyError(dir.file(stepFileName(7))), "");
  auto sample = testing::sampleCheckpoint(7, size_t{12} << 20);
  std::vector<uint8_t> region(sample.layout.header.dataSize, 0);
  for (size_t i = 0; i < sample.data.size(); ++i) {
    const auto& e = sample.layout.entries[i];
    if (e.size) {
      std::memcpy(region.data() + (e.offset - sample.layout.header.dataOffset),
                  sample.data[i].data(), e.size);
    }
  }
  writeCheckpointFileFromRegion(ops, dir.file("region"), sample.layout, region.data());
  EXPECT_EQ(testing::verifyError(dir.file("region")), "");
  EXPECT_EQ(testing::readFile(dir.file("region")), testing::readFile(dir.file(stepFileName(7))));
}

struct HelperRun {
  int status = 0;
  std::string out;
};

HelperRun runHelper(const std::vector<std::string>& argv, const std::string& ioFault) {
  int pipeFd[2];
  if (::pipe(pipeFd) != 0) return {};
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(pipeFd[1], 1);
    ::close(pipeFd[0]);
    if (ioFault.empty()) {
      ::unsetenv("DTRAIN_IO_FAULT");
    } else {
      ::setenv("DTRAIN_IO_FAULT", ioFault.c_str(), 1);
    }
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    ::_exit(127);
  }
  ::close(pipeFd[1]);
  HelperRun run;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(pipeFd[0], buf, sizeof(buf))) > 0) run.out.append(buf, static_cast<size_t>(n));
  ::close(pipeFd[0]);
  ::waitpid(pid, &run.status, 0);
  return run;
}

int64_t stateField(const std::string& out, const std::string& field) {
  std::smatch m;
  std::regex re(field + "=(-?[0-9]+)");
  return std::regex_search(out, m, re) ? std::stoll(m[1]) : -99;
}

// Note [Checkpoint directory]'s promise, at every crash point: SIGKILL after I/O call K of three
// saves (K = 1 .. all) leaves only complete checkpoints under final names, LATEST naming one of
// them, at most one temporary, and the newest complete checkpoint the last one committed (or the
// one whose rename had just happened).
TEST(CheckpointDirectory, EveryCrashPointLeavesTheNewestCompleteCheckpoint) {
  std::string helper = testing::binaryPath("checkpoint_io_helper");
  TempDir counting;
  auto clean = runHelper({helper, counting.path(), "1", "3", "2000", "2"}, "");
  ASSERT_EQ(clean.status, 0) << clean.out;
  const int64_t calls = stateField(clean.out, "calls");
  ASSERT_GT(calls, 20) << clean.out;
  for (int64_t k = 1; k <= calls; ++k) {
    TempDir dir;
    auto run = runHelper({helper, dir.path(), "1", "3", "2000", "2"},
                         "crash@io=" + std::to_string(k));
    ASSERT_TRUE(WIFSIGNALED(run.status) && WTERMSIG(run.status) == SIGKILL)
        << "crash@io=" << k << " did not kill the saver: " << run.out;
    int64_t announced = 0;
    for (int64_t s = 1; s <= 3; ++s) {
      if (run.out.find("committed " + std::to_string(s) + "\n") != std::string::npos) announced = s;
    }
    auto listing = listDirectory(dir.path());
    for (int64_t s : listing.steps) {
      EXPECT_EQ(testing::verifyError(dir.file(stepFileName(s))), "")
          << "crash@io=" << k << ": a torn checkpoint under a final name";
    }
    int64_t newest = listing.steps.empty() ? 0 : listing.steps.front();
    EXPECT_TRUE(newest == announced || newest == announced + 1)
        << "crash@io=" << k << ": newest " << newest << ", last committed " << announced;
    if (listing.latest) {
      EXPECT_NE(std::find(listing.steps.begin(), listing.steps.end(), *listing.latest),
                listing.steps.end())
          << "crash@io=" << k << ": LATEST names a missing step " << *listing.latest;
      EXPECT_GE(*listing.latest, announced) << "crash@io=" << k;
    } else {
      EXPECT_LE(announced, 0) << "crash@io=" << k;
    }
    EXPECT_LE(listing.temporaries.size(), 1u) << "crash@io=" << k;
    // Resuming the saves cleans up and commits.
    auto resumed = runHelper({helper, dir.path(), "4", "4", "2000", "2"}, "");
    EXPECT_EQ(resumed.status, 0) << resumed.out;
    EXPECT_TRUE(std::regex_search(resumed.out, std::regex("steps=4[, ]"))) << resumed.out;
    EXPECT_NE(resumed.out.find("temporaries=0 verified=ok"), std::string::npos) << resumed.out;
  }
}

// A real full disk: a 256 KiB tmpfs in a private mount namespace holds one 150 KB checkpoint,
// not two. The second save fails with ENOSPC; the first checkpoint, LATEST and nothing else stay.
TEST(CheckpointDirectory, DiskFullOnASmallTmpfsFailsTheSaveCleanly) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to mount a tmpfs";
  if (::access("/usr/bin/unshare", X_OK) != 0) GTEST_SKIP() << "needs unshare (util-linux)";
  TempDir dir;
  std::string helper = testing::binaryPath("checkpoint_io_helper");
  auto run = runHelper({"/usr/bin/unshare", "--mount", "--propagation", "private", "/bin/sh", "-c",
                        "mount -t tmpfs -o size=256k dtrain-test \"$1\" && exec \"$2\" \"$1\" 1 2 "
                        "150000 2 2>&1",
                        "sh", dir.path(), helper},
                       "");
  ASSERT_TRUE(WIFEXITED(run.status)) << run.out;
  EXPECT_EQ(WEXITSTATUS(run.status), 1) << run.out;
  EXPECT_NE(run.out.find("committed 1\n"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("ENOSPC"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("the disk is full"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("steps=1 latest=1 temporaries=0 verified=ok"), std::string::npos)
      << run.out;
  // The tmpfs went with the namespace: nothing was written to the real directory.
  EXPECT_TRUE(listDirectory(dir.path()).steps.empty());
}

// Note [Bounded saves]: a save stuck in the kernel (here: opening a FIFO nobody reads) fails the
// wait with what it was doing; the thread finishes once the disk "comes back".
TEST(CheckpointSaveThread, AStuckSaveTimesOutSayingWhereItIs) {
  TempDir dir;
  std::string fifo = dir.file("stuck");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  SaveThread thread;
  auto ops = std::make_shared<FileOps>(cleanOps());
  thread.start("the checkpoint of step 5", [ops, fifo](SaveProgress& progress) {
    progress.phase = "writing data";
    int fd = ops->open(fifo, O_WRONLY);
    FileOps::close(fd);
  });
  auto start = std::chrono::steady_clock::now();
  try {
    thread.wait(std::chrono::milliseconds(300));
    FAIL() << "the stuck save returned";
  } catch (const TimeoutError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("step 5"), std::string::npos) << what;
    EXPECT_NE(what.find("300 ms"), std::string::npos) << what;
    EXPECT_NE(what.find("writing data"), std::string::npos) << what;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_TRUE(thread.running());
  int reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);  // the disk comes back
  thread.wait(std::chrono::seconds(10));
  ::close(reader);
  EXPECT_FALSE(thread.running());
}

// Holds a save's write until the test lets it go.
struct Gate {
  std::mutex mutex;
  std::condition_variable cv;
  bool open = false;
  void pass() {
    std::unique_lock<std::mutex> lock(mutex);
    cv.wait(lock, [&] { return open; });
  }
  void release() {
    std::lock_guard<std::mutex> lock(mutex);
    open = true;
    cv.notify_all();
  }
};

// Note [Abandoned saves]: a save whose waiter timed out never commits, however its write ends:
// no `step-N`, no temporary, LATEST where it was; a later wait() collects why.
TEST(CheckpointSaveThread, ASaveItsWaiterGaveUpOnNeverCommits) {
  TempDir dir;
  auto ops = std::make_shared<FileOps>(cleanOps());
  save(*ops, dir.path(), 1);
  Gate disk;
  SaveThread thread;
  const std::string where = dir.path();
  thread.start("the checkpoint of step 2", [ops, where, &disk](SaveProgress& progress) {
    writeAndCommit(
        *ops, where, 2,
        [&](const std::string& tmp) {
          disk.pass();  // a hung disk
          testing::writeSample(*ops, tmp, 2, 1000);
        },
        &progress);
  });
  try {
    thread.wait(std::chrono::milliseconds(100));
    FAIL() << "the held save returned";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("abandoned: it will not be committed"), std::string::npos)
        << e.what();
  }
  disk.release();  // the disk comes back: the write ends
  std::string late = "it succeeded";
  try {
    thread.wait(std::chrono::seconds(10));
  } catch (const CheckpointError& e) {
    late = e.what();
  }
  EXPECT_NE(late.find("not committing"), std::string::npos) << late;
  auto listing = listDirectory(dir.path());
  EXPECT_EQ(listing.steps, (std::vector<int64_t>{1}));
  EXPECT_EQ(listing.latest.value_or(-1), 1);
  EXPECT_TRUE(listing.temporaries.empty());
}

// Note [Abandoned saves]: whichever comes first decides. A save that began committing before its
// waiter's deadline is not abandoned (its file was complete), and the waiter says it may still be
// committed.
TEST(CheckpointSaveThread, ASaveThatBeganCommittingBeforeTheDeadlineIsNotAbandoned) {
  Gate rename, entered;
  std::atomic<bool> mayCommit{false};
  SaveThread thread;
  thread.start("the checkpoint of step 3", [&](SaveProgress& progress) {
    mayCommit = progress.beginCommit();
    entered.release();
    rename.pass();  // a rename stuck in the kernel
  });
  entered.pass();
  try {
    thread.wait(std::chrono::milliseconds(50));
    FAIL() << "the held save returned";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("may still be committed"), std::string::npos) << e.what();
  }
  rename.release();
  thread.wait(std::chrono::seconds(10));
  EXPECT_TRUE(mayCommit.load());
}

// Pruning runs after the waiter has been released: wait() returns at the commit, settle() once
// the work after it is done too; a failed job skips it.
TEST(CheckpointSaveThread, WorkAfterTheJobDoesNotDelayTheWaiter) {
  SaveThread thread;
  std::atomic<bool> pruned{false};
  thread.start(
      "a save", [](SaveProgress&) {},
      [&pruned] {
        std::this_thread::sleep_for(std::chrono::milliseconds(400));
        pruned = true;
      });
  auto start = std::chrono::steady_clock::now();
  thread.wait(std::chrono::seconds(10));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(300));
  EXPECT_FALSE(pruned.load());
  EXPECT_FALSE(thread.settle(std::chrono::milliseconds(1)));
  EXPECT_TRUE(thread.settle(std::chrono::seconds(10)));
  EXPECT_TRUE(pruned.load());
  std::atomic<bool> ranAfterFailure{false};
  thread.start(
      "a failing save", [](SaveProgress&) { throw CheckpointError("disk gone"); },
      [&ranAfterFailure] { ranAfterFailure = true; });
  EXPECT_THROW(thread.wait(std::chrono::seconds(10)), CheckpointError);
  EXPECT_TRUE(thread.settle(std::chrono::seconds(10)));
  EXPECT_FALSE(ranAfterFailure.load());
}

// Note [Background saves yield]: the thread that lowers its priority is the only one that does.
TEST(CheckpointSaveThread, ABackgroundSaveThreadYieldsTheCpu) {
  auto niceOf = [] {
    return ::getpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)));
  };
  const int mine = niceOf();
  int theirs = -100;
  std::thread background([&] {
    EXPECT_TRUE(lowerThisThreadsPriority());
    theirs = niceOf();
  });
  background.join();
  EXPECT_EQ(theirs, std::min(mine + kBackgroundNice, 19));
  EXPECT_EQ(niceOf(), mine);
}

// Note [Background saves yield]: the idle class is the calling thread's alone,
// as the nice value is.
TEST(CheckpointSaveThread, ABackgroundSaveThreadMovesAloneIntoTheIdleClass) {
  const int mine = ::sched_getscheduler(0);
  int theirs = -1;
  std::thread background([&] {
    EXPECT_TRUE(moveThisThreadToIdleClass());
    theirs = ::sched_getscheduler(0);
  });
  background.join();
  EXPECT_EQ(theirs, SCHED_IDLE);
  EXPECT_EQ(::sched_getscheduler(0), mine);
  EXPECT_NE(mine, SCHED_IDLE);
}

}  // namespace
}  // namespace dtrain::checkpoint::checkpoint_directory_test
