#include "store/kv_table.h"

#include <algorithm>
#include <string_view>

#include <fmt/format.h>

#include "parse_int.h"

namespace dtrain::store {

namespace {

using wire::Op;
using wire::Status;

Bytes ok(const Bytes& payload = {}) { return wire::encodeResponse(Status::Ok, payload); }

// Same rule as HashStore: the whole value must be a decimal int64.
bool parseCounter(const Bytes& value, int64_t* out) {
  return parseInt64(std::string_view(reinterpret_cast<const char*>(value.data()), value.size()),
                    out);
}

}  // namespace

std::optional<Bytes> KvTable::execute(wire::Request& r, Waiter* waiter) {
  static const std::string kNoKey;
  const std::string& key = r.keys.empty() ? kNoKey : r.keys[0];
  switch (r.op) {
    case Op::Set:
      map_[key] = std::move(r.value);
      notify(key);
      return ok();
    case Op::Get:
    case Op::Wait:
    case Op::WaitChanged:
      if (ready(r)) return answerParked(r);
      if (r.timeoutMs == 0) return timeoutResponse(r);
      waiter->request_ = &r;
      registerMissing(waiter);
      return std::nullopt;
    case Op::MultiGet: return multiGet(r);
    case Op::Add: {
      auto it = map_.find(key);
      int64_t before = 0;
      if (it != map_.end() && !parseCounter(it->second, &before)) {
        std::string shown(it->second.begin(),
                          it->second.begin() + std::min<size_t>(it->second.size(), 32));
        return wire::encodeErrorResponse(
            fmt::format("store key \"{}\" holds \"{}\", not an integer: add() needs a counter key",
                        key, shown));
      }
      int64_t now = 0;
      if (__builtin_add_overflow(before, r.delta, &now)) {
        return wire::encodeErrorResponse(
            fmt::format("store key \"{}\": add({}) to {} overflows int64", key, r.delta, before));
      }
      std::string text = std::to_string(now);
      map_[key] = Bytes(text.begin(), text.end());
      notify(key);
      return ok(wire::encodeI64(now));
    }
    case Op::CompareSet: {
      auto it = map_.find(key);
      if (it == map_.end()) {
        if (!r.expected.empty()) return wire::encodeValueResponse(r.expected);
        map_[key] = r.value;
      } else if (it->second == r.expected) {
        it->second = r.value;
      } else {
        return wire::encodeValueResponse(it->second);
      }
      notify(key);
      return wire::encodeValueResponse(r.value);
    }
    case Op::Check: return ok(wire::encodeU8(allPresent(r.keys) ? 1 : 0));
    case Op::Delete: return ok(wire::encodeU8(map_.erase(key) > 0 ? 1 : 0));
    case Op::NumKeys: return ok(wire::encodeI64(static_cast<int64_t>(map_.size())));
  }
  return wire::encodeErrorResponse("unknown opcode");
}

Bytes KvTable::answerParked(const wire::Request& r) const {
  if (r.op == Op::Get || r.op == Op::WaitChanged) {
    return wire::encodeValueResponse(map_.at(r.keys[0]));
  }
  return ok();
}

Bytes KvTable::timeoutResponse(const wire::Request& r) const {
  std::vector<uint64_t> missing;
  for (size_t i = 0; i < r.keys.size(); ++i) {
    if (r.op == Op::WaitChanged || !map_.count(r.keys[i])) missing.push_back(i);
  }
  return wire::encodeResponse(Status::Timeout, wire::encodeIndices(missing));
}

bool KvTable::ready(const wire::Request& r) const {
  if (r.op != Op::WaitChanged) return allPresent(r.keys);
  auto it = map_.find(r.keys[0]);
  return it != map_.end() && it->second != r.expected;
}

Bytes KvTable::multiGet(const wire::Request& r) const {
  std::vector<const Bytes*> values;
  values.reserve(r.keys.size());
  size_t total = 0;
  for (const auto& k : r.keys) {
    auto it = map_.find(k);
    values.push_back(it == map_.end() ? nullptr : &it->second);
    if (it != map_.end()) total += it->second.size();
  }
  if (total > maxValueBytes_) {
    return wire::encodeErrorResponse(fmt::format(
        "multi-key get of {} keys (the first \"{}\") would answer {} bytes of values, more than "
        "the value limit of {}: ask for fewer keys at a time",
        r.keys.size(), r.keys[0], total, maxValueBytes_));
  }
  return ok(wire::encodeMultiValues(values));
}

void KvTable::cancel(Waiter* waiter) {
  for (const auto& key : waiter->registeredUnder_) {
    auto it = waiters_.find(key);
    if (it == waiters_.end()) continue;
    auto& list = it->second;
    list.erase(std::remove(list.begin(), list.end(), waiter), list.end());
    if (list.empty()) waiters_.erase(it);
  }
  waiter->registeredUnder_.clear();
}

size_t KvTable::numRegistrations() const {
  size_t n = 0;
  for (const auto& entry : waiters_) n += entry.second.size();
  return n;
}

bool KvTable::allPresent(const std::vector<std::string>& keys) const {
  return std::all_of(keys.begin(), keys.end(), [&](const auto& k) { return map_.count(k) > 0; });
}

void KvTable::registerMissing(Waiter* waiter) {
  const bool watching = waiter->request_->op == Op::WaitChanged;  // its key, present or not
  for (const auto& key : waiter->request_->keys) {
    if (!watching && map_.count(key)) continue;
    auto& list = waiters_[key];
    // A request may name a key twice; list the waiter once.
    if (std::find(list.begin(), list.end(), waiter) != list.end()) continue;
    list.push_back(waiter);
    waiter->registeredUnder_.push_back(key);
  }
}

void KvTable::notify(const std::string& key) {
  auto it = waiters_.find(key);
  if (it == waiters_.end()) return;
  std::vector<Waiter*> woken = std::move(it->second);
  waiters_.erase(it);
  std::vector<Waiter*> answerable;
  for (Waiter* w : woken) {
    // Already off this key's list; take it off the others, then re-check everything.
    auto& under = w->registeredUnder_;
    under.erase(std::remove(under.begin(), under.end(), key), under.end());
    cancel(w);
    if (ready(*w->request_)) {
      answerable.push_back(w);
    } else {
      registerMissing(w);
    }
  }
  for (Waiter* w : answerable) w->onKeysReady();
}

}  // namespace dtrain::store
