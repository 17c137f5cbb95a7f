// TensorBoardSink: metrics records as TensorBoard scalars (Note [TensorBoard event files] in
// metrics/event_file.h for the bytes).
#include "dtrain/base/tensorboard.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <vector>

#include <fmt/format.h>

#include "dtrain/base/error.h"
#include "dtrain/base/logging.h"
#include "metrics/event_file.h"
#include "net/socket.h"

namespace dtrain::metrics {
namespace {

// `dir` for a message: a path may be as long as an argument (128 KiB); messages quote 200
// characters of it at most, as launch's own do.
std::string shown(const std::string& dir) {
  constexpr size_t kMaxShown = 200;
  if (dir.size() <= kMaxShown) return dir;
  return fmt::format("{}... ({} characters)", dir.substr(0, kMaxShown), dir.size());
}

// Writes all of `bytes` with one write(); false (errno set) when it wrote less.
bool writeWhole(int fd, const std::string& bytes) {
  ssize_t n;
  do {
    n = ::write(fd, bytes.data(), bytes.size());
  } while (n < 0 && errno == EINTR);
  if (n >= 0 && static_cast<size_t>(n) != bytes.size()) errno = ENOSPC;  // a short write: full
  return n >= 0 && static_cast<size_t>(n) == bytes.size();
}

// Note [TensorBoard directories without file locks]
// One writer per directory is checked with flock(): a writer holds LOCK_EX on its own file, and
// open() tries LOCK_SH on every other event file there; EWOULDBLOCK means a live writer. Some
// filesystems have no flock(): Lustre mounted without -o flock, NFS without lockd. There it fails
// with ENOSYS, ENOLCK or EOPNOTSUPP, which says nothing about other writers, only that they
// cannot be seen. open() then warns once and writes anyway: refusing would stop every job that
// writes there (launch --tensorboard-dir exits before starting any rank) for a check it cannot
// make, while a second writer costs one run's charts. Only EWOULDBLOCK counts as busy; any other
// error of the writer's own lock still refuses.
bool locksUnsupported(int error) {
  return error == ENOSYS || error == ENOLCK || error == EOPNOTSUPP;  // ENOTSUP is EOPNOTSUPP
}

struct WriterScan {
  std::vector<std::string> busy;       // held by a live writer
  std::vector<std::string> unchecked;  // flock() unsupported there: cannot tell
  int unsupported = 0;                 // the errno that said so
};

// Event files in `dir` other than `own` that a live process holds locked (its writer).
WriterScan liveWriters(const std::string& dir, const std::string& own) {
  WriterScan scan;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name == own || name.find("tfevents") == std::string::npos) continue;
    const int fd = ::open(entry.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    if (::flock(fd, LOCK_SH | LOCK_NB) != 0) {
      if (errno == EWOULDBLOCK) {
        scan.busy.push_back(name);
      } else if (locksUnsupported(errno)) {
        scan.unchecked.push_back(name);
        scan.unsupported = errno;
      }
    }
    ::close(fd);
  }
  return scan;
}

}  // namespace

std::string tensorBoardTag(const Record& record, const std::string& field) {
  std::string tag = field;
  if (!record.node.empty()) tag += "/" + record.node;
  if (record.gpu) tag += fmt::format("/gpu{}", *record.gpu);
  if (record.rank) tag += fmt::format("/rank{}", *record.rank);
  if (!record.interface.empty()) tag += "/" + record.interface;
  if (!record.mount.empty()) tag += "/fs" + record.mount;  // "/fs/", "/fs/scratch"
  return tag;
}

