// TensorBoard event files (Note [TensorBoard event files]): CRC32C against its check value, the
// bytes of an Event and its TFRecord against golden bytes that Python's google.protobuf and a
// CRC32C in Python produced, the tags, and the sink's file: one writer per directory, the step of
// a record without one, a torn write cut back, a directory whose filesystem has no file locks
// (tensorboard_helper started with libdtrain_flock_errno_shim.so preloaded).
// tests/scripts/tensorboard_test.py reads whole runs back with an independent reader.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include <gtest/gtest.h>

#include "dtrain/base/error.h"
#include "dtrain/base/tensorboard.h"
#include "metrics/event_file.h"
#include "test_support.h"

namespace dtrain::metrics::tensorboard_test {
namespace {

using dtrain::testing::TempDir;

std::string toHex(const std::string& bytes) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

std::string readAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::vector<std::string> eventFiles(const std::string& dir) {
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().filename().string().find("tfevents") != std::string::npos) {
      files.push_back(e.path().string());
    }
  }
  return files;
}

struct HelperRun {
  int status = -1;
  std::string err;  // its stderr
};

// Runs tensorboard_helper DIR (one record written: see tensorboard_helper.cpp) with `env`
// ("NAME=value") added to this process's environment.
HelperRun runTensorBoardHelper(const std::string& dir, const std::vector<std::string>& env) {
  const std::string helper = dtrain::testing::binaryPath("tensorboard_helper");
  TempDir scratch;
  const std::string errPath = scratch.file("stderr");
  std::vector<std::string> vars(env);
  for (char** e = environ; *e != nullptr; ++e) vars.emplace_back(*e);
  std::vector<char*> envp;
  for (auto& v : vars) envp.push_back(v.data());
  envp.push_back(nullptr);
  std::vector<char*> argv = {const_cast<char*>(helper.c_str()), const_cast<char*>(dir.c_str()),
                             nullptr};
  const int errFd = ::open(errPath.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  HelperRun run;
  if (errFd < 0) return run;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(errFd, 2);
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  ::close(errFd);
  if (pid > 0) ::waitpid(pid, &run.status, 0);
  run.err = readAll(errPath);
  return run;
}

// The first event file in `dir` other than `except`.
std::string eventFileOtherThan(const std::string& dir, const std::string& except) {
  for (const auto& f : eventFiles(dir)) {
    if (f != except) return f;
  }
  return "";
}

size_t occurrences(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(TensorBoardEvents, Crc32cHasItsCheckValue) {
  EXPECT_EQ(tensorboard::crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(tensorboard::crc32c("", 0), 0u);
  // Python's (tests/scripts/tensorboard_events.py), masked as TFRecord masks it.
  EXPECT_EQ(tensorboard::maskedCrc32c("123456789", 9), 0xc78ab0e5u);
}

TEST(TensorBoardEvents, ScalarEventAndItsRecordMatchGoldenBytes) {
  // Event(wall_time=1700000000.25, step=42, summary={value: [{tag: "loss/node-a/rank1",
  // simple_value: 0.125}]}).SerializeToString(), and its TFRecord, from Python.
  const std::string event = tensorboard::scalarsEvent(1700000000.25, 42,
                                                      {{"loss/node-a/rank1", 0.125f}});
  EXPECT_EQ(toHex(event),
            "0900001040fc54d941102a2a1a0a180a116c6f73732f6e6f64652d612f72616e6b31150000003e");
  EXPECT_EQ(toHex(tensorboard::frameRecord(event)),
            "2700000000000000bbe1b146"
            "0900001040fc54d941102a2a1a0a180a116c6f73732f6e6f64652d612f72616e6b31150000003e"
            "1f85db80");
  // A negative step is a 10-byte varint (int64, not zigzag).
  EXPECT_EQ(toHex(tensorboard::scalarsEvent(1.5, -1, {{"a", -2.0f}})),
            "09000000000000f83f10ffffffffffffffffff012a0a0a080a016115000000c0");
  // The file_version event; the explicit step 0 is what Python leaves out, and parses the same.
  EXPECT_EQ(toHex(tensorboard::fileVersionEvent(1700000000.25)),
            "0900001040fc54d94110001a0d627261696e2e4576656e743a32");
}

TEST(TensorBoardEvents, TagsNameTheFieldThenNodeGpuAndRank) {
  Record r;
  EXPECT_EQ(tensorBoardTag(r, "restarts"), "restarts");
  r.node = "host1";
  EXPECT_EQ(tensorBoardTag(r, "load1"), "load1/host1");
  r.rank = 3;
  EXPECT_EQ(tensorBoardTag(r, "loss"), "loss/host1/rank3");
  r.gpu = 0;
  EXPECT_EQ(tensorBoardTag(r, "gpu_process_mem_bytes"), "gpu_process_mem_bytes/host1/gpu0/rank3");
  r.rank.reset();
  EXPECT_EQ(tensorBoardTag(r, "gpu_util"), "gpu_util/host1/gpu0");
}

TEST(TensorBoardSink, WritesTheFileVersionThenOneRecordPerMetricsRecord) {
  TempDir tmp;
  const std::string dir = tmp.file("runs/a");  // created, parents too
  auto sink = TensorBoardSink::open(dir);
  EXPECT_EQ(std::filesystem::path(sink->path()).parent_path().string(), dir);
  EXPECT_EQ(
      std::filesystem::path(sink->path()).filename().string().rfind("events.out.tfevents.", 0), 0u);
  const std::string first = readAll(sink->path());
  ASSERT_GT(first.size(), 16u);
  EXPECT_NE(first.find(tensorboard::kFileVersion), std::string::npos);

  Record r;
  r.time = 1700000000.25;
  r.node = "node-a";
  r.rank = 1;
  r.step = 42;
  r.fields = {{"loss", 0.125}};
  sink->write(r);
  EXPECT_EQ(readAll(sink->path()), first + tensorboard::frameRecord(tensorboard::scalarsEvent(
                                               r.time, 42, {{"loss/node-a/rank1", 0.125f}})));
  Record empty = r;
  empty.fields.clear();
  const size_t before = readAll(sink->path()).size();
  sink->write(empty);  // nothing to plot: no record
  EXPECT_EQ(readAll(sink->path()).size(), before);
}

TEST(TensorBoardSink, ARecordWithoutAStepIsAtTheSecondsSinceTheFileWasOpened) {
  TempDir tmp;
  const double opened = unixSeconds();
  auto sink = TensorBoardSink::open(tmp.path());
  const size_t before = readAll(sink->path()).size();
  Record r;
  r.source = "launch";
  r.time = opened + 12.7;
  r.node = "n";
  r.fields = {{"load1", 0.5}};
  sink->write(r);
  const std::string added = readAll(sink->path()).substr(before);
  // The step is 12, or 11 if open() read its clock up to a second after `opened`.
  const std::string at12 = tensorboard::frameRecord(
      tensorboard::scalarsEvent(r.time, 12, {{"load1/n", 0.5f}}));
  const std::string at11 = tensorboard::frameRecord(
      tensorboard::scalarsEvent(r.time, 11, {{"load1/n", 0.5f}}));
  EXPECT_TRUE(added == at12 || added == at11) << toHex(added);
}

TEST(TensorBoardSink, ASecondLiveWriterInTheDirectoryIsRefusedNamingTheFirst) {
  TempDir tmp;
  auto first = TensorBoardSink::open(tmp.path());
  try {
    TensorBoardSink::open(tmp.path(), "--tensorboard-dir");
    FAIL() << "a second writer was let in";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("--tensorboard-dir " + tmp.path()), std::string::npos) << what;
    EXPECT_NE(what.find(std::filesystem::path(first->path()).filename().string()),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("HINT"), std::string::npos) << what;
  }
  EXPECT_EQ(eventFiles(tmp.path()).size(), 1u) << "the refused writer left its file";
  first.reset();  // its writer ended: the directory is free, and the old file stays
  auto second = TensorBoardSink::open(tmp.path());
  EXPECT_EQ(eventFiles(tmp.path()).size(), 2u);
}

// Note [TensorBoard directories without file locks]: where flock() fails with ENOSYS, ENOLCK or
// EOPNOTSUPP (Lustre without -o flock, NFS without lockd), both the writer's own lock and the
// scan of the other event files cannot tell; the writer warns once and writes its records.
TEST(TensorBoardSink, WithoutFileLocksTheWriterWarnsOnceAndWrites) {
  const std::string shim = dtrain::testing::binaryPath("libdtrain_flock_errno_shim.so");
  const std::string record = tensorboard::frameRecord(
      tensorboard::scalarsEvent(1700000000.25, 42, {{"loss/node-a/rank1", 0.125f}}));
  const std::vector<std::pair<std::string, int>> errors = {
      {"ENOSYS", ENOSYS}, {"ENOLCK", ENOLCK}, {"EOPNOTSUPP", EOPNOTSUPP}};
  for (const auto& error : errors) {
    SCOPED_TRACE(error.first);
    TempDir tmp;
    // An ended writer's file, so that the scan of the directory meets the failing flock() too.
    const std::string old = tmp.file("events.out.tfevents.1600000000.host.1.0");
    dtrain::testing::writeFile(old, "");
    const HelperRun run = runTensorBoardHelper(
        tmp.path(), {"LD_PRELOAD=" + shim, "DTRAIN_TEST_FLOCK_ERRNO=" + error.first});
    ASSERT_TRUE(WIFEXITED(run.status) && WEXITSTATUS(run.status) == 0)
        << "status " << run.status << ": " << run.err;
    EXPECT_EQ(occurrences(run.err, "does not support file locks"), 1u) << run.err;
    EXPECT_NE(run.err.find("--tensorboard-dir " + tmp.path()), std::string::npos) << run.err;
    EXPECT_NE(run.err.find(std::strerror(error.second)), std::string::npos) << run.err;
    EXPECT_NE(run.err.find("HINT"), std::string::npos) << run.err;
    const std::string file = readAll(eventFileOtherThan(tmp.path(), old));
    ASSERT_GT(file.size(), record.size()) << run.err;
    EXPECT_NE(file.find(tensorboard::kFileVersion), std::string::npos);
    EXPECT_EQ(toHex(file.substr(file.size() - record.size())), toHex(record));
  }
}

// The other process holds its lock (EWOULDBLOCK): refused as before, and no warning.
TEST(TensorBoardSink, ALiveWriterInAnotherProcessIsStillRefused) {
  TempDir tmp;
  auto first = TensorBoardSink::open(tmp.path());
  const HelperRun run = runTensorBoardHelper(tmp.path(), {});
  EXPECT_TRUE(WIFEXITED(run.status) && WEXITSTATUS(run.status) == 2)
      << "status " << run.status << ": " << run.err;
  EXPECT_NE(run.err.find("another process is writing TensorBoard events there (" +
                         std::filesystem::path(first->path()).filename().string() + ")"),
            std::string::npos)
      << run.err;
  EXPECT_EQ(run.err.find("does not support file locks"), std::string::npos) << run.err;
  EXPECT_EQ(eventFiles(tmp.path()).size(), 1u) << "the refused writer left its file";
}

TEST(TensorBoardSink, AnUnwritableDirectoryIsAUsageErrorNamingIt) {
  TempDir tmp;
  const std::string file = tmp.file("plain");
  std::ofstream(file) << "x";
  try {
    TensorBoardSink::open(file + "/runs", "--tensorboard-dir");
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("--tensorboard-dir " + file + "/runs"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(TensorBoardSink::open(""), InvalidArgument);
}

TEST(TensorBoardSink, ATornWriteIsCutBackSoTheFileStaysWholeRecords) {
  // A child process whose files may not grow past a limit: the record's write() is cut short,
  // as on a full disk. The sink throws and leaves the file as it was.
  TempDir tmp;
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    auto sink = TensorBoardSink::open(tmp.path());
    const std::string before = readAll(sink->path());
    rlimit limit{static_cast<rlim_t>(before.size() + 40), RLIM_INFINITY};
    ::setrlimit(RLIMIT_FSIZE, &limit);
    Record r;
    r.time = 1;
    r.step = 1;
    r.fields = {{"a_field_with_a_long_name_to_pass_the_limit", 1.0}, {"and_another_one", 2.0}};
    bool threw = false;
    try {
      sink->write(r);
    } catch (const Error& e) {
      threw = std::string(e.what()).find("cannot append to TensorBoard file") != std::string::npos;
    }
    ::_exit(threw && readAll(sink->path()) == before ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "the torn write was not reported, or its bytes stayed in the file";
}

}  // namespace
}  // namespace dtrain::metrics::tensorboard_test
