#include "checkpoint_file_support.h"

#include <unistd.h>

#include <cstring>
#include <fstream>
#include <iterator>

#include "dtrain/base/error.h"

namespace dtrain::testing {

using namespace checkpoint;

EntryData SampleCheckpoint::pointers() const {
  EntryData out;
  for (const auto& d : data) out.push_back(d.empty() ? nullptr : d.data());
  return out;
}

SampleCheckpoint sampleCheckpoint(int64_t step, size_t payload) {
  auto bytesOf = [](const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    return std::vector<uint8_t>(b, b + n);
  };
  std::vector<EntrySpec> specs;
  SampleCheckpoint s;
  auto add = [&](EntrySpec spec, std::vector<uint8_t> bytes) {
    specs.push_back(std::move(spec));
    s.data.push_back(std::move(bytes));
  };
  // A float tensor of `payload` bytes (rounded down to floats), values depending on the step.
  size_t n = std::max<size_t>(payload / 4, 1);
  std::vector<float> weights(n);
  for (size_t i = 0; i < n; ++i)
    weights[i] = static_cast<float>(step) + 0.001f * static_cast<float>(i);
  add({"module/model/fc.weight", Kind::Tensor, DType::Float32, {static_cast<int64_t>(n)}},
      bytesOf(weights.data(), n * 4));
  int64_t count = step * 3;
  add({"module/model/bn.num_batches_tracked", Kind::Tensor, DType::Int64, {}}, bytesOf(&count, 8));
  std::string text = "SGD";
  add({"optimizer/opt/type", Kind::String, DType::UInt8, {3}}, bytesOf(text.data(), 3));
  double lr = 0.1 / static_cast<double>(step + 1);
  add({"scaler/s/scale", Kind::Number, DType::Float64, {}}, bytesOf(&lr, 8));
  // A tensor in two shards of 5 and 7 elements.
  std::vector<int32_t> sharded(12);
  for (int i = 0; i < 12; ++i) sharded[i] = static_cast<int32_t>(step * 100 + i);
  EntrySpec a{"optimizer/opt/0.0/exp_avg", Kind::Tensor, DType::Int32, {3, 4}, kReplicated, 0, 5};
  EntrySpec b{"optimizer/opt/0.0/exp_avg", Kind::Tensor, DType::Int32, {3, 4}, kReplicated, 5, 7};
  add(a, bytesOf(sharded.data(), 20));
  add(b, bytesOf(sharded.data() + 5, 28));
  std::vector<uint8_t> rng(13, static_cast<uint8_t>(step));
  EntrySpec own{"rank/1/rng/cpu", Kind::Bytes, DType::UInt8, {13}, 1};
  add(own, rng);
  add({"meta/empty", Kind::Tensor, DType::Float32, {0, 4}}, {});
  s.layout = planLayout(step, step / 10, 2, "1.13.0", specs);
  return s;
}

Layout writeSample(FileOps& ops, const std::string& path, int64_t step, size_t payload) {
  SampleCheckpoint s = sampleCheckpoint(step, payload);
  std::vector<uint8_t> scratch;
  writeCheckpointFile(ops, path, s.layout, s.pointers(), scratch);
  return s.layout;
}

std::vector<uint8_t> sampleFileBytes(int64_t step, size_t payload) {
  char name[] = "/tmp/dtrain-sample-XXXXXX";
  int fd = ::mkstemp(name);
  ::close(fd);
  FileOps ops(fault::IoFaultInjector({}));
  writeSample(ops, name, step, payload);
  std::ifstream in(name, std::ios::binary);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
  ::unlink(name);
  return bytes;
}

std::string verifyError(const std::string& path) {
  try {
    CheckpointReader::open(path).verify();
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

}  // namespace dtrain::testing