std::shared_ptr<TensorBoardSink> TensorBoardSink::open(const std::string& dir,
                                                       const std::string& option) {
  DTRAIN_CHECK_ARG(!dir.empty(),
                   "{} is empty; HINT: give a directory (TensorBoard's --logdir "
                   "or a folder under it)",
                   option);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  DTRAIN_CHECK_ARG(!ec,
                   "{} {}: cannot create the directory: {}; HINT: give a path in a "
                   "writable place",
                   option, shown(dir), ec.message());

  static std::atomic<int> serial{0};
  const double now = unixSeconds();
  const std::string name = fmt::format("events.out.tfevents.{:010d}.{}.{}.{}",
                                       static_cast<int64_t>(now), net::hostName(), ::getpid(),
                                       serial.fetch_add(1));
  const std::string path = (std::filesystem::path(dir) / name).string();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
  DTRAIN_CHECK_ARG(fd >= 0, "{} {}: cannot create {}: {}; HINT: give a writable directory", option,
                   shown(dir), name, std::strerror(errno));
  auto refuse = [&](const std::string& why) {
    ::close(fd);
    ::unlink(path.c_str());
    DTRAIN_THROW(InvalidArgument, "{} {}: {}", option, shown(dir), why);
  };
  // See Note [TensorBoard directories without file locks].
  int unsupported = 0;
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    if (!locksUnsupported(error)) {
      refuse(fmt::format("cannot lock {}: {}", name, std::strerror(error)));
    }
    unsupported = error;
  }
  const WriterScan scan = liveWriters(dir, name);
  if (!scan.busy.empty()) {
    refuse(fmt::format(
        "another process is writing TensorBoard events there ({}); TensorBoard follows only the "
        "newest event file of a directory, so one of the two would be lost. HINT: give each "
        "writer its own directory (TensorBoard shows each as a run); under launch "
        "--tensorboard-dir, every rank's records are in launch's file already",
        scan.busy.front()));
  }
  const std::string first = tensorboard::frameRecord(tensorboard::fileVersionEvent(now));
  if (!writeWhole(fd, first)) {
    refuse(fmt::format("cannot write {}: {}", name, std::strerror(errno)));
  }
  if (unsupported != 0 || !scan.unchecked.empty()) {
    DTRAIN_LOG(Warn,
               "{} {}: cannot lock {}: {}: the directory's filesystem does not support "
               "file locks, so another process writing TensorBoard events there cannot be "
               "detected (TensorBoard follows only the newest event file of a directory: one "
               "writer's records would be lost); writing the events anyway. HINT: give each "
               "job its own directory; to have the check, mount Lustre with -o flock, or run "
               "NFS's lock daemon (lockd)",
               option, shown(dir), unsupported != 0 ? name : scan.unchecked.front(),
               std::strerror(unsupported != 0 ? unsupported : scan.unsupported));
  }
  return std::shared_ptr<TensorBoardSink>(new TensorBoardSink(path, fd, now, first.size()));
}

TensorBoardSink::TensorBoardSink(std::string path, int fd, double openedAt, uint64_t size)
    : path_(std::move(path)), fd_(fd), openedAt_(openedAt), size_(size) {}

TensorBoardSink::~TensorBoardSink() { ::close(fd_); }

void TensorBoardSink::write(const Record& record) {
  if (record.fields.empty()) return;
  std::vector<tensorboard::Scalar> scalars;
  scalars.reserve(record.fields.size());
  for (const auto& [name, value] : record.fields) {
    scalars.emplace_back(tensorBoardTag(record, name), static_cast<float>(value));
  }
  const int64_t step = record.step ? *record.step
                                   : static_cast<int64_t>(
                                         std::max(0.0, std::floor(record.time - openedAt_)));
  const std::string bytes = tensorboard::frameRecord(
      tensorboard::scalarsEvent(record.time, step, scalars));
  std::lock_guard<std::mutex> lock(mutex_);
  if (writeWhole(fd_, bytes)) {
    size_ += bytes.size();
    return;
  }
  const int error = errno;
  // A torn record would misframe every later one: cut the file back to its last whole record.
  if (::ftruncate(fd_, static_cast<off_t>(size_)) != 0) {
    DTRAIN_LOG(Warn, "cannot cut {} back to {} bytes after a failed write: {}", path_, size_,
               std::strerror(errno));
  }
  DTRAIN_THROW(Error, "cannot append to TensorBoard file {}: {}", path_, std::strerror(error));
}

}  // namespace dtrain::metrics
