#pragma once
// Clients that an HTTP endpoint must not be held up by, and a scrape that measures how long it
// took (docs/reliability.md M21): connections that never send a byte, and garbage ones -- binary
// bytes, a 64 KiB request line, a 1 MiB header, a request cut off before its end. Torch-free, raw
// sockets on 127.0.0.1.

#include <string>
#include <vector>

namespace dtrain::testing {

class HostileHttpClients {
 public:
  // The kinds of garbage, in the order the connections cycle through them.
  static const std::vector<std::string>& garbageKinds();

  // Opens `idle` silent connections and `garbage` garbage ones (the kinds in turn) to
  // 127.0.0.1:port; sends without blocking, whatever the server does not take is dropped.
  HostileHttpClients(int port, int idle, int garbage);
  ~HostileHttpClients();  // closes every connection
  HostileHttpClients(const HostileHttpClients&) = delete;
  HostileHttpClients& operator=(const HostileHttpClients&) = delete;

  int opened() const { return static_cast<int>(idle_.size() + garbage_.size()); }
  // The status line each garbage connection got within `seconds` ("" for none), in order.
  std::vector<std::string> garbageAnswers(double seconds) const;
  // Whether every idle connection is still open (none was closed or reset by the server).
  bool idleStillOpen() const;

 private:
  std::vector<int> idle_;
  std::vector<int> garbage_;
};

struct ScrapeResult {
  int status = 0;  // 0: no answer
  std::string body;
  double seconds = 0;  // from connect to the end of the answer
  std::string error;   // why there was no answer
};

// GET `path` over a fresh connection ("Connection: close"), giving up after `timeoutSeconds`.
ScrapeResult timedScrape(int port, const std::string& path, double timeoutSeconds);

}  // namespace dtrain::testing
