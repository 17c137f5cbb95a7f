#pragma once
// The key-value store every rendezvous in dtrain goes through.
//
// `Store` is the small interface (c10d's shape); implementations:
//   - TcpStore (dtrain/base/tcp_store.h): client of a TcpStoreServer, the job's rendezvous store;
//   - HashStore: in-process, for tests and for ranks run as threads;
//   - PrefixStore: a view of another store with every key under "prefix/" (restart rounds).
// Every blocking call has a deadline; a deadline that passes throws TimeoutError naming the keys,
// the store and the time waited. A zero timeout is the store's timeout() (Note [Zero timeouts] in
// dtrain/base/timeout.h); check() looks without waiting.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "dtrain/base/timeout.h"

namespace dtrain::store {

using Bytes = std::vector<uint8_t>;
using Millis = std::chrono::milliseconds;

constexpr Millis kDefaultStoreTimeout{300000};

Bytes toBytes(const std::string& s);
std::string toString(const Bytes& b);

// Note [Store calls with a deadline]
// A TcpStore call waits as long as the store's timeouts allow: a lost connection is opened again
// for up to connectTimeout (60 s by default), an answer awaited for up to the request timeout
// (5 min). A caller on a failure path that must end within a grace of its own -- the ranks
// comparing notes after a collective failed, when the rank that hosted the store may be gone
// too -- bounds the TcpStore round trips its thread makes while a ScopedStoreDeadline lives: a
// reconnect gives up and a request's answer is awaited no later than `deadline` (TimeoutError or
// NetworkError, as at their own limits). Not bounded: waiting for the acknowledgements of
// pipelined sets (flush()), which keeps the request timeout; a store whose host has gone closes
// the connection, so that fails at once. Other threads and other stores are not affected.
class ScopedStoreDeadline {
 public:
  explicit ScopedStoreDeadline(std::chrono::steady_clock::time_point deadline);
  ~ScopedStoreDeadline();
  ScopedStoreDeadline(const ScopedStoreDeadline&) = delete;
  ScopedStoreDeadline& operator=(const ScopedStoreDeadline&) = delete;
  // The innermost deadline of this thread, if any.
  static std::optional<std::chrono::steady_clock::time_point> current();

 private:
  std::optional<std::chrono::steady_clock::time_point> previous_;
};

class Store {
 public:
  virtual ~Store() = default;

  // The value may be applied only after set() returns (TcpStore pipelines sets); any later
  // call on the same handle sees it, and flush() waits for it.
  virtual void set(const std::string& key, const Bytes& value) = 0;
  // Returns once every earlier set() of this handle is applied, rethrowing the first error of
  // one whose failure no call has reported yet. Stores whose set() waits need nothing here.
  virtual void flush() {}
  // Blocks until `key` exists or timeout() passes (TimeoutError).
  virtual Bytes get(const std::string& key) = 0;
  // Atomically adds `delta` to the int64 stored at `key` (absent = 0) and returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // c10d's semantics: if `key` holds `expected` (or is absent and `expected` is empty) it becomes
  // `desired`. Returns the value now stored, or `expected` when the key is absent and `expected` is
  // not empty.
  virtual Bytes compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) = 0;
  // Blocks until every key exists or `timeout` passes (TimeoutError naming the missing keys).
  // Zero: timeout(), the store's default deadline, not "check now" (Note [Zero timeouts]);
  // negative: InvalidArgument.
  virtual void wait(const std::vector<std::string>& keys, Millis timeout) = 0;
  void wait(const std::vector<std::string>& keys) { wait(keys, timeout()); }
  // True when every key exists; never blocks. The way to look without waiting.
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // True when the key existed.
  virtual bool deleteKey(const std::string& key) = 0;
  virtual int64_t numKeys() = 0;

