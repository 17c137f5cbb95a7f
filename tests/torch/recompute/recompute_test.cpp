// dtrain::recompute in one process: gradients, parameters, running statistics and the random
// generator end bitwise equal to training without recompute (Dropout, BatchNorm, autocast, tensor
// and other arguments, inputs without grad, a module used twice, tensors the segment does not
// name), and its errors.
#include <gtest/gtest.h>

#include <functional>
#include <tuple>

#include <torch/torch.h>

#include "dtrain/base/error.h"
#include "dtrain/torch/autocast.h"
#include "dtrain/torch/recompute.h"
#include "recompute_models.h"

namespace dtrain::testing::recompute_test {
namespace {

using Forward = std::function<torch::Tensor(torch::nn::Sequential&, const torch::Tensor&)>;

torch::Tensor plain(torch::nn::Sequential& net, const torch::Tensor& x) { return net->forward(x); }

// What one run of training leaves: every step's gradients, the model, and the next numbers the
// CPU generator draws.
struct Trained {
  torch::nn::Sequential net;
  std::vector<std::vector<torch::Tensor>> grads;
  torch::Tensor nextRandom;
};

Trained train(const Forward& forward, int steps = 3, bool autocast = false) {
  Trained t{dropBnNet(1), {}, {}};
  torch::optim::SGD sgd(t.net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::manual_seed(7);
  for (int s = 0; s < steps; ++s) {
    auto x = torch::randn({8, 16});
    auto y = torch::randint(0, 5, {8});
    sgd.zero_grad();
    torch::Tensor loss;
    {
      AutocastGuard guard(torch::kCPU, autocast);
      loss = torch::nn::functional::cross_entropy(forward(t.net, x), y);
    }
    loss.backward();
    t.grads.emplace_back();
    for (const auto& p : t.net->parameters()) t.grads.back().push_back(p.grad().clone());
    sgd.step();
  }
  t.nextRandom = torch::rand({4});
  return t;
}

void expectBitwiseEqual(const Trained& actual, const Trained& expected) {
  ASSERT_EQ(actual.grads.size(), expected.grads.size());
  for (size_t s = 0; s < actual.grads.size(); ++s) {
    for (size_t i = 0; i < actual.grads[s].size(); ++i) {
      EXPECT_TRUE(bitwiseEqual(actual.grads[s][i], expected.grads[s][i]))
          << "step " << s << ", gradient of parameter " << i;
    }
  }
  EXPECT_EQ(firstDifference(*actual.net, *expected.net), "");
  EXPECT_TRUE(bitwiseEqual(actual.nextRandom, expected.nextRandom)) << "generator state";
}

TEST(Recompute, DropoutAndBatchNormTrainBitwiseEqual) {
  Trained expected = train(plain);
  // Each block its own segment, and two segments of several blocks.
  expectBitwiseEqual(train([](auto& net, const auto& x) {
                       return recomputeSequential(net, static_cast<int64_t>(net->size()), x);
                     }),
                     expected);
  expectBitwiseEqual(train([](auto& net, const auto& x) { return recomputeSequential(net, 2, x); }),
                     expected);
  // Running statistics were updated once per forward, not once more per recompute.
  auto bn = expected.net[0]->as<DropBnBlock>()->bn;
  EXPECT_EQ(bn->num_batches_tracked.item<int64_t>(), 3);
}

TEST(Recompute, WithoutRngPreservationDropoutMasksDiffer) {
  // The control for the test above: a recompute that draws fresh numbers gives other gradients.
  RecomputeOptions options;
  options.preserveRngState = false;
  Trained expected = train(plain, 1);
  Trained actual = train(
      [&](auto& net, const auto& x) { return recomputeSequential(net, 2, x, options); }, 1);
  bool anyDiffers = false;
  for (size_t i = 0; i < actual.grads[0].size(); ++i) {
    anyDiffers |= !bitwiseEqual(actual.grads[0][i], expected.grads[0][i]);
  }
  EXPECT_TRUE(anyDiffers);
}

TEST(Recompute, AutocastBf16OnTheCpuTrainsBitwiseEqual) {
  Trained expected = train(plain, 3, /*autocast=*/true);
  ASSERT_EQ(expected.grads.size(), 3u);
  expectBitwiseEqual(train([](auto& net, const auto& x) { return recomputeSequential(net, 2, x); },
                           3, /*autocast=*/true),
                     expected);
}

TEST(Recompute, RecomputeSequentialKeepsTheNamesAndTrainsBitwiseEqual) {
  Trained expected = train(plain);
  auto net = dropBnNet(1);
  RecomputeSequential wrapped(net, 3);
  std::vector<std::string> names, wrappedNames;
  for (const auto& p : net->named_parameters()) names.push_back(p.key());
  for (const auto& p : wrapped->named_parameters()) wrappedNames.push_back(p.key());
  EXPECT_EQ(wrappedNames, names);
  expectBitwiseEqual(train([](auto& n, const auto& x) { return RecomputeSequential(n, 3)(x); }),
                     expected);
}

// A function of two tensors and three other arguments, with two results.
std::tuple<torch::Tensor, torch::Tensor> mixed(torch::nn::Linear& fc, const torch::Tensor& x,
                                               double scale, const torch::Tensor& bias,
                                               int64_t power, const std::string& activation) {
  torch::Tensor h = fc(x) * scale + bias;
  h = activation == "tanh" ? torch::tanh(h) : torch::relu(h);
  return {h.pow(power), torch::sigmoid(h)};
}

TEST(Recompute, TensorAndOtherArgumentsSeveralResults) {
  torch::manual_seed(3);
  torch::nn::Linear fc(6, 6);
  auto x = torch::randn({4, 6}, torch::requires_grad());
  auto bias = torch::randn({6}, torch::requires_grad());
  auto [a, b] = mixed(fc, x, 0.5, bias, 3, "tanh");
  (a.sum() + 2 * b.sum()).backward();
  std::vector<torch::Tensor> expected = {x.grad().clone(), bias.grad().clone(),
                                         fc->weight.grad().clone(), fc->bias.grad().clone()};
  for (auto* t : {&x, &bias, &fc->weight, &fc->bias}) t->mutable_grad() = torch::Tensor();

  auto [ra, rb] = recompute(
      RecomputeSegment(*fc),
      [fc](const torch::Tensor& in, double scale, const torch::Tensor& shift, int64_t power,
           const std::string& activation) mutable {
        return mixed(fc, in, scale, shift, power, activation);
      },
      x, 0.5, bias, int64_t{3}, std::string("tanh"));
  EXPECT_TRUE(bitwiseEqual(ra, a));
  EXPECT_TRUE(bitwiseEqual(rb, b));
  (ra.sum() + 2 * rb.sum()).backward();
  std::vector<torch::Tensor> actual = {x.grad(), bias.grad(), fc->weight.grad(), fc->bias.grad()};
  for (size_t i = 0; i < actual.size(); ++i) EXPECT_TRUE(bitwiseEqual(actual[i], expected[i])) << i;
}

TEST(Recompute, VectorResultWithAnUnusedOutput) {
  torch::manual_seed(4);
  torch::nn::Linear fc(5, 5);
  auto x = torch::randn({3, 5});
  auto fn = [fc](const torch::Tensor& in) mutable {
    auto h = fc(in);
    return std::vector<torch::Tensor>{torch::tanh(h), h.exp(), h.argmax(1)};
  };
  auto expected = fn(x);
  expected[0].sum().backward();
  auto want = fc->weight.grad().clone();
  fc->weight.mutable_grad() = torch::Tensor();
  auto out = recompute(RecomputeSegment(*fc), fn, x);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_TRUE(bitwiseEqual(out[2], expected[2]));  // an integer result, not differentiable
  out[0].sum().backward();                         // out[1] takes no part in the loss
  EXPECT_TRUE(bitwiseEqual(fc->weight.grad(), want));
}

TEST(Recompute, ParametersGetGradientsWhenNoInputRequiresGrad) {
  auto a = dropBnNet(2, 2, 8, 3, 0.0), b = dropBnNet(2, 2, 8, 3, 0.0);
  auto x = torch::randn({6, 8});  // data: no grad
  ASSERT_FALSE(x.requires_grad());
  a->forward(x).pow(2).sum().backward();
  recompute(b, x).pow(2).sum().backward();
  auto pa = a->parameters(), pb = b->parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    ASSERT_TRUE(pb[i].grad().defined()) << i;
    EXPECT_TRUE(bitwiseEqual(pb[i].grad(), pa[i].grad())) << i;
  }
}

TEST(Recompute, OnlyTheInputsThatRequireGradGetGradients) {
  torch::manual_seed(5);
  auto x = torch::randn({4, 4}, torch::requires_grad());
  auto mask = torch::randn({4, 4});  // no grad
  auto fn = [](const torch::Tensor& a, const torch::Tensor& m) { return (a * m).tanh(); };
  fn(x, mask).sum().backward();
  auto expected = x.grad().clone();
  x.mutable_grad() = torch::Tensor();
  recompute(RecomputeSegment(), fn, x, mask).sum().backward();
  EXPECT_TRUE(bitwiseEqual(x.grad(), expected));
  EXPECT_FALSE(mask.grad().defined());
}

// A Linear used twice in one forward: twice inside one segment, or once in each of two.
TEST(Recompute, AModuleUsedTwiceInOneForward) {
  for (bool sameSegment : {true, false}) {
    auto run = [sameSegment](bool withRecompute) {
      torch::manual_seed(6);
      torch::nn::Linear shared(8, 8), other(8, 8);
      auto x = torch::randn({5, 8}, torch::requires_grad());
      auto first = [shared, sameSegment](const torch::Tensor& in) mutable {
        return sameSegment ? shared(torch::tanh(shared(in))) : torch::tanh(shared(in));
      };
      auto second = [shared, other, sameSegment](const torch::Tensor& in) mutable {
        return sameSegment ? other(in) : other(torch::tanh(shared(in)));
      };
      torch::Tensor out;
      if (withRecompute) {
        auto h = recompute(RecomputeSegment(*shared), first, x);
        out = recompute(RecomputeSegment(*shared).add(*other), second, h);
      } else {
        out = second(first(x));
      }
      out.pow(2).sum().backward();
      return std::vector<torch::Tensor>{x.grad(), shared->weight.grad(), shared->bias.grad(),
                                        other->weight.grad()};
    };
    auto expected = run(false), actual = run(true);
    for (size_t i = 0; i < expected.size(); ++i) {
      EXPECT_TRUE(bitwiseEqual(actual[i], expected[i]))
          << "same segment " << sameSegment << ", " << i;
    }
  }
}

void expectAllBitwiseEqual(const std::vector<torch::Tensor>& actual,
                           const std::vector<torch::Tensor>& expected, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    ASSERT_TRUE(expected[i].defined()) << what << ", gradient " << i;
    EXPECT_TRUE(bitwiseEqual(actual[i], expected[i]))
        << what << ", gradient " << i << (actual[i].defined() ? " differs" : " is missing");
  }
}

// A learned scale the function captures, outside any module and not in the segment: it gets its
// gradient, as without recompute (as in PyTorch's non-reentrant checkpoint), also when the
// segment names nothing and no argument requires grad (then only it and the Linear's parameters,
// found the same way, make the output require grad).
TEST(Recompute, ACapturedTensorThatRequiresGradGetsItsGradient) {
  for (bool named : {true, false}) {
    auto run = [named](bool withRecompute) {
      torch::manual_seed(15);
      torch::nn::Linear fc(6, 6);
      auto scale = torch::randn({6}, torch::requires_grad());
      auto x = torch::randn({4, 6}, torch::requires_grad(named));
      auto fn = [fc, scale](const torch::Tensor& in) mutable {
        return torch::tanh(fc(in)) * scale;
      };
      auto segment = named ? RecomputeSegment(*fc) : RecomputeSegment();
      auto out = withRecompute ? recompute(segment, fn, x) : fn(x);
      out.pow(2).sum().backward();
      std::vector<torch::Tensor> grads = {scale.grad(), fc->weight.grad(), fc->bias.grad()};
      if (named) grads.push_back(x.grad());
      return grads;
    };
    expectAllBitwiseEqual(run(true), run(false), named ? "Linear named" : "nothing named");
  }
}

// A module the segment does not name, called inside the function directly or through a segment
// of its own nested in it: its parameters get their gradients.
TEST(Recompute, AParameterOfAModuleTheSegmentDoesNotNameGetsItsGradient) {
  for (bool nested : {false, true}) {
    auto run = [nested](bool withRecompute) {
      torch::manual_seed(16);
      torch::nn::Linear fc(6, 6), gate(6, 6);
      auto x = torch::randn({4, 6}, torch::requires_grad());
      auto fn = [fc, gate, nested, withRecompute](const torch::Tensor& in) mutable {
        auto g = nested && withRecompute ? recompute(gate, in) : gate(in);
        return torch::tanh(fc(in)) * torch::sigmoid(g);
      };
      auto out = withRecompute ? recompute(RecomputeSegment(*fc), fn, x) : fn(x);
      out.pow(2).sum().backward();
      return std::vector<torch::Tensor>{gate->weight.grad(), gate->bias.grad(), x.grad(),
                                        fc->weight.grad(), fc->bias.grad()};
    };
    expectAllBitwiseEqual(run(true), run(false), nested ? "nested segment" : "called directly");
  }
}

// A tensor argument the function captures as well, a leaf or computed from one: the gradients of
// both uses arrive.
TEST(Recompute, AnArgumentTheFunctionAlsoCapturesGetsBothContributions) {
  for (bool leaf : {true, false}) {
    auto run = [leaf](bool withRecompute) {
      torch::manual_seed(17);
      torch::nn::Linear fc(6, 6);
      auto x0 = torch::randn({4, 6}, torch::requires_grad());
      auto x = leaf ? x0 : x0 * 2;
      auto fn = [fc, x](const torch::Tensor& in) mutable { return torch::tanh(fc(in)) * x; };
      auto out = withRecompute ? recompute(RecomputeSegment(*fc), fn, x) : fn(x);
      out.pow(2).sum().backward();
      return std::vector<torch::Tensor>{x0.grad(), fc->weight.grad()};
    };
    expectAllBitwiseEqual(run(true), run(false), leaf ? "a leaf" : "computed");
  }
}

// Under autocast, a weight used before the segment and in it: the segment casts it itself rather
// than reading the cast cached before it (which has a history of its own and would be refused).
TEST(Recompute, AutocastAWeightUsedBeforeAndInASegmentGetsBothGradients) {
  auto run = [](bool withRecompute) {
    torch::manual_seed(20);
    torch::nn::Linear fc(16, 16);
    auto x = torch::randn({4, 16}, torch::requires_grad());
    torch::Tensor out;
    {
      AutocastGuard guard(torch::kCPU);
      auto h = fc(x);
      out = withRecompute ? recompute(fc, h) : fc(h);
    }
    out.to(torch::kFloat).pow(2).sum().backward();
    return std::vector<torch::Tensor>{fc->weight.grad(), fc->bias.grad(), x.grad()};
  };
  auto expected = run(false), actual = run(true);
  // As in the test above: summed in bfloat16 with one cast, in float32 with two.
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_LT((actual[i] - expected[i]).abs().max().item<double>(),
              0.02 * expected[i].abs().max().item<double>())
        << i;
  }
}

