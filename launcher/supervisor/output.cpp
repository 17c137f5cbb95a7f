#include "launcher/supervisor/output.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "dtrain/base/error.h"
#include "dtrain/base/logging.h"

namespace dtrain::launcher {

std::vector<std::string> LineSplitter::feed(const char* data, size_t n) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < n) {
    const void* nl = std::memchr(data + start, '\n', n - start);
    size_t end = nl ? static_cast<size_t>(static_cast<const char*>(nl) - data) : n;
    partial_.append(data + start, end - start);
    while (partial_.size() > maxLine_) {  // cut runaway lines; keep memory bounded
      lines.push_back(partial_.substr(0, maxLine_));
      partial_.erase(0, maxLine_);
    }
    if (!nl) break;
    lines.push_back(std::move(partial_));
    partial_.clear();
    start = end + 1;
  }
  return lines;
}

std::vector<std::string> LineSplitter::finish() {
  std::vector<std::string> lines;
  if (!partial_.empty()) lines.push_back(std::move(partial_));
  partial_.clear();
  return lines;
}

std::vector<std::string> formatConsoleChunks(const std::string& prefix,
                                             const std::vector<std::string>& lines, size_t chunk) {
  std::vector<std::string> chunks;
  std::string current;
  for (const auto& line : lines) {
    size_t size = prefix.size() + line.size() + 1;
    if (!current.empty() && current.size() + size > chunk) {
      chunks.push_back(std::move(current));
      current.clear();
    }
    current += prefix;
    current += line;
    current += '\n';
  }
  if (!current.empty()) chunks.push_back(std::move(current));
  return chunks;
}

void say(const std::string& line) {
  std::string text = line + "\n";
  writeAll(STDERR_FILENO, text.data(), text.size());
}

bool writeAll(int fd, const char* data, size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, data, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

LogFile::LogFile(std::string path, int64_t maxBytes) : path_(std::move(path)), maxBytes_(maxBytes) {
  open();
  DTRAIN_CHECK(fd_ >= 0, "launch: cannot create log file {}: {}; HINT: check --log-dir", path_,
               std::strerror(errno));
}

LogFile::~LogFile() {
  if (fd_ >= 0) ::close(fd_);
}

void LogFile::open() {
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  written_ = 0;
}

void LogFile::write(const char* data, size_t n) {
  if (fd_ < 0 || failed_) return;
  if (maxBytes_ > 0 && written_ > 0 && written_ + static_cast<int64_t>(n) > maxBytes_) {
    ::close(fd_);
    std::string old = path_ + ".1";
    ::rename(path_.c_str(), old.c_str());
    open();
    ++rotations_;
    if (fd_ < 0) {
      failed_ = true;
      DTRAIN_LOG(Error, "launch: cannot reopen log file {} after rotating it: {}", path_,
                 std::strerror(errno));
      return;
    }
  }
  if (!writeAll(fd_, data, n)) {
    failed_ = true;  // e.g. disk full: keep the job running, say so once
    DTRAIN_LOG(Error,
               "launch: writing log file {} failed: {}; later output of this stream is "
               "not logged",
               path_, std::strerror(errno));
    return;
  }
  written_ += static_cast<int64_t>(n);
}

WorkerStream::WorkerStream(StreamSinks sinks) : sinks_(std::move(sinks)) {
  if (!sinks_.logPath.empty()) log_ = std::make_unique<LogFile>(sinks_.logPath, sinks_.logMaxBytes);
}

void WorkerStream::consume(const char* data, size_t n) {
  if (log_) log_->write(data, n);
  if (sinks_.consoleFd < 0 && sinks_.tailLines == 0) return;
  emit(splitter_.feed(data, n));
}

void WorkerStream::finish() { emit(splitter_.finish()); }

void WorkerStream::emit(const std::vector<std::string>& lines) {
  if (lines.empty()) return;
  if (sinks_.consoleFd >= 0) {
    for (const auto& chunk : formatConsoleChunks(sinks_.prefix, lines)) {
      if (!writeAll(sinks_.consoleFd, chunk.data(), chunk.size())) {
        sinks_.consoleFd = -1;  // the console went away (EPIPE): keep logging, stop echoing
        break;
      }
    }
  }
  for (size_t i = lines.size() > sinks_.tailLines ? lines.size() - sinks_.tailLines : 0;
       i < lines.size(); ++i) {
    tail_.push_back(lines[i].size() > kMaxTailLineBytes
                        ? lines[i].substr(0, kMaxTailLineBytes) + "..."
                        : lines[i]);
    if (tail_.size() > sinks_.tailLines) tail_.pop_front();
  }
}

}  // namespace dtrain::launcher
