// libFuzzer target (scripts/fuzz.sh): arbitrary bytes through the store's request parser, as the
// server would meet them after a handshake, and every request that parses through the key-value
// table. Checks, beyond "no crash, no leak, no UB":
//   - a frame that parses re-encodes to exactly the bytes it came from (one encoding per request);
//   - the parser never asks for more than a frame's limit, whatever the header says;
//   - parked waiters are all gone once cancelled.
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "store/kv_table.h"
#include "store/wire.h"

namespace {

using namespace dtrain::store;

struct Waiter : KvTable::Waiter {
  void onKeysReady() override {}
};

void check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Small limits reach the limit checks; the first byte picks them, so defaults are fuzzed too.
  StoreLimits limits;
  if (size > 0 && (data[0] & 1)) {
    limits.maxKeyBytes = 16;
    limits.maxValueBytes = 64;
    limits.maxKeysPerRequest = 4;
  }
  KvTable table;
  std::vector<std::unique_ptr<Waiter>> waiters;
  std::vector<std::unique_ptr<wire::Request>> parked;
  size_t at = 0;
  while (at < size) {
    auto request = std::make_unique<wire::Request>();
    wire::ParseResult r = wire::parseRequest(data + at, size - at, limits, request.get());
    if (r.status != wire::ParseStatus::Ok) {
      if (size - at >= wire::kHeaderBytes && r.status == wire::ParseStatus::NeedMore) {
        // Waiting for more is only allowed for a payload within the opcode's limit.
        wire::FrameHeader h = wire::decodeHeader(data + at);
        check(h.payloadBytes <= wire::maxRequestPayload(static_cast<wire::Op>(h.type), limits));
      }
      break;
    }
    check(r.consumed <= size - at);
    Bytes again = wire::encodeRequest(*request);
    check(again.size() == r.consumed && std::memcmp(again.data(), data + at, r.consumed) == 0);
    at += r.consumed;
    // Short timeouts park; the table must survive any sequence of requests.
    auto waiter = std::make_unique<Waiter>();
    if (!table.execute(*request, waiter.get()).has_value()) {
      waiters.push_back(std::move(waiter));
      parked.push_back(std::move(request));
    }
  }
  for (auto& w : waiters) table.cancel(w.get());
  check(table.numRegistrations() == 0);
  // The handshake decoders take fixed sizes; give them whatever is there.
  if (size >= wire::kChallengeBytes) {
    wire::Challenge c;
    wire::decodeChallenge(data, &c);
    wire::Hello h;
    wire::decodeHello(data, &h);
  }
  return 0;
}