// A captured tensor computed before the segment from something that requires grad has a history
// of its own, which the recompute's node cannot take as an input: refused in forward, by shape.
TEST(Recompute, ACapturedTensorWithAHistoryIsRefused) {
  torch::nn::Linear fc(6, 6);
  auto raw = torch::randn({6}, torch::requires_grad());
  auto scale = raw.exp();
  auto x = torch::randn({4, 6});
  try {
    recompute(
        RecomputeSegment(*fc),
        [fc, scale](const torch::Tensor& in) mutable { return fc(in) * scale; }, x);
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("shape [6]"), std::string::npos) << what;
    EXPECT_NE(what.find("ExpBackward0"), std::string::npos) << what;
    EXPECT_NE(what.find("HINT: pass it to recompute() as a tensor argument"), std::string::npos)
        << what;
    EXPECT_NE(what.find("addParameter"), std::string::npos) << what;
  }
  // Passed as an argument, or added to the segment, it gets its gradient.
  auto fn = [fc](const torch::Tensor& in, const torch::Tensor& s) mutable { return fc(in) * s; };
  fn(x, raw.exp()).sum().backward();
  const auto expected = raw.grad().clone();
  raw.mutable_grad() = torch::Tensor();
  recompute(RecomputeSegment(*fc), fn, x, raw.exp()).sum().backward();
  EXPECT_TRUE(bitwiseEqual(raw.grad(), expected)) << "as an argument";
  raw.mutable_grad() = torch::Tensor();
  auto added = raw.exp();
  recompute(
      RecomputeSegment(*fc).addParameter(added),
      [fc, added](const torch::Tensor& in) mutable { return fc(in) * added; }, x)
      .sum()
      .backward();
  EXPECT_TRUE(bitwiseEqual(raw.grad(), expected)) << "added with addParameter";
}

