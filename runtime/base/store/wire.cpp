#include "store/wire.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "byte_layout.h"

namespace dtrain::store::wire {

namespace {

constexpr uint64_t kU64Max = std::numeric_limits<uint64_t>::max();

uint64_t satAdd(uint64_t a, uint64_t b) { return a > kU64Max - b ? kU64Max : a + b; }
uint64_t satMul(uint64_t a, uint64_t b) {
  if (a != 0 && b > kU64Max / a) return kU64Max;
  return a * b;
}

class Writer {
 public:
  explicit Writer(Bytes* out) : out_(out) {}
  void u8(uint8_t v) { out_->push_back(v); }
  void u64(uint64_t v) {
    size_t at = out_->size();
    out_->resize(at + 8);
    putLE(out_->data() + at, v);
  }
  void bytes(const uint8_t* data, size_t n) {
    u64(n);
    out_->insert(out_->end(), data, data + n);
  }
  void bytes(const Bytes& v) { bytes(v.data(), v.size()); }
  void bytes(const std::string& v) { bytes(reinterpret_cast<const uint8_t*>(v.data()), v.size()); }
  void keys(const std::vector<std::string>& keys) {
    u64(keys.size());
    for (const auto& k : keys) bytes(k);
  }

 private:
  Bytes* out_;
};

// Starts a frame; finishFrame() fills in the length once the payload is written.
void startFrame(Bytes* out, uint8_t type) {
  out->resize(kHeaderBytes);
  (*out)[8] = kVersion;
  (*out)[9] = type;
  (*out)[10] = 0;
  (*out)[11] = 0;
}
void finishFrame(Bytes* out) { putLE(out->data(), out->size() - kHeaderBytes); }

uint64_t fieldBytes(uint64_t max) { return satAdd(8, max); }

bool knownOp(uint8_t type) { return type >= 1 && type <= static_cast<uint8_t>(Op::WaitChanged); }

}  // namespace

const char* opName(Op op) {
  switch (op) {
    case Op::Set: return "SET";
    case Op::Get: return "GET";
    case Op::Add: return "ADD";
    case Op::CompareSet: return "COMPARE_SET";
    case Op::Wait: return "WAIT";
    case Op::Check: return "CHECK";
    case Op::Delete: return "DELETE";
    case Op::NumKeys: return "NUM_KEYS";
    case Op::MultiGet: return "MULTI_GET";
    case Op::WaitChanged: return "WAIT_CHANGED";
  }
  return "UNKNOWN";
}

// --- handshake -------------------------------------------------------------------------------

std::array<uint8_t, kHelloBytes> encodeHello(const Hello& hello) {
  std::array<uint8_t, kHelloBytes> out{};
  std::copy(kMagic.begin(), kMagic.end(), out.begin());
  out[4] = hello.version;
  out[5] = hello.flags;
  std::copy(hello.nonce.begin(), hello.nonce.end(), out.begin() + 8);
  return out;
}

std::array<uint8_t, kChallengeBytes> encodeChallenge(const Challenge& challenge) {
  std::array<uint8_t, kChallengeBytes> out{};
  std::copy(kMagic.begin(), kMagic.end(), out.begin());
  out[4] = challenge.version;
  out[5] = challenge.flags;
  std::copy(challenge.nonce.begin(), challenge.nonce.end(), out.begin() + 8);
  std::copy(challenge.proof.begin(), challenge.proof.end(), out.begin() + 8 + kNonceBytes);
  return out;
}

std::array<uint8_t, kVerdictBytes> encodeVerdict(uint8_t verdict) {
  std::array<uint8_t, kVerdictBytes> out{};
  std::copy(kMagic.begin(), kMagic.end(), out.begin());
  out[4] = verdict;
  return out;
}

bool decodeHello(const uint8_t* data, Hello* out) {
  if (!std::equal(kMagic.begin(), kMagic.end(), data)) return false;
  out->version = data[4];
  out->flags = data[5];
  std::copy(data + 8, data + 8 + kNonceBytes, out->nonce.begin());
  return true;
}

bool decodeChallenge(const uint8_t* data, Challenge* out) {
  if (!std::equal(kMagic.begin(), kMagic.end(), data)) return false;
  out->version = data[4];
  out->flags = data[5];
  std::copy(data + 8, data + 8 + kNonceBytes, out->nonce.begin());
  std::copy(data + 8 + kNonceBytes, data + 8 + kNonceBytes + kMacBytes, out->proof.begin());
  return true;
}

int decodeVerdict(const uint8_t* data) {
  if (!std::equal(kMagic.begin(), kMagic.end(), data)) return -1;
  return data[4];
}

// --- frames ----------------------------------------------------------------------------------

uint64_t maxRequestPayload(Op op, const StoreLimits& limits) {
  const uint64_t key = fieldBytes(limits.maxKeyBytes);
  const uint64_t value = fieldBytes(limits.maxValueBytes);
  const uint64_t keys = satAdd(8, satMul(limits.maxKeysPerRequest, key));
  switch (op) {
    case Op::Set: return satAdd(key, value);
    case Op::Get: return satAdd(8, key);
    case Op::Add: return satAdd(key, 8);
    case Op::CompareSet: return satAdd(key, satMul(2, value));
    case Op::Wait: return satAdd(8, keys);
    case Op::Check: return keys;
    case Op::Delete: return key;
    case Op::NumKeys: return 0;
    case Op::MultiGet: return keys;
    case Op::WaitChanged: return satAdd(satAdd(8, key), value);
  }
  return 0;
}

uint64_t maxResponsePayload(const StoreLimits& limits) {
  uint64_t indices = satAdd(8, satMul(limits.maxKeysPerRequest, 8));
  // MultiGet: a flag and a length per key, and at most one value's worth of bytes in all.
  uint64_t multi = satAdd(satAdd(8, satMul(limits.maxKeysPerRequest, 9)), limits.maxValueBytes);
  return std::max({fieldBytes(limits.maxValueBytes), indices, fieldBytes(kMaxErrorBytes), multi});
}

Bytes encodeRequest(const Request& r) {
  Bytes out;
  startFrame(&out, static_cast<uint8_t>(r.op));
  Writer w(&out);
  static const std::string kNoKey;
  const std::string& key = r.keys.empty() ? kNoKey : r.keys[0];
  switch (r.op) {
    case Op::Set:
      w.bytes(key);
      w.bytes(r.value);
      break;
    case Op::Get:
      w.u64(r.timeoutMs);
      w.bytes(key);
      break;
    case Op::Add:
      w.bytes(key);
      w.u64(static_cast<uint64_t>(r.delta));
      break;
    case Op::CompareSet:
      w.bytes(key);
      w.bytes(r.expected);
      w.bytes(r.value);
      break;
    case Op::Wait:
      w.u64(r.timeoutMs);
      w.keys(r.keys);
      break;
    case Op::Check: w.keys(r.keys); break;
    case Op::Delete: w.bytes(key); break;
    case Op::NumKeys: break;
    case Op::MultiGet: w.keys(r.keys); break;
    case Op::WaitChanged:
      w.u64(r.timeoutMs);
      w.bytes(key);
      w.bytes(r.expected);
      break;
  }
  finishFrame(&out);
  return out;
}

Bytes encodeSet(const std::string& key, const Bytes& value) {
  Bytes out;
  out.reserve(kHeaderBytes + 16 + key.size() + value.size());
  startFrame(&out, static_cast<uint8_t>(Op::Set));
  Writer w(&out);
  w.bytes(key);
  w.bytes(value);
  finishFrame(&out);
  return out;
}

Bytes encodeResponse(Status status, const Bytes& payload) {
  Bytes out;
  out.reserve(kHeaderBytes + payload.size());
  startFrame(&out, static_cast<uint8_t>(status));
  out.insert(out.end(), payload.begin(), payload.end());
  finishFrame(&out);
  return out;
}

Bytes encodeValueResponse(const Bytes& value) {
  Bytes out;
  out.reserve(kHeaderBytes + 8 + value.size());
  startFrame(&out, static_cast<uint8_t>(Status::Ok));
  Writer(&out).bytes(value);
  finishFrame(&out);
  return out;
}

Bytes encodeErrorResponse(const std::string& message, Status status) {
  std::string cut = message.substr(0, kMaxErrorBytes);
  return encodeResponse(status, encodeBytes(Bytes(cut.begin(), cut.end())));
}

Bytes encodeI64(int64_t v) {
  Bytes out(8);
  putLE(out.data(), static_cast<uint64_t>(v));
  return out;
}

Bytes encodeU8(uint8_t v) { return Bytes{v}; }

Bytes encodeBytes(const Bytes& v) {
  Bytes out;
  out.reserve(8 + v.size());
  Writer(&out).bytes(v);
  return out;
}

Bytes encodeIndices(const std::vector<uint64_t>& indices) {
  Bytes out;
  Writer w(&out);
  w.u64(indices.size());
  for (uint64_t i : indices) w.u64(i);
  return out;
}

Bytes encodeMultiValues(const std::vector<const Bytes*>& values) {
  size_t total = 8;
  for (const Bytes* v : values) total += 1 + (v ? 8 + v->size() : 0);
  Bytes out;
  out.reserve(total);
  Writer w(&out);
  w.u64(values.size());
  for (const Bytes* v : values) {
    w.u8(v ? 1 : 0);
    if (v) w.bytes(*v);
  }
  return out;
}

bool decodeMultiValues(const Bytes& payload, size_t keys, size_t maxValueBytes,
                       std::vector<std::optional<Bytes>>* out) {
  Reader in(payload.data(), payload.size());
  uint64_t count = 0;
  if (!in.u64(&count) || count != keys) return false;
  out->assign(keys, std::nullopt);
  for (auto& v : *out) {
    uint8_t present = 0;
    if (!in.u8(&present) || present > 1) return false;
    if (present == 0) continue;
    v.emplace();
    if (!in.bytes(maxValueBytes, &*v)) return false;
  }
  return in.left() == 0;
}

FrameHeader decodeHeader(const uint8_t* data) {
  FrameHeader h;
  h.payloadBytes = getLE(data);
  h.version = data[8];
  h.type = data[9];
  h.reserved = static_cast<uint16_t>(data[10] | (data[11] << 8));
  return h;
}

// --- Reader ----------------------------------------------------------------------------------

bool Reader::u8(uint8_t* v) {
  if (left_ < 1) return false;
  *v = *p_;
  p_ += 1;
  left_ -= 1;
  return true;
}

bool Reader::u64(uint64_t* v) {
  if (left_ < 8) return false;
  *v = getLE(p_);
  p_ += 8;
  left_ -= 8;
  return true;
}

bool Reader::i64(int64_t* v) {
  uint64_t u;
  if (!u64(&u)) return false;
  *v = static_cast<int64_t>(u);
  return true;
}

bool Reader::lengthOf(size_t max, size_t* n) {
  uint64_t len;
  if (!u64(&len)) return false;
  // Checked against the limit and against what is actually there before anything is allocated.
  if (len > max || len > left_) return false;
  *n = static_cast<size_t>(len);
  return true;
}

bool Reader::bytes(size_t max, Bytes* v) {
  size_t n;
  if (!lengthOf(max, &n)) return false;
  v->assign(p_, p_ + n);
  p_ += n;
  left_ -= n;
  return true;
}

bool Reader::string(size_t max, std::string* v) {
  size_t n;
  if (!lengthOf(max, &n)) return false;
  v->assign(reinterpret_cast<const char*>(p_), n);
  p_ += n;
  left_ -= n;
  return true;
}

// --- request parser --------------------------------------------------------------------------

namespace {

ParseResult bad(std::string why) {
  ParseResult r;
  r.status = ParseStatus::Bad;
  r.error = std::move(why);
  return r;
}

bool readKeys(Reader& in, const StoreLimits& limits, std::vector<std::string>* keys,
              std::string* why) {
  uint64_t count;
  if (!in.u64(&count)) {
    *why = "truncated key count";
    return false;
  }
  // Each key takes at least its 8-byte length, so a count the payload cannot hold is a lie.
  if (count > limits.maxKeysPerRequest || count > in.left() / 8) {
    *why = fmt::format("key count {} exceeds the limit of {} (or the payload)", count,
                       limits.maxKeysPerRequest);
    return false;
  }
  keys->resize(static_cast<size_t>(count));
  for (auto& k : *keys) {
    if (!in.string(limits.maxKeyBytes, &k)) {
      *why = fmt::format("bad key: longer than {} bytes or truncated", limits.maxKeyBytes);
      return false;
    }
  }
  return true;
}

}  // namespace

ParseResult parseRequest(const uint8_t* data, size_t size, const StoreLimits& limits,
                         Request* out) {
  if (size < kHeaderBytes) return {};
  FrameHeader h = decodeHeader(data);
  if (h.version != kVersion) {
    return bad(fmt::format("frame of wire version {}, expected {}", h.version, kVersion));
  }
  if (!knownOp(h.type)) return bad(fmt::format("unknown opcode {}", h.type));
  if (h.reserved != 0) return bad("reserved header bits set");
  const Op op = static_cast<Op>(h.type);
  const uint64_t max = maxRequestPayload(op, limits);
  if (h.payloadBytes > max) {
    return bad(fmt::format("{} frame announces {} payload bytes, the limit is {}", opName(op),
                           h.payloadBytes, max));
  }
  if (size - kHeaderBytes < h.payloadBytes) return {};

  Reader in(data + kHeaderBytes, static_cast<size_t>(h.payloadBytes));
  Request& r = *out;
  r.op = op;
  r.keys.clear();
  r.timeoutMs = 0;
  r.delta = 0;
  r.expected.clear();
  r.value.clear();
  std::string why;
  auto key = [&] {
    r.keys.resize(1);
    if (in.string(limits.maxKeyBytes, &r.keys[0])) return true;
    why = fmt::format("bad key: longer than {} bytes or truncated", limits.maxKeyBytes);
    return false;
  };
  auto value = [&](Bytes* v) {
    if (in.bytes(limits.maxValueBytes, v)) return true;
    why = fmt::format("bad value: longer than {} bytes or truncated", limits.maxValueBytes);
    return false;
  };
  auto u64 = [&](uint64_t* v) {
    if (in.u64(v)) return true;
    why = "truncated integer";
    return false;
  };
  bool ok = false;
  switch (op) {
    case Op::Set: ok = key() && value(&r.value); break;
    case Op::Get: ok = u64(&r.timeoutMs) && key(); break;
    case Op::Add: {
      uint64_t d = 0;
      ok = key() && u64(&d);
      r.delta = static_cast<int64_t>(d);
      break;
    }
    case Op::CompareSet: ok = key() && value(&r.expected) && value(&r.value); break;
    case Op::Wait: ok = u64(&r.timeoutMs) && readKeys(in, limits, &r.keys, &why); break;
    case Op::Check: ok = readKeys(in, limits, &r.keys, &why); break;
    case Op::Delete: ok = key(); break;
    case Op::NumKeys: ok = true; break;
    case Op::MultiGet: ok = readKeys(in, limits, &r.keys, &why); break;
    case Op::WaitChanged: ok = u64(&r.timeoutMs) && key() && value(&r.expected); break;
  }
  if (!ok) return bad(fmt::format("{}: {}", opName(op), why));
  if (in.left() != 0) {
    return bad(fmt::format("{}: {} trailing payload bytes", opName(op), in.left()));
  }
  ParseResult result;
  result.status = ParseStatus::Ok;
  result.consumed = kHeaderBytes + static_cast<size_t>(h.payloadBytes);
  return result;
}

}  // namespace dtrain::store::wire
