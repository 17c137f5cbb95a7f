#pragma once
// The server's data: the key-value map and the index of parked requests. Pure logic, no I/O, so
// it is unit-testable without sockets; the server's event loop is its only caller (not
// thread-safe).
//
// Note [Parked requests]
// A Get or Wait on missing keys costs no thread: the connection registers itself as a Waiter
// under each missing key and the request stays parked until a Set/Add/CompareSet creates the last
// of them, or until its server-side deadline (the connection's timer) answers Timeout. The
// server, not the client, times requests out so that every request gets exactly one answer and
// the connection stays in step after a timeout (docs/reliability.md S11). A waiter is re-checked
// against *all* its keys when woken, because a Delete may have removed one it saw before. A
// closing connection cancels its registration, so dropped clients never leave waiters behind.

#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "store/wire.h"

namespace dtrain::store {

class KvTable {
 public:
  class Waiter {
   public:
    virtual ~Waiter() = default;
    // Every key of the parked request exists now and the waiter is no longer registered. Called
    // from inside execute(): it must not call back into the table's mutating methods.
    virtual void onKeysReady() = 0;

   private:
    friend class KvTable;
    const std::vector<std::string>* keys_ = nullptr;  // the parked request's keys
    std::vector<std::string> registeredUnder_;
  };

  // Runs `request`. Returns the response frame, or nothing when the request (Get or Wait on a
  // missing key) was parked with `waiter` registered; the caller keeps `request` alive until it
  // answers it with answerParked() or timeoutResponse(), or cancel()s it. A Set moves its value
  // out of `request` (values may be 64 MiB: no copy).
  std::optional<Bytes> execute(wire::Request& request, Waiter* waiter);
  // The answer to a parked Get/Wait whose keys now exist.
  Bytes answerParked(const wire::Request& request) const;
  // The Timeout answer naming the keys of `request` still missing.
  Bytes timeoutResponse(const wire::Request& request) const;
  // Unregisters a parked waiter (connection closed, or its deadline passed). Idempotent.
  void cancel(Waiter* waiter);

  size_t numKeys() const { return map_.size(); }
  // Registrations of parked waiters (each waiter counts once per missing key); tests check it
  // returns to zero when clients go away.
  size_t numRegistrations() const;

 private:
  bool allPresent(const std::vector<std::string>& keys) const;
  void registerMissing(Waiter* waiter);
  // Wakes the waiters listed under `key`, which was just created or changed.
  void notify(const std::string& key);

  std::unordered_map<std::string, Bytes> map_;
  std::unordered_map<std::string, std::vector<Waiter*>> waiters_;
};

}  // namespace dtrain::store