TEST(Recompute, AutogradGradThroughASegmentLeavesDotGradAlone) {
  torch::manual_seed(8);
  torch::nn::Linear fc(4, 4);
  auto x = torch::randn({3, 4}, torch::requires_grad());
  auto expected = torch::autograd::grad({fc(x).tanh().sum()}, {x})[0];
  auto actual = torch::autograd::grad({recompute(fc, x).tanh().sum()}, {x})[0];
  EXPECT_TRUE(bitwiseEqual(actual, expected));
  EXPECT_FALSE(fc->weight.grad().defined());
}

// create_graph: the gradient computed through a segment is itself differentiable (a gradient
// penalty), as without recompute.
TEST(Recompute, DoubleBackwardThroughASegment) {
  auto run = [](bool withRecompute) {
    torch::manual_seed(10);
    torch::nn::Linear fc(4, 4);
    auto x = torch::randn({3, 4}, torch::requires_grad());
    auto out = withRecompute ? recompute(fc, x) : fc(x);
    auto gx = torch::autograd::grad({out.tanh().pow(2).sum()}, {x}, {}, /*retain_graph=*/true,
                                    /*create_graph=*/true)[0];
    gx.pow(2).sum().backward();
    return std::vector<torch::Tensor>{x.grad(), fc->weight.grad()};
  };
  auto expected = run(false), actual = run(true);
  for (size_t i = 0; i < expected.size(); ++i)
    EXPECT_TRUE(bitwiseEqual(actual[i], expected[i])) << i;
}

