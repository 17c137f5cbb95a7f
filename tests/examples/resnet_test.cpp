// examples/models/resnet: torchvision's parameter counts and layout, the CIFAR stem and width
// options, forward shapes.
#include <cstdio>
#include <map>
#include <sstream>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <dtrain/base/error.h>

#include "models/resnet.h"
#include "test_support.h"

namespace examples::resnet_test {
namespace {

// torchvision.models.resnetNN() at 1000 classes: sum(p.numel() for p in model.parameters()).
const std::map<std::string, int64_t>& torchvisionCounts() {
  static const std::map<std::string, int64_t> kCounts = {{"resnet18", 11689512},
                                                         {"resnet34", 21797672},
                                                         {"resnet50", 25557032},
                                                         {"resnet101", 44549160}};
  return kCounts;
}

TEST(ResNet, ParameterCountsMatchTorchvision) {
  for (const auto& [arch, count] : torchvisionCounts()) {
    ResNetOptions o;
    o.arch = arch;
    EXPECT_EQ(parameterCount(*makeResNet(o)), count) << arch;
  }
}

// The same count from torchvision's block definitions, by hand: checks the stem and width
// options, which torchvision has no numbers for.
int64_t expectedCount(const std::string& arch, int64_t classes, int64_t w, bool cifar) {
  const bool bottleneck = arch == "resnet50" || arch == "resnet101";
  const std::map<std::string, std::vector<int64_t>> blocks = {{"resnet18", {2, 2, 2, 2}},
                                                              {"resnet34", {3, 4, 6, 3}},
                                                              {"resnet50", {3, 4, 6, 3}},
                                                              {"resnet101", {3, 4, 23, 3}}};
  const int64_t k = cifar ? 3 : 7;
  int64_t n = 3 * w * k * k + 2 * w;  // conv1 + bn1
  int64_t in = w;
  for (int s = 0; s < 4; ++s) {
    const int64_t c = w << s;
    for (int64_t b = 0; b < blocks.at(arch)[s]; ++b) {
      const int64_t stride = (s > 0 && b == 0) ? 2 : 1;
      const int64_t out = bottleneck ? 4 * c : c;
      if (bottleneck) {
        n += in * c + 2 * c + 9 * c * c + 2 * c + c * out + 2 * out;
      } else {
        n += 9 * in * c + 2 * c + 9 * c * c + 2 * c;
      }
      if (stride != 1 || in != out) n += in * out + 2 * out;  // downsample
      in = out;
    }
  }
  return n + in * classes + classes;  // fc
}

TEST(ResNet, CountsFollowTheBlockFormulasForEveryOption) {
  for (const auto& arch : resnetArchs()) {
    EXPECT_EQ(expectedCount(arch, 1000, 64, false), torchvisionCounts().at(arch));
    for (bool cifar : {false, true}) {
      for (int64_t width : {8, 16}) {
        ResNetOptions o;
        o.arch = arch;
        o.numClasses = 10;
        o.cifarStem = cifar;
        o.width = width;
        EXPECT_EQ(parameterCount(*makeResNet(o)), expectedCount(arch, 10, width, cifar))
            << arch << " cifar=" << cifar << " width=" << width;
      }
    }
  }
}

std::vector<std::pair<std::string, std::vector<int64_t>>> stateLayout(torch::nn::Module& m) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  for (const auto& p : m.named_parameters()) out.emplace_back(p.key(), p.value().sizes().vec());
  for (const auto& b : m.named_buffers()) out.emplace_back(b.key(), b.value().sizes().vec());
  return out;
}

TEST(ResNet, NamesAndOrderAreTorchvisions) {
  ResNetOptions o;
  o.arch = "resnet50";
  ResNet net = makeResNet(o);
  auto params = net->named_parameters();
  std::vector<std::string> names;
  for (const auto& p : params) names.push_back(p.key());
  ASSERT_GE(names.size(), 12u);
  const std::vector<std::string> head = {
      "conv1.weight",          "bn1.weight",          "bn1.bias",
      "layer1.0.conv1.weight", "layer1.0.bn1.weight", "layer1.0.bn1.bias",
      "layer1.0.conv2.weight", "layer1.0.bn2.weight", "layer1.0.bn2.bias",
      "layer1.0.conv3.weight", "layer1.0.bn3.weight", "layer1.0.bn3.bias"};
  EXPECT_EQ(std::vector<std::string>(names.begin(), names.begin() + 12), head);
  EXPECT_EQ(names[12], "layer1.0.downsample.0.weight");
  EXPECT_EQ(names[names.size() - 2], "fc.weight");
  EXPECT_EQ(names.back(), "fc.bias");
  EXPECT_EQ(params["layer4.2.conv3.weight"].sizes(), torch::IntArrayRef({2048, 512, 1, 1}));
  auto buffers = net->named_buffers();
  EXPECT_TRUE(buffers.contains("bn1.running_mean"));
  EXPECT_TRUE(buffers.contains("layer3.5.bn2.num_batches_tracked"));
}

// Every parameter and buffer name and shape against torchvision itself (DTRAIN_PYTHON's).
TEST(ResNet, StateDictLayoutEqualsTorchvisions) {
  const std::string missing = dtrain::testing::pythonImportError("torchvision");
  ASSERT_TRUE(missing.empty()) << missing;
  // One Python start for all four (importing torch takes seconds): "<arch>" lines, then one line
  // per entry, parameters first, then buffers, each in registration order as stateLayout().
  dtrain::testing::TempDir dir;
  const std::string out = dir.file("torchvision.txt");
  std::string script = "import torchvision\n"
                       "for a in ('resnet18', 'resnet34', 'resnet50', 'resnet101'):\n"
                       "  print(a)\n"
                       "  m = getattr(torchvision.models, a)()\n"
                       "  for n, t in list(m.named_parameters()) + list(m.named_buffers()):\n"
                       "    print(n, *t.shape)\n";
  dtrain::testing::writeFile(dir.file("layout.py"), script);
  std::string cmd = dtrain::testing::python() + " " + dir.file("layout.py") + " > " + out;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::istringstream theirs(dtrain::testing::readFile(out));
  std::string line;
  std::getline(theirs, line);
  for (const auto& arch : resnetArchs()) {
    ASSERT_EQ(line, arch);
    ResNetOptions o;
    o.arch = arch;
    ResNet net = makeResNet(o);
    auto ours = stateLayout(*net);
    size_t i = 0;
    while (std::getline(theirs, line) && line.rfind("resnet", 0) != 0) {
      ASSERT_LT(i, ours.size()) << arch << ": torchvision has more entries, next: " << line;
      std::ostringstream mine;
      mine << ours[i].first;
      for (int64_t d : ours[i].second) mine << ' ' << d;
      ASSERT_EQ(mine.str(), line) << arch << " entry " << i;
      ++i;
    }
    EXPECT_EQ(i, ours.size()) << arch;
  }
}

TEST(ResNet, ForwardShapesForBothStems) {
  torch::NoGradGuard noGrad;
  ResNetOptions cifar;
  cifar.numClasses = 10;
  cifar.cifarStem = true;
  cifar.width = 8;
  EXPECT_EQ(makeResNet(cifar)->forward(torch::randn({2, 3, 32, 32})).sizes(),
            torch::IntArrayRef({2, 10}));
  ResNetOptions imagenet;
  imagenet.arch = "resnet50";
  imagenet.width = 8;
  EXPECT_EQ(makeResNet(imagenet)->forward(torch::randn({1, 3, 64, 64})).sizes(),
            torch::IntArrayRef({1, 1000}));
}

TEST(ResNet, InitialisationIsTorchvisions) {
  ResNetOptions o;
  ResNet net = makeResNet(o);
  // Kaiming normal, fan-out, ReLU gain: std = sqrt(2 / (out_channels * k * k)).
  torch::Tensor w = net->layer3->named_parameters()["0.conv2.weight"];
  const double expected = std::sqrt(2.0 / (256 * 9));
  EXPECT_NEAR(w.std().item<double>(), expected, 0.02 * expected);
  EXPECT_TRUE(torch::all(net->bn1->weight == 1).item<bool>());
  EXPECT_TRUE(torch::all(net->bn1->bias == 0).item<bool>());
}

TEST(ResNet, UnknownArchitectureNamesTheKnownOnes) {
  ResNetOptions o;
  o.arch = "resnet152";
  try {
    makeResNet(o);
    FAIL();
  } catch (const dtrain::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("resnet152"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("resnet18, resnet34, resnet50, resnet101"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace examples::resnet_test
