#include "launcher/monitor/proc_files.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>

namespace dtrain::launcher::monitor {

namespace {

// The next space-separated token of `text` from `at`, advancing `at`.
std::string_view nextToken(std::string_view text, size_t& at) {
  while (at < text.size() && (text[at] == ' ' || text[at] == '\t')) ++at;
  size_t start = at;
  while (at < text.size() && text[at] != ' ' && text[at] != '\t' && text[at] != '\n') ++at;
  return text.substr(start, at - start);
}

template <typename T>
bool toNumber(std::string_view s, T& out) {
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && end == s.data() + s.size();
}

// "VmRSS:	    2164 kB" -> bytes.
int64_t statusKilobytes(std::string_view text, std::string_view key) {
  int64_t kb = findKeyedValue(text, key, ':');
  return kb < 0 ? -1 : kb * 1024;
}

}  // namespace

FileReader::FileReader(size_t capacity) : buffer_(capacity) {}

std::optional<std::string_view> FileReader::read(const char* path) {
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  size_t got = 0;
  while (got < buffer_.size()) {
    ssize_t n = ::read(fd, buffer_.data() + got, buffer_.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::close(fd);
      return std::nullopt;
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  return std::string_view(buffer_.data(), got);
}

std::optional<ProcStat> parseProcStat(std::string_view text) {
  size_t paren = text.rfind(')');
  if (paren == std::string_view::npos) return std::nullopt;
  // Fields from 3 on (state), numbered as in proc(5).
  size_t at = paren + 1;
  ProcStat s;
  for (int field = 3; field <= 24; ++field) {
    std::string_view token = nextToken(text, at);
    if (token.empty()) return std::nullopt;
    bool ok = true;
    switch (field) {
      case 3: s.state = token[0]; break;
      case 4: ok = toNumber(token, s.ppid); break;
      case 5: ok = toNumber(token, s.pgrp); break;
      case 14: {
        uint64_t utime = 0;
        ok = toNumber(token, utime);
        s.cpuTicks += utime;
        break;
      }
      case 15: {
        uint64_t stime = 0;
        ok = toNumber(token, stime);
        s.cpuTicks += stime;
        break;
      }
      case 20: ok = toNumber(token, s.threads); break;
      case 22: ok = toNumber(token, s.startTicks); break;
      case 24: ok = toNumber(token, s.rssPages); break;
      default: break;
    }
    if (!ok) return std::nullopt;
  }
  return s;
}

int64_t findKeyedValue(std::string_view text, std::string_view key, char separator) {
  size_t at = 0;
  while (at < text.size()) {
    size_t nl = text.find('\n', at);
    std::string_view line = text.substr(at,
                                        nl == std::string_view::npos ? text.size() - at : nl - at);
    if (line.size() > key.size() && line.compare(0, key.size(), key) == 0 &&
        line[key.size()] == separator) {
      size_t pos = key.size() + 1;
      std::string_view token = nextToken(line, pos);
      int64_t value = 0;
      return toNumber(token, value) ? value : -1;
    }
    if (nl == std::string_view::npos) break;
    at = nl + 1;
  }
  return -1;
}

ProcStatus parseProcStatus(std::string_view text) {
  ProcStatus s;
  s.rssBytes = statusKilobytes(text, "VmRSS");
  s.peakRssBytes = statusKilobytes(text, "VmHWM");
  s.threads = findKeyedValue(text, "Threads", ':');
  return s;
}

ProcIo parseProcIo(std::string_view text) {
  ProcIo io;
  io.readBytes = findKeyedValue(text, "read_bytes", ':');
  io.writeBytes = findKeyedValue(text, "write_bytes", ':');
  return io;
}

MemInfo parseMemInfo(std::string_view text) {
  MemInfo m;
  m.totalBytes = statusKilobytes(text, "MemTotal");
  m.availableBytes = statusKilobytes(text, "MemAvailable");
  m.swapTotalBytes = statusKilobytes(text, "SwapTotal");
  m.swapFreeBytes = statusKilobytes(text, "SwapFree");
  return m;
}

std::optional<double> parseLoadAvg(std::string_view text) {
  size_t at = 0;
  std::string_view token = nextToken(text, at);
  double v = 0;
  if (token.empty() || !toNumber(token, v)) return std::nullopt;
  return v;
}

std::string unescapeMountField(std::string_view field) {
  std::string out;
  for (size_t i = 0; i < field.size(); ++i) {
    if (field[i] == '\\' && i + 4 <= field.size()) {
      int v = 0;
      auto [end, ec] = std::from_chars(field.data() + i + 1, field.data() + i + 4, v, 8);
      if (ec == std::errc() && end == field.data() + i + 4) {
        out += static_cast<char>(v);
        i += 3;
        continue;
      }
    }
    out += field[i];
  }
  return out;
}

}  // namespace dtrain::launcher::monitor
