#pragma once
// TensorBoard's event files, encoded by hand: TFRecord framing around `Event` protocol buffers
// (Note [TensorBoard event files]). Internal to dtrain_base; the sink that writes them is
// dtrain::metrics::TensorBoardSink (dtrain/base/tensorboard.h).

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dtrain::metrics::tensorboard {

// Note [TensorBoard event files]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// An event file (its name holds "tfevents"; TensorBoard's loader follows only the newest one of
// a directory) is a sequence of TFRecords:
//
//   offset  size  field
//   0       8     length N of the data, uint64 little-endian
//   8       4     masked CRC32C of bytes 0..7, uint32 little-endian
//   12      N     data: one serialised tensorboard.Event
//   12+N    4     masked CRC32C of the data, uint32 little-endian
//
// CRC32C is the Castagnoli CRC (iSCSI's; check value crc32c("123456789") = 0xE3069283), taken
// from ISA-L's crc32_iscsi; masked(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8 (mod 2^32).
//
// The Event message (TensorBoard's event.proto) has many fields; dtrain writes these, in field
// order, each as a protobuf key (field number << 3 | wire type) and its value:
//
//   Event.wall_time     1  double   wire type 1 (8 bytes little-endian)        key 0x09
//   Event.step          2  int64    wire type 0 (varint; negative: 10 bytes)   key 0x10
//   Event.file_version  3  string   wire type 2 (varint length, bytes)         key 0x1a
//   Event.summary       5  Summary  wire type 2                                key 0x2a
//   Summary.value       1  repeated Summary.Value, wire type 2                 key 0x0a
//   Summary.Value.tag   1  string   wire type 2                                key 0x0a
//   Summary.Value.simple_value  2  float  wire type 5 (4 bytes little-endian)  key 0x15
//
// The first record of a file is {wall_time, step 0, file_version "brain.Event:2"}; every later
// one {wall_time, step, summary} with one Value per field of one metrics record. launch links no
// protobuf library and needs none for seven fields: they are written here, and the tests read
// them back with Python's google.protobuf and TensorBoard's own field numbers.

// CRC32C (Castagnoli) of `size` bytes; crc32c("123456789") == 0xE3069283.
uint32_t crc32c(const void* data, size_t size);
// TFRecord's masked form of crc32c(data).
uint32_t maskedCrc32c(const void* data, size_t size);

// `data` framed as one TFRecord: length, its masked CRC, the data, the data's masked CRC.
std::string frameRecord(std::string_view data);

// The serialised Event that opens every file: wall_time, step 0, file_version "brain.Event:2".
std::string fileVersionEvent(double wallTime);
inline constexpr const char* kFileVersion = "brain.Event:2";

// A serialised Event holding one scalar per (tag, value), all at `step` and `wallTime`.
using Scalar = std::pair<std::string, float>;
std::string scalarsEvent(double wallTime, int64_t step, const std::vector<Scalar>& scalars);

}  // namespace dtrain::metrics::tensorboard
