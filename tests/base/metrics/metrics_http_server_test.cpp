// The metrics endpoint's HTTP server (runtime/base/metrics/http_server.h, Note [Metrics server];
// docs/reliability.md M21): a scrape is answered at once however many idle or garbage
// connections are open; garbage is answered with an error and closed; a head that never ends, an
// idle connection and one client too many are closed; keep-alive and pipelined requests work.
// Through launch: tests/launcher/monitor/launcher_monitor_test.cpp.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "dtrain/base/metrics.h"
#include "hostile_http_support.h"
#include "metrics/http_server.h"

namespace dtrain::metrics::metrics_http_server_test {
namespace {

using testing::HostileHttpClients;
using testing::timedScrape;

TEST(HttpRequestHead, WhatIsReadOfARequest) {
  struct Case {
    const char* head;
    int status;
    const char* method;
    const char* path;
    bool keepAlive;
  };
  const Case cases[] = {
      {"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", 0, "GET", "/metrics", true},
      {"GET /metrics?x=1 HTTP/1.1\r\n\r\n", 0, "GET", "/metrics", true},
      {"HEAD / HTTP/1.1\r\nConnection: close\r\n\r\n", 0, "HEAD", "/", false},
      {"GET /metrics HTTP/1.0\r\n\r\n", 0, "GET", "/metrics", false},
      {"GET /metrics HTTP/1.0\r\nconnection: Keep-Alive\r\n\r\n", 0, "GET", "/metrics", true},
      {"GET /metrics HTTP/1.1\n\n", 0, "GET", "/metrics", true},
      {"POST /metrics HTTP/1.1\r\n\r\n", 405, "POST", "/metrics", true},
      {"GET /metrics HTTP/2.0\r\n\r\n", 505, "GET", "", false},
      {"GET /metrics\r\n\r\n", 400, "", "", false},
      {"GET metrics HTTP/1.1\r\n\r\n", 400, "GET", "", false},
      {"get /metrics HTTP/1.1\r\n\r\n", 400, "get", "", false},
      {"GET /metrics HTTP/1.1\r\nno colon here\r\n\r\n", 400, "GET", "/metrics", true},
      {"GET /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\n", 400, "GET", "/metrics", true},
      {"GET /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 0, "GET", "/metrics", true},
      {"GET /metrics HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 400, "GET", "/metrics", true},
  };
  for (const Case& c : cases) {
    const HttpRequestHead h = parseRequestHead(c.head);
    EXPECT_EQ(h.status, c.status) << c.head;
    EXPECT_EQ(h.method, c.method) << c.head;
    EXPECT_EQ(h.path, c.path) << c.head;
    if (h.status == 0) {
      EXPECT_EQ(h.keepAlive, c.keepAlive) << c.head;
    }
  }
}

std::vector<HttpRoute> countingRoute(std::atomic<int>* scrapes) {
  return {{"/metrics", "text/plain; version=0.0.4; charset=utf-8",
           [scrapes] { return "dtrain_scrapes " + std::to_string(++*scrapes) + "\n"; }}};
}

TEST(MetricsHttpServer, AScrapeIsAnsweredWithinOneSecondWhileIdleAndGarbageConnectionsAreOpen) {
  std::atomic<int> scrapes{0};
  PrometheusServer server({"127.0.0.1", 0},
                          [&] { return "dtrain_scrapes " + std::to_string(++scrapes) + "\n"; });
  HostileHttpClients hostile(server.port(), 200, 40);
  ASSERT_EQ(hostile.opened(), 240);
  for (int i = 0; i < 5; ++i) {
    const auto r = timedScrape(server.port(), "/metrics", 5.0);
    EXPECT_EQ(r.status, 200) << r.error;
    EXPECT_LT(r.seconds, 1.0) << "scrape " << i << " with 200 idle and 40 garbage connections";
    EXPECT_EQ(r.body, "dtrain_scrapes " + std::to_string(i + 1) + "\n");
  }
  // Garbage gets an error at once; a truncated request waits (its head timeout is 10 s).
  const auto answers = hostile.garbageAnswers(1.0);
  const auto& kinds = HostileHttpClients::garbageKinds();
  for (size_t i = 0; i < answers.size(); ++i) {
    const std::string& kind = kinds[i % kinds.size()];
    const char* expected = kind == "binary"                ? "HTTP/1.1 400 Bad Request"
                           : kind == "64 KiB request line" ? "HTTP/1.1 414 URI Too Long"
                           : kind == "1 MiB header" ? "HTTP/1.1 431 Request Header Fields Too Large"
                                                    : "";
    EXPECT_EQ(answers[i], expected) << kind;
  }
  EXPECT_TRUE(hostile.idleStillOpen()) << "idle clients are not dropped before their timeout";
}

// One connection, raw: what the server sends back until it closes or `seconds` pass.
std::string exchange(int port, const std::string& request, double seconds) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
  EXPECT_EQ(::send(fd, request.data(), request.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(request.size()));
  std::string out;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 20) <= 0) continue;
    char buf[4096];
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

size_t count(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

TEST(MetricsHttpServer, KeptAliveAndPipelinedRequestsAreAnsweredInOrder) {
  std::atomic<int> scrapes{0};
  HttpServer server("127.0.0.1", 0, "--metrics-port", countingRoute(&scrapes));
  const std::string out = exchange(
      server.port(),
      "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\nHEAD /metrics HTTP/1.1\r\n\r\n"
      "GET /nothing HTTP/1.1\r\n\r\nGET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n",
      2.0);
  EXPECT_EQ(count(out, "HTTP/1.1 200 OK"), 3u) << out;
  EXPECT_EQ(count(out, "HTTP/1.1 404 Not Found"), 1u) << out;
  EXPECT_LT(out.find("dtrain_scrapes 1\n"), out.find("dtrain_scrapes 3\n")) << out;
  EXPECT_EQ(count(out, "dtrain_scrapes 2\n"), 0u) << "HEAD sends no body: " << out;
  EXPECT_EQ(count(out, "Connection: close"), 1u) << out;
  EXPECT_EQ(scrapes.load(), 3);

  const std::string post = exchange(server.port(), "POST /metrics HTTP/1.1\r\n\r\n", 2.0);
  EXPECT_EQ(post.rfind("HTTP/1.1 405 Method Not Allowed\r\n", 0), 0u) << post;
  EXPECT_NE(post.find("Allow: GET, HEAD\r\n"), std::string::npos) << post;
}

TEST(MetricsHttpServer, UnfinishedIdleAndSurplusConnectionsAreClosed) {
  std::atomic<int> scrapes{0};
  HttpLimits limits;
  limits.headTimeout = std::chrono::milliseconds(200);
  limits.idleTimeout = std::chrono::milliseconds(400);
  limits.maxConnections = 8;
  HttpServer server("127.0.0.1", 0, "--metrics-port", countingRoute(&scrapes), limits);
  {
    HostileHttpClients idle(server.port(), 8, 0);
    // One more than the limit: the connection idle the longest makes room, and it is answered.
    EXPECT_EQ(timedScrape(server.port(), "/metrics", 2.0).status, 200);
    EXPECT_FALSE(idle.idleStillOpen()) << "the oldest idle connection was closed";
    std::this_thread::sleep_for(std::chrono::milliseconds(800));
    EXPECT_EQ(server.connections(), 0u) << "idle ones closed after the idle timeout";
  }
  HostileHttpClients truncated(server.port(), 0, 4);  // one of each kind
  const auto start = std::chrono::steady_clock::now();
  const auto answers = truncated.garbageAnswers(2.0);
  EXPECT_EQ(answers[3], "") << "a truncated request gets no answer, only closed";
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 1.5)
      << "closed at its head timeout (200 ms), not left open";
}

TEST(MetricsHttpServer, ARenderThatThrowsIsA500AndTheServerGoesOn) {
  int calls = 0;
  HttpServer server("127.0.0.1", 0, "--metrics-port",
                    {{"/metrics", "text/plain", [&]() -> std::string {
                        if (++calls == 1) throw std::runtime_error("no view yet");
                        return "ok\n";
                      }}});
  auto r = timedScrape(server.port(), "/metrics", 2.0);
  EXPECT_EQ(r.status, 500);
  EXPECT_EQ(r.body, "no view yet\n");
  r = timedScrape(server.port(), "/metrics", 2.0);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "ok\n");
}

}  // namespace
}  // namespace dtrain::metrics::metrics_http_server_test
