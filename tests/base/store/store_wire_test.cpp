// The wire format byte by byte (docs/reliability.md S14): golden bytes written out by hand from
// Note [Store wire format], never produced by the encoder under test, and the parser's refusals.
#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "store/auth.h"
#include "store/wire.h"
#include "store_support.h"

namespace dtrain::store::wire::store_wire_test {
namespace {

Bytes hex(const std::string& text) {
  Bytes out;
  std::string digits;
  for (char c : text) {
    if (std::isxdigit(static_cast<unsigned char>(c))) digits += c;
  }
  for (size_t i = 0; i + 1 < digits.size(); i += 2) {
    out.push_back(static_cast<uint8_t>(std::stoi(digits.substr(i, 2), nullptr, 16)));
  }
  return out;
}

template <size_t N>
Bytes asBytes(const std::array<uint8_t, N>& a) {
  return Bytes(a.begin(), a.end());
}

Nonce counting(uint8_t from) {
  Nonce n;
  for (size_t i = 0; i < n.size(); ++i) n[i] = static_cast<uint8_t>(from + i);
  return n;
}

Request request(Op op, std::vector<std::string> keys) {
  Request r;
  r.op = op;
  r.keys = std::move(keys);
  return r;
}

TEST(StoreWireGolden, Hello) {
  Hello h;
  h.flags = kFlagToken;
  h.nonce = counting(0);
  EXPECT_EQ(asBytes(encodeHello(h)),
            hex("44 54 53 54  01  01  00 00"
                "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"));
}

TEST(StoreWireGolden, ChallengeAndProofs) {
  const std::string token = "job-token";
  Challenge c;
  c.flags = kFlagToken;
  c.nonce = counting(32);
  c.proof = auth::serverProof(token, counting(0), counting(32));
  EXPECT_EQ(asBytes(encodeChallenge(c)),
            hex("44 54 53 54  01  01  00 00"
                "202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f"
                "70e7ca00dbf8d16643d96b222b936aa091ceb0e3c5c76933a5ba84ce22c458a1"));
  EXPECT_EQ(asBytes(auth::clientProof(token, counting(32), counting(0))),
            hex("0153476a2ceef841b6cf99125d656158de43228475c9e563bef00bbc88d03139"));
  EXPECT_EQ(asBytes(encodeVerdict(kVerdictAccepted)), hex("44 54 53 54 00 00 00 00"));
  EXPECT_EQ(asBytes(encodeVerdict(kVerdictWrongToken)), hex("44 54 53 54 01 00 00 00"));
}

TEST(StoreWireGolden, HmacKnownAnswer) {
  // RFC 4231, test case 2.
  std::string data = "what do ya want for nothing?";
  EXPECT_EQ(
      asBytes(auth::hmacSha256("Jefe", reinterpret_cast<const uint8_t*>(data.data()), data.size())),
      hex("5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"));
}

TEST(StoreWireGolden, Requests) {
  Request set = request(Op::Set, {"ab"});
  set.value = {'x', 'y', 'z'};
  EXPECT_EQ(encodeRequest(set), hex("1500000000000000 01 01 0000"
                                    "0200000000000000 6162"
                                    "0300000000000000 78797a"));
  EXPECT_EQ(encodeSet("ab", set.value), encodeRequest(set));  // the client's pipelined sets
  Request get = request(Op::Get, {"k"});
  get.timeoutMs = 1000;
  EXPECT_EQ(encodeRequest(get), hex("1100000000000000 01 02 0000"
                                    "e803000000000000"
                                    "0100000000000000 6b"));
  Request add = request(Op::Add, {"c"});
  add.delta = -2;
  EXPECT_EQ(encodeRequest(add), hex("1100000000000000 01 03 0000"
                                    "0100000000000000 63"
                                    "feffffffffffffff"));
  Request cas = request(Op::CompareSet, {"k"});
  cas.expected = {'a'};
  cas.value = {'b', 'c'};
  EXPECT_EQ(encodeRequest(cas), hex("1c00000000000000 01 04 0000"
                                    "0100000000000000 6b"
                                    "0100000000000000 61"
                                    "0200000000000000 6263"));
  Request wait = request(Op::Wait, {"a", "bc"});
  wait.timeoutMs = 5;
  EXPECT_EQ(encodeRequest(wait), hex("2300000000000000 01 05 0000"
                                     "0500000000000000"
                                     "0200000000000000"
                                     "0100000000000000 61"
                                     "0200000000000000 6263"));
  EXPECT_EQ(encodeRequest(request(Op::Check, {"a"})), hex("1100000000000000 01 06 0000"
                                                          "0100000000000000"
                                                          "0100000000000000 61"));
  EXPECT_EQ(encodeRequest(request(Op::Delete, {"a"})), hex("0900000000000000 01 07 0000"
                                                           "0100000000000000 61"));
  EXPECT_EQ(encodeRequest(request(Op::NumKeys, {})), hex("0000000000000000 01 08 0000"));
  EXPECT_EQ(encodeRequest(request(Op::MultiGet, {"a", "bc"})), hex("1b00000000000000 01 09 0000"
                                                                   "0200000000000000"
                                                                   "0100000000000000 61"
                                                                   "0200000000000000 6263"));
  Request changed = request(Op::WaitChanged, {"k"});
  changed.timeoutMs = 2;
  changed.expected = {'7'};
  EXPECT_EQ(encodeRequest(changed), hex("1a00000000000000 01 0a 0000"
                                        "0200000000000000"
                                        "0100000000000000 6b"
                                        "0100000000000000 37"));
}

TEST(StoreWireGolden, Responses) {
  EXPECT_EQ(encodeResponse(Status::Ok, {}), hex("0000000000000000 01 00 0000"));
  EXPECT_EQ(encodeResponse(Status::Ok, encodeI64(7)),
            hex("0800000000000000 01 00 0000 0700000000000000"));
  EXPECT_EQ(encodeResponse(Status::Ok, encodeBytes({'v'})),
            hex("0900000000000000 01 00 0000 0100000000000000 76"));
  EXPECT_EQ(encodeValueResponse({'v'}), hex("0900000000000000 01 00 0000 0100000000000000 76"));
  EXPECT_EQ(encodeResponse(Status::Timeout, encodeIndices({1})),
            hex("1000000000000000 01 01 0000 0100000000000000 0100000000000000"));
  EXPECT_EQ(encodeErrorResponse("no"), hex("0a00000000000000 01 02 0000 0200000000000000 6e6f"));
  // MultiGet of ("a" present with "v", "b" absent).
  const Bytes v{'v'};
  EXPECT_EQ(encodeResponse(Status::Ok, encodeMultiValues({&v, nullptr})),
            hex("1300000000000000 01 00 0000 0200000000000000 01 0100000000000000 76 00"));
  std::vector<std::optional<Bytes>> back;
  ASSERT_TRUE(decodeMultiValues(encodeMultiValues({&v, nullptr}), 2, 10, &back));
  EXPECT_EQ(back, (std::vector<std::optional<Bytes>>{v, std::nullopt}));
  EXPECT_FALSE(decodeMultiValues(encodeMultiValues({&v, nullptr}), 3, 10, &back));  // count
  EXPECT_FALSE(decodeMultiValues(encodeMultiValues({&v}), 1, 0, &back));  // value over the limit
  Bytes flag2 = encodeMultiValues({nullptr});
  flag2.back() = 2;
  EXPECT_FALSE(decodeMultiValues(flag2, 1, 10, &back));
}

// --- parser ------------------------------------------------------------------------------------

class StoreWireParse : public ::testing::Test {
 protected:
  ParseResult parse(const Bytes& frame) {
    return parseRequest(frame.data(), frame.size(), limits_, &out_);
  }
  StoreLimits limits_;
  Request out_;
};

TEST_F(StoreWireParse, RoundTripsEveryOp) {
  std::vector<Request> all;
  Request set = request(Op::Set, {"key"});
  set.value = {0, 1, 255};
  all.push_back(set);
  Request get = request(Op::Get, {"key"});
  get.timeoutMs = 12345;
  all.push_back(get);
  Request add = request(Op::Add, {"n"});
  add.delta = std::numeric_limits<int64_t>::min();
  all.push_back(add);
  Request cas = request(Op::CompareSet, {"k"});
  cas.expected = {1};
  cas.value = {2, 3};
  all.push_back(cas);
  Request wait = request(Op::Wait, {"a", "", "c"});
  wait.timeoutMs = 1;
  all.push_back(wait);
  all.push_back(request(Op::Check, {"a", "b"}));
  all.push_back(request(Op::Delete, {"a"}));
  all.push_back(request(Op::NumKeys, {}));
  all.push_back(request(Op::MultiGet, {"a", "", "c"}));
  Request changed = request(Op::WaitChanged, {"k"});
  changed.timeoutMs = 77;
  changed.expected = {4, 5};
  all.push_back(changed);
  for (const auto& r : all) {
    Bytes frame = encodeRequest(r);
    ParseResult p = parse(frame);
    ASSERT_EQ(p.status, ParseStatus::Ok) << opName(r.op) << ": " << p.error;
    EXPECT_EQ(p.consumed, frame.size());
    EXPECT_EQ(out_.op, r.op);
    EXPECT_EQ(out_.keys, r.op == Op::NumKeys ? std::vector<std::string>{} : r.keys);
    EXPECT_EQ(out_.value, r.value);
    EXPECT_EQ(out_.expected, r.expected);
    EXPECT_EQ(out_.delta, r.delta);
    EXPECT_EQ(out_.timeoutMs, r.timeoutMs);
  }
}

TEST_F(StoreWireParse, NeedsMoreUntilTheLastByteAndStopsAtTheFrame) {
  Request set = request(Op::Set, {"key"});
  set.value = Bytes(100, 7);
  Bytes frame = encodeRequest(set);
  for (size_t n = 0; n < frame.size(); ++n) {
    EXPECT_EQ(parseRequest(frame.data(), n, limits_, &out_).status, ParseStatus::NeedMore) << n;
  }
  Bytes two = frame;
  two.insert(two.end(), frame.begin(), frame.end());
  ParseResult p = parse(two);
  ASSERT_EQ(p.status, ParseStatus::Ok);
  EXPECT_EQ(p.consumed, frame.size());
}

using testing::appendU64;
using testing::rawHeader;

TEST_F(StoreWireParse, OversizeLengthsAreRefusedFromTheHeaderAlone) {
  // Only the 12 header bytes: no payload is needed to say no, so nothing is ever allocated for it.
  for (uint64_t length : {uint64_t{1} << 30, std::numeric_limits<uint64_t>::max(),
                          maxRequestPayload(Op::Set, limits_) + 1}) {
    ParseResult p = parse(rawHeader(length, Op::Set));
    EXPECT_EQ(p.status, ParseStatus::Bad) << length;
    EXPECT_NE(p.error.find(std::to_string(length)), std::string::npos) << p.error;
  }
  EXPECT_EQ(parse(rawHeader(9, Op::NumKeys)).status, ParseStatus::Bad);
  Bytes largest = rawHeader(maxRequestPayload(Op::Set, limits_), Op::Set);
  EXPECT_EQ(parse(largest).status, ParseStatus::NeedMore);
}

TEST_F(StoreWireParse, BadHeadersAreRefused) {
  EXPECT_EQ(parse(rawHeader(0, 8, 2)).status, ParseStatus::Bad);            // version
  EXPECT_EQ(parse(rawHeader(0, 0)).status, ParseStatus::Bad);               // opcode 0
  EXPECT_EQ(parse(rawHeader(0, 11)).status, ParseStatus::Bad);              // opcode 11
  EXPECT_EQ(parse(rawHeader(0, 8, kVersion, 1)).status, ParseStatus::Bad);  // reserved
}

TEST_F(StoreWireParse, KeyCountOfTwoToTheFortyIsRefused) {
  Bytes payload;
  appendU64(&payload, 10);                 // timeout
  appendU64(&payload, uint64_t{1} << 40);  // key count
  Bytes frame = rawHeader(payload.size(), Op::Wait);
  frame.insert(frame.end(), payload.begin(), payload.end());
  ParseResult p = parse(frame);
  EXPECT_EQ(p.status, ParseStatus::Bad);
  EXPECT_NE(p.error.find("1099511627776"), std::string::npos) << p.error;
  // A count within the limit that the payload cannot hold is refused too, without a resize.
  Bytes lying;
  appendU64(&lying, 4000);
  Bytes frame2 = rawHeader(lying.size(), Op::Check);
  frame2.insert(frame2.end(), lying.begin(), lying.end());
  EXPECT_EQ(parse(frame2).status, ParseStatus::Bad);
}

TEST_F(StoreWireParse, FieldsLongerThanTheirLimitOrThePayloadAreRefused) {
  limits_.maxKeyBytes = 4;
  Bytes payload;
  appendU64(&payload, 5);
  payload.insert(payload.end(), {'a', 'b', 'c', 'd', 'e'});
  Bytes frame = rawHeader(payload.size(), Op::Delete);
  frame.insert(frame.end(), payload.begin(), payload.end());
  EXPECT_EQ(parse(frame).status, ParseStatus::Bad);

  Bytes lies;
  appendU64(&lies, 3);  // key length 3, but only 1 byte follows
  lies.push_back('a');
  Bytes frame2 = rawHeader(lies.size(), Op::Delete);
  frame2.insert(frame2.end(), lies.begin(), lies.end());
  EXPECT_EQ(parse(frame2).status, ParseStatus::Bad);

  Bytes trailing = encodeRequest(request(Op::Delete, {"a"}));
  trailing.push_back(0);
  trailing[0] += 1;  // the payload now holds one byte the op does not use
  EXPECT_EQ(parse(trailing).status, ParseStatus::Bad);
}

TEST(StoreWireLimits, MaxPayloadSaturatesInsteadOfWrapping) {
  StoreLimits huge;
  huge.maxKeyBytes = std::numeric_limits<size_t>::max();
  huge.maxValueBytes = std::numeric_limits<size_t>::max();
  huge.maxKeysPerRequest = std::numeric_limits<size_t>::max();
  for (int op : {1, 2, 3, 4, 5, 6, 7, 9, 10}) {
    EXPECT_EQ(maxRequestPayload(static_cast<Op>(op), huge), std::numeric_limits<uint64_t>::max());
  }
  StoreLimits normal;
  EXPECT_EQ(maxRequestPayload(Op::Set, normal), 8 + 8192 + 8 + 64 * 1024 * 1024);
  EXPECT_EQ(maxRequestPayload(Op::Wait, normal), 16 + 4096 * (8 + 8192));
}

}  // namespace
}  // namespace dtrain::store::wire::store_wire_test