TEST(Recompute, IsRecomputingOnlyDuringTheSecondRun) {
  std::vector<bool> seen;
  auto x = torch::randn({2, 2}, torch::requires_grad());
  auto out = recompute(
      RecomputeSegment(),
      [&seen](const torch::Tensor& a) {
        seen.push_back(isRecomputing());
        return a * 2;
      },
      x);
  EXPECT_EQ(seen, std::vector<bool>({false}));
  out.sum().backward();
  EXPECT_EQ(seen, std::vector<bool>({false, true}));
  EXPECT_FALSE(isRecomputing());
}

TEST(Recompute, NoGradModeRunsTheFunctionOnce) {
  int calls = 0;
  torch::NoGradGuard noGrad;
  auto out = recompute(
      RecomputeSegment(),
      [&calls](const torch::Tensor& a) {
        ++calls;
        return a + 1;
      },
      torch::zeros({2}));
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(out.requires_grad());
}

// Under autocast, libtorch caches a parameter's lower-precision copy even under no-grad (the
// bias of a Linear, here); the forward must not, or the use of the parameter after the segment
// gets the copy without history and loses its gradient.
TEST(Recompute, AutocastParametersUsedInAndAfterASegmentGetBothGradients) {
  auto run = [](bool withRecompute) {
    torch::manual_seed(9);
    torch::nn::Linear fc(16, 16);
    auto x = torch::randn({4, 16}, torch::requires_grad());
    torch::Tensor out;
    {
      AutocastGuard guard(torch::kCPU);
      auto h = withRecompute ? recompute(fc, x) : fc(x);
      out = fc(h);
    }
    out.to(torch::kFloat).pow(2).sum().backward();
    return std::vector<torch::Tensor>{fc->weight.grad(), fc->bias.grad()};
  };
  auto expected = run(false), actual = run(true);
  // Equal up to where the two uses' contributions are summed (in bfloat16 with one cached cast,
  // in float32 with two); a lost contribution is off by about half the gradient.
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_LT((actual[i] - expected[i]).abs().max().item<double>(),
              0.02 * expected[i].abs().max().item<double>())
        << (i == 0 ? "weight" : "bias");
  }
}

