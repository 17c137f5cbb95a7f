#include "gloo_store.h"

namespace dtrain::comm {

GlooStore::GlooStore(std::shared_ptr<store::Store> store, std::string prefix,
                     std::chrono::milliseconds waitTimeout)
    : store_(std::move(store)), prefix_(std::move(prefix)), waitTimeout_(waitTimeout) {}

void GlooStore::set(const std::string& key, const std::vector<char>& data) {
  store_->set(join(key), store::Bytes(data.begin(), data.end()));
}

std::vector<char> GlooStore::get(const std::string& key) {
  // Gloo gets keys it has not waited for: wait first so the deadline is ours, not the store's
  // default.
  store_->wait({join(key)}, waitTimeout_);
  store::Bytes value = store_->get(join(key));
  return std::vector<char>(value.begin(), value.end());
}

void GlooStore::wait(const std::vector<std::string>& keys) { wait(keys, waitTimeout_); }

void GlooStore::wait(const std::vector<std::string>& keys,
                     const std::chrono::milliseconds& timeout) {
  std::vector<std::string> joined;
  joined.reserve(keys.size());
  for (const auto& k : keys) joined.push_back(join(k));
  // Our deadline, not Gloo's built-in 30 s default: the connect timeout is the caller's choice.
  (void)timeout;
  store_->wait(joined, waitTimeout_);
}

}  // namespace dtrain::comm
