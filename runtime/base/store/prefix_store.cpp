#include "dtrain/base/error.h"
#include "dtrain/base/store.h"

namespace dtrain::store {

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> inner)
    : prefix_(std::move(prefix)), inner_(std::move(inner)) {
  DTRAIN_CHECK_ARG(inner_ != nullptr, "PrefixStore(\"{}\") needs an inner store", prefix_);
}

std::vector<std::string> PrefixStore::join(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& k : keys) out.push_back(join(k));
  return out;
}

void PrefixStore::set(const std::string& key, const Bytes& value) { inner_->set(join(key), value); }
Bytes PrefixStore::get(const std::string& key) { return inner_->get(join(key)); }
int64_t PrefixStore::add(const std::string& key, int64_t delta) {
  return inner_->add(join(key), delta);
}
Bytes PrefixStore::compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) {
  return inner_->compareSet(join(key), expected, desired);
}
void PrefixStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  inner_->wait(join(keys), timeout);
}
bool PrefixStore::check(const std::vector<std::string>& keys) { return inner_->check(join(keys)); }
bool PrefixStore::deleteKey(const std::string& key) { return inner_->deleteKey(join(key)); }
int64_t PrefixStore::numKeys() { return inner_->numKeys(); }
std::vector<std::optional<Bytes>> PrefixStore::tryMultiGet(const std::vector<std::string>& keys) {
  return inner_->tryMultiGet(join(keys));
}
Bytes PrefixStore::waitChanged(const std::string& key, const Bytes& seen, Millis timeout) {
  return inner_->waitChanged(join(key), seen, timeout);
}
std::string PrefixStore::describe() const { return inner_->describe(); }

}  // namespace dtrain::store
