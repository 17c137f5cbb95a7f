#pragma once
// The job's store as a worker sees it: a TcpStore client built from the environment the launcher
// sets (DTRAIN_STORE_ADDR, DTRAIN_STORE_PORT, DTRAIN_STORE_TOKEN: docs/design.md#store), wrapped in
// the restart round's prefix ("round<DTRAIN_RESTART_COUNT>/").

#include <memory>

#include "dtrain/base/store.h"

namespace dtrain::store {

// Zero timeouts: the defaults (Note [Zero timeouts] in dtrain/base/timeout.h).
struct JobStoreOptions {
  Millis connectTimeout{60000};
  Millis timeout = kDefaultStoreTimeout;  // every operation
};

// Throws InvalidArgument naming a missing or malformed variable ("... is not set; HINT: start
// the program with `launch`, which sets it"), NetworkError/TimeoutError when the store cannot be
// reached. The returned store is the round's PrefixStore; its inner() is the job-wide store.
std::shared_ptr<PrefixStore> connectToJobStore(const JobStoreOptions& options = {});

}  // namespace dtrain::store
