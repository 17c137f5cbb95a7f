#pragma once
// GlooMesh: one Gloo context fully connected over TCP, plus what dtrain adds around it: which
// address every peer uses (so an error names "rank 1 (10.0.0.2:41232)", not just an address),
// and an abort that resets every connection so the peers' pending operations fail at once instead
// of waiting for their timeout.

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include <gloo/context.h>

#include "dtrain/base/store.h"
#include "gloo_algorithms.h"
#include "net/net_interface.h"

namespace dtrain::comm {

class GlooMesh {
 public:
  struct Options {
    int rank = 0;
    int size = 1;
    std::shared_ptr<store::Store> store;
    std::string prefix;  // store keys go under it
    net::BindAddress bind;
    std::chrono::milliseconds connectTimeout{300000};
    std::chrono::milliseconds timeout{300000};
  };

  // Creates the device and connects to every peer; throws TimeoutError naming the ranks that did
  // not join, NetworkError when a connection fails.
  explicit GlooMesh(const Options& options);
  ~GlooMesh();

  gloo::Context& context() { return *context_; }
  const std::shared_ptr<gloo::Context>& contextPtr() const { return context_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& address() const { return address_; }

  // "rank 1 (127.0.0.1:41232)" for the peer whose connection endpoint appears in `text` (a Gloo
  // error message), or "" when none does.
  std::string peerIn(const std::string& text) const;
  // "rank 1 (127.0.0.1)".
  std::string describePeer(int rank) const;

  // Resets every connection (SO_LINGER 0): peers see ECONNRESET/EOF on their next read.
  // Idempotent; callable from any thread, but a collective running meanwhile on this mesh waits
  // on until its timeout: interrupt() releases it.
  void abort();
  // abort(), and the collective running on this mesh, if any, fails within milliseconds: Gloo
  // fails every operation pending on each closed pair, and waitInterrupt() wakes the wait of our
  // algorithms (Note [Interrupting Gloo]). Idempotent; callable from any thread.
  void interrupt();
  // For GlooCall: what interrupt() wakes.
  WaitInterrupt* waitInterrupt() { return &waitInterrupt_; }

 private:
  void publishEndpoints(store::Store& store, const std::string& prefix);
  void mapListeningAddresses(store::Store& store, const std::string& meshPrefix);

  int rank_;
  int size_;
  std::string address_;
  std::shared_ptr<gloo::Context> context_;
  std::mutex abortMutex_;     // abort() and interrupt() from any thread
  bool aborted_ = false;      // guarded by abortMutex_
  bool interrupted_ = false;  // guarded by abortMutex_
  WaitInterrupt waitInterrupt_;
  std::map<std::string, int> rankOfEndpoint_;  // "[127.0.0.1]:41232" -> rank; set at connect
  std::map<int, std::string> addressOfRank_;   // rank -> bind address; set at connect
};

}  // namespace dtrain::comm
