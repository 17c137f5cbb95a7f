#pragma once
// The collective check (DTRAIN_CHECK_COLLECTIVES=1) through the store, for a backend that cannot
// exchange fingerprints over its own connections cheaply (NCCL: a device round trip and a host
// synchronisation per collective). Torch- and CUDA-free.
//
// Note [Collective check through the store]
// Before each collective, every rank posts the fingerprint of what it is about to call under
// "<prefix>/<seq>/<rank>", waits for every other rank's, and compares: a different kind, type,
// count, reduction, root or shape fails every rank at once naming both sides, before the
// collective runs, so a wrong-sized buffer or a skipped collective never turns into a hang. A
// rank deletes its key of the previous collective once it has read everyone's for this one: a
// rank posts seq s only after reading all of seq s - 1, so nobody needs it any more, and the
// store holds at most two fingerprints per rank. It costs a few store round trips per collective:
// a debugging aid, like c10d's TORCH_DISTRIBUTED_DEBUG=DETAIL.

#include <string>

#include "collective.h"
#include "dtrain/base/store.h"

namespace dtrain::comm {

// Throws InvalidArgument naming every rank that calls something else than `info` ("rank 1 calls
// seq 3 allreduce(float32 x 1023, sum)"), TimeoutError naming the ranks whose fingerprint did not
// arrive within `timeout` (behind, skipped it, or stuck). `who`: "rank 0/4", for the messages.
void checkCollectiveThroughStore(store::Store& store, const std::string& prefix, int rank, int size,
                                 const CollectiveInfo& info, Millis timeout,
                                 const std::string& who);

}  // namespace dtrain::comm
