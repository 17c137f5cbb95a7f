#pragma once
// The TcpStore wire format: encoders and an incremental, allocation-bounded request parser. The
// server, the client, the golden-bytes test and the fuzz target all go through this file, so the
// format lives in exactly one place.
//
// Note [Store wire format]
// Every integer is little-endian. A connection opens with a fixed-size handshake, then carries
// request frames from the client and one response frame to each, in order: the server answers
// the requests of one connection in the order they came. The client sends a Get, Wait, Add,
// CompareSet, Check, Delete or NumKeys only when every earlier request has been answered; Set
// requests it may pipeline -- send several without waiting, and read their (empty) answers
// later, see Note [Pipelined sets] in tcp_store_client.cpp. The other requests (MultiGet and
// WaitChanged too) go out one at a time.
//
// Handshake. Every message has a fixed size, so the server reads nothing of variable length from
// a client that has not proven it holds the job token (docs/design.md#authentication).
//   1. Hello, client -> server, 40 bytes
//        [0..3]   magic "DTST"
//        [4]      wire version, 1
//        [5]      flags: bit 0 = the client holds a job token; other bits 0
//        [6..7]   reserved, 0
//        [8..39]  client nonce: 32 random bytes
//   2. Challenge, server -> client, 72 bytes
//        [0..3]   magic "DTST"
//        [4]      the server's wire version (the server closes after this when the client's
//                 version differs, so the client can say which versions met)
//        [5]      flags: bit 0 = the server requires a job token; other bits 0
//        [6..7]   reserved, 0
//        [8..39]  server nonce: 32 random bytes
//        [40..71] server proof: HMAC-SHA256(token, "dtrain-store-server-v1" || client nonce ||
//                 server nonce); 32 zero bytes when the server has no token
//   3. Proof, client -> server, 32 bytes
//        [0..31]  client proof: HMAC-SHA256(token, "dtrain-store-client-v1" || server nonce ||
//                 client nonce); 32 zero bytes when the server has no token
//   4. Verdict, server -> client, 8 bytes
//        [0..3]   magic "DTST"
//        [4]      0 accepted; 1 wrong token (the server closes after sending it)
//        [5..7]   reserved, 0
// The client checks the server's proof before sending its own: a worker never talks to the store
// of another job that happens to listen on the same port. Neither side sends the token itself;
// the distinct labels keep one side's proof from being replayed as the other's. See
// Note [Store authentication] in auth.h.
//
// Frames, both directions: a 12-byte header, then the payload.
//   [0..7]   payload length N (u64), not counting the header
//   [8]      wire version, 1
//   [9]      type: the opcode (Op) in a request, the status (Status) in a response
//   [10..11] reserved, 0
//   [12..]   payload, N bytes
// Payload fields:
//   u64 / i64   8 bytes
//   bytes       u64 length L, then L bytes (keys and values)
//   keys        u64 count C, then C times `bytes`
// Requests and their Ok payloads:
//   1 Set         key, value                     -> empty
//   2 Get         u64 timeout_ms, key            -> value
//   3 Add         key, i64 delta                 -> i64 the new value
//   4 CompareSet  key, expected, desired         -> bytes: the value now stored, or `expected`
//                                                   when the key is absent and expected is not
//                                                   empty (c10d's semantics)
//   5 Wait        u64 timeout_ms, keys           -> empty
//   6 Check       keys                           -> u8 1 when every key exists, else 0
//   7 Delete      key                            -> u8 1 when the key existed, else 0
//   8 NumKeys     (empty)                        -> i64
//   9 MultiGet    keys                           -> u64 count C (= the keys'), then per key u8 1
//                                                   and `bytes` its value, or u8 0 when absent;
//                                                   never waits. The values together are at most
//                                                   the value limit (else Error naming the keys)
//  10 WaitChanged u64 timeout_ms, key, seen      -> bytes: the value, once the key exists and
//                                                   holds something other than `seen` (a counter
//                                                   or a state key watched without polling)
// Opcodes 9 and 10 came with launch's agent protocol 3 (docs/design.md#multi-node); a server
// without them refuses them by name ("unknown opcode 9"), which the client
// reports. The wire version stays 1: a frame of an older client is the same bytes.
// timeout_ms is the server-side deadline of a parked Get/Wait/WaitChanged; 0 on the wire makes
// the server answer at once. The client never sends 0 for a caller's zero timeout:
// that is the store's
// default deadline (Note [Zero timeouts] in dtrain/base/timeout.h), resolved before sending.
// Other statuses:
//   1 Timeout     (Get, Wait, WaitChanged) the server-side deadline passed: u64 count, then count
//                 u64 indices into the request's keys of those still missing (WaitChanged: its
//                 key, index 0). The connection stays usable.
//   2 Error       bytes: a message (e.g. Add on a key that holds no integer). The connection
//                 stays usable.
//   3 Refused     bytes: a message. The request broke the protocol or a limit; the server
//                 closes the connection after sending this.
//
// Limits (StoreLimits: key, value, keys per request) bound each field, and so each opcode's
// largest payload; a header announcing more is refused as soon as its 12 bytes are in, before
// anything is allocated for the payload, and every count or length inside a payload is checked
// against both the limit and the bytes actually present before it is used. See
// maxRequestPayload().

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/base/store.h"
#include "dtrain/base/tcp_store.h"