TEST(Recompute, ModifyingAnInputInPlaceIsRefused) {
  auto x = torch::randn({3}, torch::requires_grad()) * 1;
  try {
    recompute(
        RecomputeSegment(), [](const torch::Tensor& a) { return a.relu_(); }, x);
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("modified its tensor argument #0 in place"),
              std::string::npos)
        << e.what();
  }
}

// A module that counts its forwards in a buffer: the recompute would count twice.
struct CounterImpl : torch::nn::Module {
  CounterImpl() {
    fc = register_module("fc", torch::nn::Linear(3, 3));
    calls = register_buffer("calls", torch::zeros({}, torch::kLong));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    calls.add_(1);
    return fc(x);
  }
  torch::nn::Linear fc{nullptr};
  torch::Tensor calls;
};
TORCH_MODULE(Counter);

TEST(Recompute, ABufferTheRecomputeChangesIsNamedUnlessRestored) {
  Counter counter;
  auto x = torch::randn({2, 3});
  try {
    recompute(counter, x).sum().backward();
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("changed buffer 'calls'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("addStatistic"), std::string::npos) << e.what();
  }
  counter->calls.zero_();
  auto segment = RecomputeSegment(*counter).addStatistic("calls", counter->calls);
  recompute(
      segment, [c = counter.ptr()](const torch::Tensor& a) { return c->forward(a); }, x)
      .sum()
      .backward();
  EXPECT_EQ(counter->calls.item<int64_t>(), 1);
}

TEST(Recompute, BadSegmentCountsAreRefused) {
  auto net = dropBnNet(1, 2);
  EXPECT_THROW(recomputeSequential(net, 0, torch::randn({2, 16})), InvalidArgument);
  EXPECT_THROW(recomputeSequential(net, 4, torch::randn({2, 16})), InvalidArgument);
  EXPECT_THROW(RecomputeSequential(net, 4), InvalidArgument);
}

}  // namespace
}  // namespace dtrain::testing::recompute_test
