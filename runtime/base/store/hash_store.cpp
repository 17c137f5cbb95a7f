#include <algorithm>
#include <cstring>
#include <thread>

#include "dtrain/base/error.h"
#include "dtrain/base/store.h"
#include "parse_int.h"

namespace dtrain::store {

Bytes toBytes(const std::string& s) { return Bytes(s.begin(), s.end()); }
std::string toString(const Bytes& b) { return std::string(b.begin(), b.end()); }

std::string roundPrefix(int round) { return "round" + std::to_string(round); }

namespace {

std::string joinKeys(const std::vector<std::string>& keys) {
  std::string out;
  for (const auto& k : keys) {
    if (!out.empty()) out += ", ";
    out += '"' + k + '"';
  }
  return out;
}

int64_t parseCounter(const std::string& key, const Bytes& value) {
  std::string text = toString(value);
  int64_t v = 0;
  DTRAIN_CHECK_ARG(parseInt64(text, &v),
                   "store key \"{}\" holds \"{}\", not an integer: add() needs a counter key", key,
                   text.substr(0, 32));
  return v;
}

}  // namespace

void HashStore::set(const std::string& key, const Bytes& value) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    map_[key] = value;
  }
  changed_.notify_all();
}

Bytes HashStore::get(const std::string& key) {
  wait({key}, timeout());
  std::lock_guard<std::mutex> lock(mutex_);
  return map_.at(key);
}

int64_t HashStore::add(const std::string& key, int64_t delta) {
  int64_t now;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = map_.find(key);
    int64_t before = it == map_.end() ? 0 : parseCounter(key, it->second);
    now = before + delta;
    map_[key] = toBytes(std::to_string(now));
  }
  changed_.notify_all();
  return now;
}

Bytes HashStore::compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) {
  Bytes result;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = map_.find(key);
    if (it == map_.end()) {
      if (!expected.empty()) return expected;
      map_[key] = desired;
      result = desired;
    } else if (it->second == expected) {
      it->second = desired;
      result = desired;
    } else {
      return it->second;
    }
  }
  changed_.notify_all();
  return result;
}

void HashStore::wait(const std::vector<std::string>& keys, Millis requested) {
  const Millis timeout = waitTimeout(requested);
  auto all = [&] {
    return std::all_of(keys.begin(), keys.end(), [&](const auto& k) { return map_.count(k) > 0; });
  };
  std::unique_lock<std::mutex> lock(mutex_);
  if (changed_.wait_for(lock, timeout, all)) return;
  std::vector<std::string> missing;
  for (const auto& k : keys) {
    if (!map_.count(k)) missing.push_back(k);
  }
  DTRAIN_THROW(TimeoutError, "timed out after {} ms waiting for key(s) {} on {}", timeout.count(),
               joinKeys(missing), describe());
}

bool HashStore::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::all_of(keys.begin(), keys.end(), [&](const auto& k) { return map_.count(k) > 0; });
}

bool HashStore::deleteKey(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  return map_.erase(key) > 0;
}

int64_t HashStore::numKeys() {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(map_.size());
}

std::vector<std::optional<Bytes>> HashStore::tryMultiGet(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::optional<Bytes>> out;
  out.reserve(keys.size());
  for (const auto& k : keys) {
    auto it = map_.find(k);
    out.push_back(it == map_.end() ? std::nullopt : std::optional<Bytes>(it->second));
  }
  return out;
}

Bytes HashStore::waitChanged(const std::string& key, const Bytes& seen, Millis requested) {
  const Millis timeout = waitTimeout(requested);
  std::unique_lock<std::mutex> lock(mutex_);
  auto changed = [&] {
    auto it = map_.find(key);
    return it != map_.end() && it->second != seen;
  };
  if (!changed_.wait_for(lock, timeout, changed)) {
    DTRAIN_THROW(TimeoutError,
                 "timed out after {} ms waiting for key \"{}\" to change from \"{}\" "
                 "on {}",
                 timeout.count(), key, toString(seen).substr(0, 64), describe());
  }
  return map_.at(key);
}

// The defaults, for stores outside this library.
std::vector<std::optional<Bytes>> Store::tryMultiGet(const std::vector<std::string>& keys) {
  std::vector<std::optional<Bytes>> out;
  out.reserve(keys.size());
  for (const auto& k : keys) {
    out.push_back(check({k}) ? std::optional<Bytes>(get(k)) : std::nullopt);
  }
  return out;
}

Bytes Store::waitChanged(const std::string& key, const Bytes& seen, Millis requested) {
  const Millis timeout = waitTimeout(requested);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    std::optional<Bytes> now = tryMultiGet({key})[0];
    if (now && *now != seen) return *now;
    if (std::chrono::steady_clock::now() >= deadline) {
      DTRAIN_THROW(TimeoutError,
                   "timed out after {} ms waiting for key \"{}\" to change from "
                   "\"{}\" on {}",
                   timeout.count(), key, toString(seen).substr(0, 64), describe());
    }
    std::this_thread::sleep_for(Millis(10));
  }
}

}  // namespace dtrain::store
