#include "gloo_mesh.h"

#include <regex>
#include <sstream>

#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>

#include <fmt/format.h>

#include "dtrain/error.h"
#include "dtrain/logging.h"
#include "gloo_store.h"

namespace dtrain::comm {

namespace {

// Gloo prints endpoints as "[127.0.0.1]:41232".
std::string plainEndpoint(const std::string& bracketed) {
  static const std::regex re(R"(\[([^\]]+)\]:(\d+))");
  std::smatch m;
  if (std::regex_search(bracketed, m, re)) return m[1].str() + ":" + m[2].str();
  return bracketed;
}

}  // namespace

GlooMesh::GlooMesh(const Options& o) : rank_(o.rank), size_(o.size), address_(o.bind.address) {
  gloo::transport::tcp::attr attr;
  attr.hostname = o.bind.address;
  std::shared_ptr<gloo::transport::Device> device;
  try {
    device = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    DTRAIN_THROW(NetworkError, "rank {}/{}: cannot create the Gloo TCP device on {} ({}): {}",
                 rank_, size_, o.bind.address, o.bind.reason, e.what());
  }
  auto context = std::make_shared<gloo::rendezvous::Context>(rank_, size_);
  context->setTimeout(o.connectTimeout);
  GlooStore glooStore(o.store, o.prefix + "/mesh", o.connectTimeout);
  try {
    context->connectFullMesh(glooStore, device);
  } catch (const TimeoutError& e) {
    DTRAIN_THROW(TimeoutError,
                 "rank {}/{}: not every rank joined the Gloo rendezvous within {} ms (store {}): "
                 "{}. HINT: a rank that never calls init() or crashed before it leaves the others "
                 "waiting",
                 rank_, size_, o.connectTimeout.count(), o.store->describe(), e.what());
  } catch (const dtrain::Error&) {
    throw;
  } catch (const std::exception& e) {
    DTRAIN_THROW(NetworkError, "rank {}/{}: Gloo could not connect to its peers from {}: {}",
                 rank_, size_, o.bind.address, e.what());
  }
  context->setTimeout(o.timeout);
  context_ = context;
  publishEndpoints(*o.store, o.prefix + "/endpoints");
}

GlooMesh::~GlooMesh() = default;

void GlooMesh::publishEndpoints(store::Store& store, const std::string& prefix) {
  // Each rank publishes its own end of every connection; a peer's end as seen from here is what
  // that peer published for us. That gives the rank behind every address in Gloo's messages.
  std::ostringstream mine;
  mine << address_ << "\n";
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    mine << peer << " " << context_->getPair(peer)->address().str() << "\n";
  }
  store.setString(fmt::format("{}/{}", prefix, rank_), mine.str());
  for (int other = 0; other < size_; ++other) {
    if (other == rank_) continue;
    std::istringstream in(store.getString(fmt::format("{}/{}", prefix, other)));
    std::string line;
    std::getline(in, line);
    addressOfRank_[other] = line;
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      int peer = -1;
      std::string endpoint;
      fields >> peer >> endpoint;
      if (peer == rank_) rankOfEndpoint_[plainEndpoint(endpoint)] = other;
    }
  }
}

std::string GlooMesh::peerIn(const std::string& text) const {
  std::string endpoint = plainEndpoint(text);
  auto it = rankOfEndpoint_.find(endpoint);
  if (it == rankOfEndpoint_.end()) {
    return endpoint == text ? std::string() : fmt::format("peer {}", endpoint);
  }
  return fmt::format("rank {} ({})", it->second, endpoint);
}

std::string GlooMesh::describePeer(int rank) const {
  auto it = addressOfRank_.find(rank);
  return it == addressOfRank_.end() ? fmt::format("rank {}", rank)
                                    : fmt::format("rank {} ({})", rank, it->second);
}

void GlooMesh::abort() {
  if (aborted_ || !context_) return;
  aborted_ = true;
  context_->closeConnections();
}

}  // namespace dtrain::comm
