// Note [Direct writes] (runtime/base/checkpoint/file_io.cpp): a region placed by
// directRegionStart(), and a large save staged through a window (Note [Staged direct writes]),
// has its whole blocks written with O_DIRECT, the file byte for byte what the buffered write
// makes; refusals (EINVAL at the open or at a write, injected or from a filesystem
// without O_DIRECT) fall back to the buffered write and are not asked again; other errors fail
// the save.
#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "checkpoint/file_io.h"
#include "checkpoint_file_support.h"
#include "dtrain/base/error.h"
#include "test_support.h"

namespace dtrain::checkpoint::checkpoint_direct_write_test {
namespace {

using testing::TempDir;

constexpr size_t kPayload = size_t{12} << 20;

FileOps opsWith(const std::string& ioFaults) {
  return FileOps(fault::IoFaultInjector(ioFaults.empty() ? std::vector<fault::IoFault>{}
                                                         : fault::parseIoFaults(ioFaults)));
}

// The sample's data region in a buffer of its own, `shift` bytes past directRegionStart().
struct Region {
  std::vector<uint8_t> buffer;
  const uint8_t* start = nullptr;
};
Region regionOf(const testing::SampleCheckpoint& s, size_t shift) {
  Region r;
  r.buffer.assign(s.layout.header.dataSize + kDirectAlignment + shift, 0);
  uint8_t* start = directRegionStart(r.buffer.data(), s.layout.header.dataOffset) + shift;
  for (size_t i = 0; i < s.data.size(); ++i) {
    const Entry& e = s.layout.entries[i];
    if (e.size)
      std::memcpy(start + (e.offset - s.layout.header.dataOffset), s.data[i].data(), e.size);
  }
  r.start = start;
  return r;
}

// The bytes a region write sends with O_DIRECT: the whole blocks after the first boundary.
uint64_t directPart(const Layout& layout) {
  const uint64_t head = kDirectAlignment - layout.header.dataOffset % kDirectAlignment;
  return (layout.header.dataSize - head) / kDirectAlignment * kDirectAlignment;
}

bool acceptsDirect(const std::string& dir) {
  const std::string probe = dir + "/probe";
  int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_DIRECT, 0644);
  if (fd >= 0) ::close(fd);
  ::unlink(probe.c_str());
  return fd >= 0;
}

// The sample written the buffered way (`want`, the bytes every direct write must reproduce) and
// its region placed for O_DIRECT.
struct Placed {
  explicit Placed(const TempDir& dir) {
    FileOps reference = opsWith("");
    testing::writeSample(reference, dir.file("buffered"), 7, kPayload);
    want = testing::readFile(dir.file("buffered"));
  }
  std::string want;
  testing::SampleCheckpoint sample = testing::sampleCheckpoint(7, kPayload);
  Region placed = regionOf(sample, 0);
};

TEST(DirectWrites, APlacedRegionIsWrittenDirectlyAndMatchesTheBufferedFile) {
  TempDir dir;
  if (!acceptsDirect(dir.path())) GTEST_SKIP() << dir.path() << " refuses O_DIRECT";
  Placed p(dir);
  auto& [want, sample, placed] = p;
  for (Hashing hashing : {Hashing::Beside, Hashing::Inline}) {
    FileOps ops = opsWith("");
    SaveProgress progress;
    writeCheckpointFileFromRegion(ops, dir.file("direct"), sample.layout, placed.start, &progress,
                                  hashing);
    EXPECT_EQ(ops.directStats().bytes, directPart(sample.layout));
    EXPECT_EQ(ops.directStats().refusals, 0);
    // open, the direct open, the direct write, the head, the tail, manifest, header, fsync.
    EXPECT_EQ(ops.calls(), 8);
    EXPECT_EQ(progress.bytesWritten.load(), sample.layout.header.fileSize);
    EXPECT_EQ(testing::verifyError(dir.file("direct")), "");
    EXPECT_TRUE(testing::readFile(dir.file("direct")) == want) << "the direct file differs";
  }

  // A region off the block grid, or a small one, is written the buffered way only.
  Region shifted = regionOf(sample, kDataAlignment);
  FileOps ops = opsWith("");
  writeCheckpointFileFromRegion(ops, dir.file("shifted"), sample.layout, shifted.start);
  EXPECT_EQ(ops.directStats().bytes, 0u);
  EXPECT_EQ(ops.calls(), 5);  // open, data, manifest, header, fsync
  EXPECT_TRUE(testing::readFile(dir.file("shifted")) == want) << "the shifted file differs";
  auto small = testing::sampleCheckpoint(7, 1000);
  Region smallRegion = regionOf(small, 0);
  writeCheckpointFileFromRegion(ops, dir.file("small"), small.layout, smallRegion.start);
  EXPECT_EQ(ops.directStats().bytes, 0u);
  EXPECT_EQ(testing::verifyError(dir.file("small")), "");
}

// An injected EINVAL reads as a filesystem without O_DIRECT: at the open or at the first direct
// write, the save falls back and its file is the buffered one; the next save does not ask again.
TEST(DirectWrites, ARefusalFallsBackToTheBufferedWriteAndIsNotAskedAgain) {
  TempDir dir;
  if (!acceptsDirect(dir.path())) GTEST_SKIP() << dir.path() << " refuses O_DIRECT";
  Placed p(dir);
  auto& [want, sample, placed] = p;
  struct Case {
    const char* fault;
    int64_t calls;  // of the first save: a refused call is not counted
  };
  for (const Case& c : {Case{"open:EINVAL@2", 5}, Case{"write:EINVAL@1", 6}}) {
    SCOPED_TRACE(c.fault);
    FileOps ops = opsWith(c.fault);
    writeCheckpointFileFromRegion(ops, dir.file("first"), sample.layout, placed.start);
    EXPECT_EQ(ops.calls(), c.calls);
    EXPECT_EQ(ops.directStats().refusals, 1);
    EXPECT_EQ(ops.directStats().bytes, 0u);
    EXPECT_TRUE(testing::readFile(dir.file("first")) == want) << "the fallback file differs";
    writeCheckpointFileFromRegion(ops, dir.file("second"), sample.layout, placed.start);
    EXPECT_EQ(ops.calls(), c.calls + 5) << "the second save asked for O_DIRECT again";
    EXPECT_EQ(ops.directStats().refusals, 1);
    EXPECT_EQ(testing::verifyError(dir.file("second")), "");
  }
}

// Note [Staged direct writes]: a large save from the entries' own memory (writeCheckpointFile)
// streams its data region through the staging window and writes nearly all of it with O_DIRECT,
// the file byte for byte the buffered one; a refusal falls back to buffered windows; a small save
// is written buffered as before.
TEST(DirectWrites, ALargeSaveFromTheEntriesMemoryIsStagedAndWrittenDirectly) {
  TempDir dir;
  if (!acceptsDirect(dir.path())) GTEST_SKIP() << dir.path() << " refuses O_DIRECT";
  // Five staging windows and a partial one; the reference written the buffered way only (a
  // region off the block grid).
  const auto sample = testing::sampleCheckpoint(7, (size_t{40} << 20) + 12345);
  const uint64_t dataSize = sample.layout.header.dataSize;
  {
    Layout layout = sample.layout;
    Region shifted = regionOf(sample, kDataAlignment);
    FileOps reference = opsWith("");
    writeCheckpointFileFromRegion(reference, dir.file("buffered"), layout, shifted.start);
    ASSERT_EQ(reference.directStats().bytes, 0u);
  }
  const std::string want = testing::readFile(dir.file("buffered"));
  for (Hashing hashing : {Hashing::Beside, Hashing::Inline}) {
    Layout layout = sample.layout;
    FileOps ops = opsWith("");
    std::vector<uint8_t> scratch;
    SaveProgress progress;
    writeCheckpointFile(ops, dir.file("staged"), layout, sample.pointers(), scratch, &progress,
                        hashing);
    // Buffered: the first block's head, the last window's partial block, and that window when it
    // is below kDirectMinBytes.
    EXPECT_GE(ops.directStats().bytes, dataSize - kDirectMinBytes - 2 * kDirectAlignment);
    EXPECT_LE(ops.directStats().bytes, dataSize);
    EXPECT_EQ(ops.directStats().refusals, 0);
    EXPECT_EQ(progress.bytesWritten.load(), want.size());
    EXPECT_EQ(testing::verifyError(dir.file("staged")), "");
    EXPECT_TRUE(testing::readFile(dir.file("staged")) == want) << "the staged file differs";
  }

  // O_DIRECT refused at the first direct open: every window buffered, the same file, asked once.
  Layout layout = sample.layout;
  FileOps refused = opsWith("open:EINVAL@2");
  std::vector<uint8_t> scratch;
  writeCheckpointFile(refused, dir.file("refused"), layout, sample.pointers(), scratch);
  EXPECT_EQ(refused.directStats().refusals, 1);
  EXPECT_EQ(refused.directStats().bytes, 0u);
  EXPECT_TRUE(testing::readFile(dir.file("refused")) == want) << "the fallback file differs";

  // A small save (12 MiB) is written the buffered way, in as few calls as before.
  auto small = testing::sampleCheckpoint(7, kPayload);
  FileOps ops = opsWith("");
  writeCheckpointFile(ops, dir.file("small"), small.layout, small.pointers(), scratch);
  EXPECT_EQ(ops.directStats().bytes, 0u);
  EXPECT_EQ(testing::verifyError(dir.file("small")), "");
}

// Any other error of the direct open or write fails the save, as a buffered one's would.
TEST(DirectWrites, OtherErrorsOfTheDirectCallsFailTheSave) {
  TempDir dir;
  if (!acceptsDirect(dir.path())) GTEST_SKIP() << dir.path() << " refuses O_DIRECT";
  auto sample = testing::sampleCheckpoint(7, kPayload);
  Region placed = regionOf(sample, 0);
  for (const auto& [fault, error] :
       {std::pair<std::string, std::string>{"open:EIO@2", "EIO"}, {"write:ENOSPC@1", "ENOSPC"}}) {
    SCOPED_TRACE(fault);
    FileOps ops = opsWith(fault);
    try {
      writeCheckpointFileFromRegion(ops, dir.file("failed"), sample.layout, placed.start);
      ADD_FAILURE() << "the save succeeded";
    } catch (const CheckpointError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(dir.file("failed")), std::string::npos) << what;
      EXPECT_NE(what.find(error), std::string::npos) << what;
    }
  }
}

