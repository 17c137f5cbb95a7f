#pragma once
// What one collective call is, independent of the backend: its sequence number, kind, element
// type, count, reduction and (optional) tensor shape. Used for Gloo message tags, the collective
// check across ranks, the flight recorder and every error message.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "dtrain/comm/communicator.h"

namespace dtrain::comm {

enum class CollectiveKind : uint8_t { Allreduce, Broadcast, Allgather, ReduceScatter, Barrier };

const char* collectiveKindName(CollectiveKind kind);

struct CollectiveInfo {
  uint64_t seq = 0;
  CollectiveKind kind = CollectiveKind::Barrier;
  DataType dtype = DataType::Float32;
  ReduceOp op = ReduceOp::Sum;  // meaningful for Allreduce and ReduceScatter
  size_t count = 0;             // elements per rank (Allgather: sent; ReduceScatter: received)
  int root = -1;                // Broadcast
  std::vector<int64_t> shape;   // optional, from CallOptions
  std::string label;            // optional, from CallOptions (at most kMaxLabelBytes kept)
  bool check = false;           // CallOptions::check

  // What a backend's entry point records before submitting (seq and shape come later).
  static CollectiveInfo allreduce(DataType dtype, size_t count, ReduceOp op);
  static CollectiveInfo broadcast(DataType dtype, size_t count, int root);
  static CollectiveInfo allgather(DataType dtype, size_t count);
  static CollectiveInfo reduceScatter(DataType dtype, size_t count, ReduceOp op);
  static CollectiveInfo barrier();

  // "allreduce(float32 x 1024, sum)", "broadcast(int64 [4, 8], root 0)", "barrier()",
  // "allgather(float32 x 96) [unit 3 forward 2 (layers.2)]" (a labelled call).
  std::string describe() const;
  // "seq 7 allreduce(float32 x 1024, sum)".
  std::string describeWithSeq() const;
  // A 32-bit message tag derived from everything above except the shape (the label included):
  // ranks that disagree on
  // the collective never exchange data, they time out and report instead (see Note [Tags]).
  uint32_t tag() const;
};

// The bytes one rank sends for `info` among `ranks` ranks, as Communicator::payloadBytes()
// counts them (Note [Payload bytes]).
uint64_t payloadBytes(const CollectiveInfo& info, int ranks);

// The wrong-shape fault (DTRAIN_FAULT=wrong-shape): `info` one element, or one row of the last
// dimension, short. Every backend passes this count to its collective instead.
CollectiveInfo wrongShape(CollectiveInfo info);

// Fixed-size wire form of a CollectiveInfo for the collective check (debug mode): every rank
// allgathers its fingerprint before the collective and compares. Shapes beyond kMaxDims dims are
// compared through their element count only.
struct Fingerprint {
  static constexpr int kMaxDims = 8;
  uint64_t seq;
  uint64_t count;
  int64_t dims[kMaxDims];
  int32_t ndim;  // -1: no shape given
  int32_t root;
  uint8_t kind;
  uint8_t dtype;
  uint8_t op;
  uint8_t pad[5];
  char label[CallOptions::kMaxLabelBytes + 1];  // NUL-terminated; empty: none

  static Fingerprint of(const CollectiveInfo& info);
  CollectiveInfo toInfo() const;
  // Same collective: kind, dtype, op, count, root, label and (when both give one) shape.
  bool sameCollective(const Fingerprint& other) const;
};

}  // namespace dtrain::comm