namespace dtrain::store::wire {

constexpr std::array<uint8_t, 4> kMagic{{'D', 'T', 'S', 'T'}};
constexpr uint8_t kVersion = 1;
constexpr size_t kNonceBytes = 32;
constexpr size_t kMacBytes = 32;
constexpr size_t kHelloBytes = 40;
constexpr size_t kChallengeBytes = 72;
constexpr size_t kProofBytes = 32;
constexpr size_t kVerdictBytes = 8;
constexpr uint8_t kFlagToken = 0x01;
constexpr uint8_t kVerdictAccepted = 0;
constexpr uint8_t kVerdictWrongToken = 1;

constexpr size_t kHeaderBytes = 12;
// Error messages from the server are cut to this many bytes.
constexpr size_t kMaxErrorBytes = 4096;

using Nonce = std::array<uint8_t, kNonceBytes>;
using Mac = std::array<uint8_t, kMacBytes>;

enum class Op : uint8_t {
  Set = 1,
  Get = 2,
  Add = 3,
  CompareSet = 4,
  Wait = 5,
  Check = 6,
  Delete = 7,
  NumKeys = 8,
  MultiGet = 9,
  WaitChanged = 10,
};

enum class Status : uint8_t { Ok = 0, Timeout = 1, Error = 2, Refused = 3 };

const char* opName(Op op);

// One decoded request. Single-key ops use keys[0]; `value` is Set's value and CompareSet's
// desired value; `expected` is CompareSet's expected value and WaitChanged's `seen`.
struct Request {
  Op op = Op::NumKeys;
  uint64_t timeoutMs = 0;
  int64_t delta = 0;
  std::vector<std::string> keys;
  Bytes expected;
  Bytes value;
};

struct Hello {
  uint8_t version = kVersion;
  uint8_t flags = 0;
  Nonce nonce{};
};

struct Challenge {
  uint8_t version = kVersion;
  uint8_t flags = 0;
  Nonce nonce{};
  Mac proof{};
};

// --- handshake -------------------------------------------------------------------------------

std::array<uint8_t, kHelloBytes> encodeHello(const Hello& hello);
std::array<uint8_t, kChallengeBytes> encodeChallenge(const Challenge& challenge);
std::array<uint8_t, kVerdictBytes> encodeVerdict(uint8_t verdict);
// False when the magic is wrong (not a dtrain store peer); the version is reported, not checked.
bool decodeHello(const uint8_t* data, Hello* out);
bool decodeChallenge(const uint8_t* data, Challenge* out);
// -1 when the magic is wrong, else the verdict byte.
int decodeVerdict(const uint8_t* data);

// --- frames ----------------------------------------------------------------------------------

// The largest payload a request with this opcode may carry under `limits` (saturating).
uint64_t maxRequestPayload(Op op, const StoreLimits& limits);
// The largest payload of any response under `limits`.
uint64_t maxResponsePayload(const StoreLimits& limits);

// A complete request frame (header included).
Bytes encodeRequest(const Request& request);
// The same bytes as encodeRequest() of a Set, without copying `value` into a Request first.
Bytes encodeSet(const std::string& key, const Bytes& value);
// A complete response frame with `payload`.
Bytes encodeResponse(Status status, const Bytes& payload);
// Ok carrying one `bytes` field, built in one allocation (values may be 64 MiB).
Bytes encodeValueResponse(const Bytes& value);
// Error (or Refused) with `message`, cut to kMaxErrorBytes.
Bytes encodeErrorResponse(const std::string& message, Status status = Status::Error);
// Payload encoders for responses.
Bytes encodeI64(int64_t v);
Bytes encodeU8(uint8_t v);
Bytes encodeBytes(const Bytes& v);
Bytes encodeIndices(const std::vector<uint64_t>& indices);
// MultiGet's Ok payload: one entry per key, nullopt for an absent one.
Bytes encodeMultiValues(const std::vector<const Bytes*>& values);
// And back; false when the payload does not have that shape for `keys` keys.
bool decodeMultiValues(const Bytes& payload, size_t keys, size_t maxValueBytes,
                       std::vector<std::optional<Bytes>>* out);

struct FrameHeader {
  uint64_t payloadBytes = 0;
  uint8_t version = 0;
  uint8_t type = 0;
  uint16_t reserved = 0;
};
FrameHeader decodeHeader(const uint8_t* data);

enum class ParseStatus { NeedMore, Ok, Bad };

struct ParseResult {
  ParseStatus status = ParseStatus::NeedMore;
  size_t consumed = 0;  // bytes of the frame, when Ok
  std::string error;    // why, when Bad
};

// Decodes one request frame from the front of `data`. NeedMore while the header or the payload
// is incomplete -- but a header that breaks a limit is Bad as soon as its 12 bytes are in. Never
// allocates more than the bytes present justify.
ParseResult parseRequest(const uint8_t* data, size_t size, const StoreLimits& limits, Request* out);

// Reads payload fields with bounds checks; the client decodes responses with it.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : p_(data), left_(size) {}
  bool u8(uint8_t* v);
  bool u64(uint64_t* v);
  bool i64(int64_t* v);
  // A length-prefixed field of at most `max` bytes.
  bool bytes(size_t max, Bytes* v);
  bool string(size_t max, std::string* v);
  size_t left() const { return left_; }

 private:
  bool lengthOf(size_t max, size_t* n);
  const uint8_t* p_;
  size_t left_;
};

}  // namespace dtrain::store::wire
