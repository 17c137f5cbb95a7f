#include "launcher/node/job_resources.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "dtrain/base/error.h"
#include "launcher/config/launch_config.h"

namespace dtrain::launcher {

namespace {

std::string randomHex(size_t bytes) {
  std::vector<unsigned char> buf(bytes);
  size_t got = 0;
  while (got < bytes) {
    ssize_t n = ::getrandom(buf.data() + got, bytes - got, 0);
    if (n < 0 && errno == EINTR) continue;
    DTRAIN_CHECK(n > 0, "launch: getrandom failed: {}", std::strerror(errno));
    got += static_cast<size_t>(n);
  }
  std::string hex;
  for (unsigned char b : buf) hex += fmt::format("{:02x}", b);
  return hex;
}

}  // namespace

std::string resolveAddress(const std::string& host, const std::string& label) {
  in_addr a4{};
  in6_addr a6{};
  if (::inet_pton(AF_INET, host.c_str(), &a4) == 1 ||
      ::inet_pton(AF_INET6, host.c_str(), &a6) == 1) {
    return host;
  }
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  DTRAIN_CHECK_ARG(rc == 0 && res,
                   "{} {}: cannot resolve the host name: {}; HINT: give an IP "
                   "address",
                   label, quoteValue(host), ::gai_strerror(rc));
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr, text, sizeof text);
  ::freeaddrinfo(res);
  return text;
}

int freePort(const std::string& address) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  DTRAIN_CHECK(fd >= 0, "launch: socket failed: {}", std::strerror(errno));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = 0;
  if (::inet_pton(AF_INET, address.c_str(), &sa.sin_addr) != 1)
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof sa;
  bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0 &&
            ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) == 0;
  int err = errno;
  ::close(fd);
  DTRAIN_CHECK(ok, "launch: cannot find a free port on {}: {}", address, std::strerror(err));
  return ntohs(sa.sin_port);
}

std::string makeTempJobDir(const EnvMap& environment, const std::string& runId) {
  auto it = environment.find("TMPDIR");
  std::string base = it != environment.end() && !it->second.empty() ? it->second : "/tmp";
  std::string templ = base + "/dtrain-" + runId + "-XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  DTRAIN_CHECK(::mkdtemp(buf.data()) != nullptr,
               "launch: cannot create a directory under {}: {}; "
               "HINT: set TMPDIR to a writable directory, or give --log-dir",
               base, std::strerror(errno));
  return buf.data();
}

std::string jobDirFor(const std::string& logDir, const EnvMap& environment,
                      const std::string& runId) {
  if (logDir.empty()) return makeTempJobDir(environment, runId);
  // Absolute: a worker that changes its directory still finds its error file.
  std::error_code ec;
  std::filesystem::path dir = std::filesystem::absolute(logDir, ec);
  return (ec ? logDir : dir.lexically_normal().string()) + "/" + runId;
}

std::string newJobToken() { return randomHex(32); }
std::string newRunId() { return randomHex(6); }

}  // namespace dtrain::launcher
