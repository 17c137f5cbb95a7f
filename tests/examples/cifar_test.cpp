// examples/data/cifar10: the binary format byte by byte, refusals naming file and offset, and the
// synthetic set (balanced, deterministic, learnable).
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <dtrain/base/error.h>

#include "data/cifar10.h"
#include "test_support.h"

namespace examples::cifar_test {
namespace {

using dtrain::testing::TempDir;

CifarSplit patterned(int64_t n) {
  CifarSplit s;
  s.images = torch::arange(n * kCifarImageBytes, torch::kLong)
                 .remainder(251)
                 .to(torch::kByte)
                 .reshape({n, 3, 32, 32});
  s.labels = torch::arange(n, torch::kLong).remainder(10);
  return s;
}

std::string expectThrowMessage(const std::function<void()>& f) {
  try {
    f();
  } catch (const dtrain::InvalidArgument& e) {
    return e.what();
  }
  ADD_FAILURE() << "no InvalidArgument";
  return "";
}

TEST(Cifar10, FileLayoutIsLabelThenRedGreenBluePlanes) {
  TempDir dir;
  const std::string path = dir.file("data_batch_1.bin");
  CifarSplit s = patterned(3);
  writeCifar10File(path, s);
  std::string bytes = dtrain::testing::readFile(path);
  ASSERT_EQ(bytes.size(), 3u * 3073u);
  for (int64_t r = 0; r < 3; ++r) {
    EXPECT_EQ(static_cast<uint8_t>(bytes[r * 3073]), r);  // label
    // green plane, row 5, column 7 of record r
    EXPECT_EQ(static_cast<uint8_t>(bytes[r * 3073 + 1 + 1024 + 5 * 32 + 7]),
              s.images[r][1][5][7].item<uint8_t>());
  }
  CifarSplit back = readCifar10File(path);
  EXPECT_TRUE(torch::equal(back.images, s.images));
  EXPECT_TRUE(torch::equal(back.labels, s.labels));
  EXPECT_EQ(back.labels.dtype(), torch::kLong);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST(Cifar10, TruncatedFileIsRefusedWithFileAndOffset) {
  TempDir dir;
  const std::string path = dir.file("test_batch.bin");
  writeCifar10File(path, patterned(4));
  for (uintmax_t cut : {uintmax_t{1}, uintmax_t{100}, uintmax_t{3072}}) {
    std::filesystem::resize_file(path, 4 * 3073 - cut);
    std::string msg = expectThrowMessage([&] { readCifar10File(path); });
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find("truncated record at offset 9219"), std::string::npos) << msg;  // 3 * 3073
    EXPECT_NE(msg.find(std::to_string(3073 - cut) + " of its 3073 bytes"), std::string::npos)
        << msg;
  }
  std::filesystem::resize_file(path, 0);
  EXPECT_NE(expectThrowMessage([&] { readCifar10File(path); }).find("empty"), std::string::npos);
}

TEST(Cifar10, BadLabelIsRefusedWithRecordAndOffset) {
  TempDir dir;
  const std::string path = dir.file("data_batch_2.bin");
  writeCifar10File(path, patterned(5));
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(2 * 3073);
    f.put(static_cast<char>(57));
  }
  std::string msg = expectThrowMessage([&] { readCifar10File(path); });
  EXPECT_NE(msg.find(path + ": record 2 at offset 6146 has label 57"), std::string::npos) << msg;
}

TEST(Cifar10, MissingTrainingFileIsNamedWithAHint) {
  TempDir dir;
  writeSyntheticCifar10(dir.path(), 50, 10);
  std::filesystem::remove(dir.file("data_batch_4.bin"));
  std::string msg = expectThrowMessage([&] { readCifar10(dir.path(), true); });
  EXPECT_NE(msg.find("data_batch_4.bin"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--synthetic"), std::string::npos) << msg;
}

TEST(Cifar10, SyntheticSetIsBalancedDeterministicAndSplitLikeCifar) {
  TempDir a, b, c;
  writeSyntheticCifar10(a.path(), 1003, 200, 5);
  writeSyntheticCifar10(b.path(), 1003, 200, 5);
  writeSyntheticCifar10(c.path(), 1003, 200, 6);
  int64_t total = 0;
  for (int i = 1; i <= 5; ++i) {
    const std::string name = "/data_batch_" + std::to_string(i) + ".bin";
    EXPECT_EQ(dtrain::testing::readFile(a.path() + name),
              dtrain::testing::readFile(b.path() + name));
    EXPECT_NE(dtrain::testing::readFile(a.path() + name),
              dtrain::testing::readFile(c.path() + name));
    total += readCifar10File(a.path() + name).size();
  }
  EXPECT_EQ(total, 1003);
  CifarSplit train = readCifar10(a.path(), true), test = readCifar10(a.path(), false);
  ASSERT_EQ(train.size(), 1003);
  ASSERT_EQ(test.size(), 200);
  torch::Tensor counts = torch::bincount(test.labels, {}, 10);
  EXPECT_TRUE(torch::all(counts == 20).item<bool>()) << counts;
  counts = torch::bincount(train.labels, {}, 10);
  EXPECT_LE((counts.max() - counts.min()).item<int64_t>(), 1) << counts;
  // Images use the byte range (noise + patterns), not a constant.
  EXPECT_GT(train.images.to(torch::kFloat).std().item<float>(), 30.0f);
}

// Learnable without any training: each class's gratings have their own orientations and
// frequencies, so a nearest-centroid classifier on the (shift-invariant) amplitude spectrum beats
// chance by far.
TEST(Cifar10, SyntheticClassesAreSeparable) {
  TempDir dir;
  writeSyntheticCifar10(dir.path(), 2000, 500, 1);
  auto features = [](const CifarSplit& s) {
    torch::Tensor x = s.images.to(torch::kFloat);
    x = x - x.mean({2, 3}, /*keepdim=*/true);
    return torch::fft::rfft2(x).abs().flatten(1);
  };
  CifarSplit train = readCifar10(dir.path(), true), test = readCifar10(dir.path(), false);
  torch::Tensor f = features(train), g = features(test);
  std::vector<torch::Tensor> centroids;
  for (int64_t c = 0; c < 10; ++c) centroids.push_back(f.index({train.labels == c}).mean(0));
  torch::Tensor predicted = torch::cdist(g, torch::stack(centroids)).argmin(1);
  double accuracy = (predicted == test.labels).to(torch::kFloat).mean().item<double>();
  EXPECT_GT(accuracy, 0.5) << "nearest-centroid accuracy " << accuracy;
}

}  // namespace
}  // namespace examples::cifar_test
