#pragma once
// The server's data: the key-value map and the index of parked requests. Pure logic, no I/O, so
// it is unit-testable without sockets; the server's event loop is its only caller (not
// thread-safe).
//
// Note [Parked requests]
// A Get or Wait on missing keys costs no thread: the connection registers itself as a Waiter
// under each missing key and the request stays parked until a Set/Add/CompareSet creates the last
// of them, or until its server-side deadline (the connection's timer) answers Timeout. A
// WaitChanged is parked the same way under its one key, present or not, until a write leaves
// the key holding something other than the value the client has seen. The
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
  // `maxValueBytes`: what one MultiGet may answer in values, in all (StoreLimits).
  explicit KvTable(size_t maxValueBytes = StoreLimits{}.maxValueBytes)
      : maxValueBytes_(maxValueBytes) {}

  class Waiter {
   public:
    virtual ~Waiter() = default;
    // The parked request can be answered now (its keys exist; a WaitChanged's key changed) and
    // the waiter is no longer registered. Called from inside execute(): it must not call back
    // into the table's mutating methods.
    virtual void onKeysReady() = 0;

   private:
    friend class KvTable;
    const wire::Request* request_ = nullptr;  // the parked request
    std::vector<std::string> registeredUnder_;
  };

  // Runs `request`. Returns the response frame, or nothing when the request (Get or Wait on a
  // missing key) was parked with `waiter` registered; the caller keeps `request` alive until it
  // answers it with answerParked() or timeoutResponse(), or cancel()s it. A Set moves its value
  // out of `request` (values may be 64 MiB: no copy).
  std::optional<Bytes> execute(wire::Request& request, Waiter* waiter);
  // The answer to a parked Get/Wait whose keys now exist (a WaitChanged whose key changed).
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
  // Whether a Get, Wait or WaitChanged can be answered now.
  bool ready(const wire::Request& request) const;
  Bytes multiGet(const wire::Request& request) const;
  void registerMissing(Waiter* waiter);
  // Wakes the waiters listed under `key`, which was just created or changed.
  void notify(const std::string& key);

  size_t maxValueBytes_;
  std::unordered_map<std::string, Bytes> map_;
  std::unordered_map<std::string, std::vector<Waiter*>> waiters_;
};

}  // namespace dtrain::store