// A filesystem that refuses O_DIRECT at the open (ramfs, mounted in a private mount namespace:
// tmpfs accepts O_DIRECT since Linux 6.6) gets the buffered file, and is asked once.
TEST(DirectWrites, AFilesystemWithoutODirectGetsAValidFile) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to mount a ramfs";
  TempDir dir;
  auto sample = testing::sampleCheckpoint(7, kPayload);
  Region placed = regionOf(sample, 0);
  pid_t pid = ::fork();
  if (pid == 0) {
    // The child's verdict is its exit status: 0 passed, 3 skipped, else the failed check.
    if (::unshare(CLONE_NEWNS) != 0 ||
        ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        ::mount("dtrain-test", dir.path().c_str(), "ramfs", 0, nullptr) != 0) {
      ::_exit(3);
    }
    if (acceptsDirect(dir.path())) ::_exit(3);
    try {
      FileOps ops = opsWith("");
      for (const char* name : {"first", "second"}) {
        writeCheckpointFileFromRegion(ops, dir.file(name), sample.layout, placed.start);
        if (!testing::verifyError(dir.file(name)).empty()) ::_exit(10);
      }
      if (ops.directStats().refusals != 1) ::_exit(11);
      if (ops.directStats().bytes != 0) ::_exit(12);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s\n", e.what());
      ::_exit(13);
    }
    ::_exit(0);
  }
  ASSERT_GT(pid, 0);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "status " << status;
  if (WEXITSTATUS(status) == 3) GTEST_SKIP() << "no ramfs refusing O_DIRECT could be mounted";
  EXPECT_EQ(WEXITSTATUS(status), 0)
      << "10: a file did not verify, 11: refusals not 1, 12: direct bytes written, 13: save threw";
}

}  // namespace
}  // namespace dtrain::checkpoint::checkpoint_direct_write_test
