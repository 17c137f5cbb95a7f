#pragma once
// Worker output: every byte a worker writes to stdout or stderr reaches the launcher through a
// pipe and goes from there to the console (whole lines, each behind the worker's prefix), to the
// worker's log file (raw, rotated past a size), and -- for stderr -- into a short tail kept for
// the failure report. One event loop in the supervisor feeds every stream; nothing here blocks on
// a worker, so a worker flooding its pipes cannot deadlock the job.

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

namespace dtrain::launcher {

constexpr size_t kMaxLineBytes = 64 * 1024;  // a longer line is cut into pieces of this size
constexpr size_t kDefaultTailLines = 20;
constexpr size_t kMaxTailLineBytes = 512;

// Splits a byte stream into lines. Pure: feed() returns the lines completed by `data` (without
// '\n'); a line longer than maxLine is returned in maxLine pieces; finish() returns what is left.
class LineSplitter {
 public:
  explicit LineSplitter(size_t maxLine = kMaxLineBytes) : maxLine_(maxLine) {}
  std::vector<std::string> feed(const char* data, size_t n);
  // The unterminated rest as a last line (nothing when empty).
  std::vector<std::string> finish();

 private:
  size_t maxLine_;
  std::string partial_;
};

// Console lines "<prefix><line>\n", packed into chunks of whole lines of at most `chunk` bytes
// (a longer single line is a chunk of its own), so each chunk is one write(): lines of different
// workers never interleave, not even with other writers on a shared pipe (PIPE_BUF).
std::vector<std::string> formatConsoleChunks(const std::string& prefix,
                                             const std::vector<std::string>& lines,
                                             size_t chunk = 4096);

// A worker's log file, rotated to "<path>.1" (one old copy kept) when it would pass maxBytes.
class LogFile {
 public:
  // Creates or truncates `path`; throws dtrain::Error naming it when it cannot.
  LogFile(std::string path, int64_t maxBytes);
  ~LogFile();
  LogFile(const LogFile&) = delete;
  LogFile& operator=(const LogFile&) = delete;

  void write(const char* data, size_t n);
  const std::string& path() const { return path_; }
  int rotations() const { return rotations_; }

 private:
  void open();

  std::string path_;
  int64_t maxBytes_;
  int fd_ = -1;
  int64_t written_ = 0;
  int rotations_ = 0;
  bool failed_ = false;  // a write error was reported once; later writes are dropped
};

// Where one stream of one worker goes.
struct StreamSinks {
  int consoleFd = -1;       // STDOUT_FILENO / STDERR_FILENO, or -1 when not shown
  std::string prefix;       // for console lines
  std::string logPath;      // empty: no log file
  int64_t logMaxBytes = 0;  // 0: unlimited
  size_t tailLines = 0;     // keep this many last lines for the report
};

class WorkerStream {
 public:
  explicit WorkerStream(StreamSinks sinks);

  // Bytes read from the worker's pipe.
  void consume(const char* data, size_t n);
  // The worker's end of the pipe is closed: flush the unterminated last line.
  void finish();

  const std::deque<std::string>& tail() const { return tail_; }
  const std::string& logPath() const { return sinks_.logPath; }

 private:
  void emit(const std::vector<std::string>& lines);

  StreamSinks sinks_;
  LineSplitter splitter_;
  std::unique_ptr<LogFile> log_;
  std::deque<std::string> tail_;
};

// Writes all of `data` to `fd` (EINTR, partial writes); false on an error such as EPIPE.
bool writeAll(int fd, const char* data, size_t n);

// One line of launch's own on stderr, "\n" added, in one write.
void say(const std::string& line);

}  // namespace dtrain::launcher
