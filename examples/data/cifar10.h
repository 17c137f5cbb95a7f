#pragma once
// CIFAR-10 in its binary format (https://www.cs.toronto.edu/~kriz/cifar.html, "binary version"):
// data_batch_1.bin ... data_batch_5.bin (training) and test_batch.bin, each a sequence of
// 3073-byte records: one label byte (0-9), then a 32x32 image as 1024 red, 1024 green and 1024
// blue bytes, rows top to bottom. No header: a file's size must be a multiple of 3073.
//
// writeSyntheticCifar10() writes a learnable stand-in in exactly that format (class-dependent
// patterns plus noise), so the demo and the tests exercise the same reader as real data.

#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>

namespace examples {

constexpr int64_t kCifarClasses = 10;
constexpr int64_t kCifarSide = 32;
constexpr int64_t kCifarImageBytes = 3 * kCifarSide * kCifarSide;  // 3072
constexpr int64_t kCifarRecordBytes = 1 + kCifarImageBytes;        // 3073

struct CifarSplit {
  at::Tensor images;  // uint8 [N, 3, 32, 32]
  at::Tensor labels;  // int64 [N]
  int64_t size() const { return labels.defined() ? labels.size(0) : 0; }
};

// One file. Throws dtrain::InvalidArgument naming the file and the byte offset of the first bad
// record: a truncated last record, a label outside 0-9; or the reason it cannot be read.
CifarSplit readCifar10File(const std::string& path);

// The training split (data_batch_1..5.bin, all five required) or the test split (test_batch.bin)
// of directory `dir`.
CifarSplit readCifar10(const std::string& dir, bool train);

// Writes `split` as one file in the format above (through a temporary and a rename).
void writeCifar10File(const std::string& path, const CifarSplit& split);

// Every class c has a fixed pattern: a few oriented colour gratings with their own angles and
// frequencies. An image of class c is its pattern shifted by a random phase, with random contrast
// and brightness and per-pixel Gaussian noise. Writes `trainSize` images spread over
// data_batch_1..5.bin and `testSize` into test_batch.bin (a different draw of the same classes);
// the classes are balanced. Deterministic in `seed`.
void writeSyntheticCifar10(const std::string& dir, int64_t trainSize, int64_t testSize,
                           uint64_t seed = 0);

}  // namespace examples
