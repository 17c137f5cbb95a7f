#include "store_collective_check.h"

#include <cstring>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dtrain/base/error.h"

namespace dtrain::comm {

namespace {

std::string keyOf(const std::string& prefix, uint64_t seq, int rank) {
  return fmt::format("{}/{}/{}", prefix, seq, rank);
}

}  // namespace

// See Note [Collective check through the store].
void checkCollectiveThroughStore(store::Store& store, const std::string& prefix, int rank, int size,
                                 const CollectiveInfo& info, Millis timeout,
                                 const std::string& who) {
  if (size == 1) return;
  const Fingerprint mine = Fingerprint::of(info);
  const auto* raw = reinterpret_cast<const uint8_t*>(&mine);
  store.set(keyOf(prefix, info.seq, rank), store::Bytes(raw, raw + sizeof(mine)));

  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) {
    if (r != rank) keys.push_back(keyOf(prefix, info.seq, r));
  }
  try {
    store.wait(keys, timeout);
  } catch (const TimeoutError&) {
    std::vector<int> missing;
    for (int r = 0; r < size; ++r) {
      if (r != rank && !store.check({keyOf(prefix, info.seq, r)})) missing.push_back(r);
    }
    DTRAIN_THROW(TimeoutError,
                 "{}: collective check of {}: rank(s) {} did not reach seq {} within {} ms. HINT: "
                 "they are behind (a collective skipped on this rank's side?), skipped it, or "
                 "are stuck outside the communicator",
                 who, info.describeWithSeq(), fmt::join(missing, ", "), info.seq, timeout.count());
  }

  std::vector<std::string> differ;
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    const store::Bytes bytes = store.get(keyOf(prefix, info.seq, r));
    Fingerprint theirs{};
    DTRAIN_CHECK(bytes.size() == sizeof(theirs),
                 "{}: collective check: rank {}'s fingerprint has {} bytes, expected {} (another "
                 "dtrain version?)",
                 who, r, bytes.size(), sizeof(theirs));
    std::memcpy(&theirs, bytes.data(), sizeof(theirs));
    if (theirs.seq != mine.seq || !theirs.sameCollective(mine)) {
      differ.push_back(fmt::format("rank {} calls {}", r, theirs.toInfo().describeWithSeq()));
    }
  }
  if (info.seq > 0) store.deleteKey(keyOf(prefix, info.seq - 1, rank));
  if (!differ.empty()) {
    DTRAIN_THROW(InvalidArgument,
                 "{}: collective check failed: this rank calls {}; {}. HINT: every rank must issue "
                 "the same collectives, in the same order, with the same types and shapes",
                 who, info.describeWithSeq(), fmt::join(differ, "; "));
  }
}

}  // namespace dtrain::comm