  // Deadline of get(), of wait() without one, and of every network round trip. setTimeout(0)
  // restores the default (kDefaultStoreTimeout); negative: InvalidArgument.
  virtual Millis timeout() const { return timeout_; }
  virtual void setTimeout(Millis timeout) {
    timeout_ = timeoutOrDefault(timeout, kDefaultStoreTimeout, "Store::setTimeout");
  }

  // Human-readable location for error messages ("127.0.0.1:29400", "HashStore").
  virtual std::string describe() const = 0;

  // Declared after every older virtual, so that programs built against an earlier libdtrain_base
  // keep their vtable offsets.
  // The values of `keys` as they are now, in order, nullopt for a key that does not exist; never
  // blocks. One request however many keys (a coordinator reading every node's counter at once);
  // on a TcpStore the values together may be at most StoreLimits::maxValueBytes. The default
  // asks key by key; the stores of this library override it.
  virtual std::vector<std::optional<Bytes>> tryMultiGet(const std::vector<std::string>& keys);
  // Blocks until `key` exists and holds a value other than `seen`, and returns that value: a
  // counter or a state key watched without polling (`seen` is the value last read; empty before
  // the first). TimeoutError naming the key after `timeout` (zero: timeout(); negative:
  // InvalidArgument). The default polls every 10 ms; the stores of this library override it.
  virtual Bytes waitChanged(const std::string& key, const Bytes& seen, Millis timeout);

  // Conveniences over set/get for text values.
  void setString(const std::string& key, const std::string& value) { set(key, toBytes(value)); }
  std::string getString(const std::string& key) { return toString(get(key)); }

 protected:
  // What a wait(keys, requested) waits: `requested`, or timeout() when it is zero.
  Millis waitTimeout(Millis requested) const {
    return timeoutOrDefault(requested, timeout(), "Store::wait timeout");
  }

  Millis timeout_{kDefaultStoreTimeout};
};

// In-process store: one mutex and one condition variable. Cheap; use it in tests that need a
// store but are not about stores, and for ranks run as threads (share one instance).
class HashStore : public Store {
 public:
  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  void wait(const std::vector<std::string>& keys, Millis timeout) override;
  using Store::wait;
  bool check(const std::vector<std::string>& keys) override;
  bool deleteKey(const std::string& key) override;
  int64_t numKeys() override;
  std::vector<std::optional<Bytes>> tryMultiGet(const std::vector<std::string>& keys) override;
  Bytes waitChanged(const std::string& key, const Bytes& seen, Millis timeout) override;
  std::string describe() const override { return "HashStore"; }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::unordered_map<std::string, Bytes> map_;  // guarded by mutex_
};

// Every key of `inner` seen through "prefix/". Restart rounds use PrefixStore("round<N>", store).
class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> inner);

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  void wait(const std::vector<std::string>& keys, Millis timeout) override;
  using Store::wait;
  bool check(const std::vector<std::string>& keys) override;
  bool deleteKey(const std::string& key) override;
  // Counts the keys of the inner store (all prefixes), as c10d's PrefixStore does.
  int64_t numKeys() override;
  std::vector<std::optional<Bytes>> tryMultiGet(const std::vector<std::string>& keys) override;
  Bytes waitChanged(const std::string& key, const Bytes& seen, Millis timeout) override;
  void flush() override { inner_->flush(); }
  Millis timeout() const override { return inner_->timeout(); }
  void setTimeout(Millis timeout) override { inner_->setTimeout(timeout); }
  std::string describe() const override;

  const std::string& prefix() const { return prefix_; }
  const std::shared_ptr<Store>& inner() const { return inner_; }

 private:
  std::string join(const std::string& key) const { return prefix_ + "/" + key; }
  std::vector<std::string> join(const std::vector<std::string>& keys) const;

  std::string prefix_;
  std::shared_ptr<Store> inner_;
};

// The prefix of restart round N: "round<N>" (docs/design.md#store).
std::string roundPrefix(int round);

}  // namespace dtrain::store
