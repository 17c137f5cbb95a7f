// A training program for DDP's real-process tests: started by `launch`, one process per rank,
// collectives over Gloo. Runs the scenarios named on its command line; each rank prints
// "rank R PASS <scenario>" or "rank R FAIL <scenario>: <why>" and exits 1 when any failed.
//
//   ddp_worker --scenarios mlp,cnn,batchnorm,nosync,unused,unused-error,mismatch,overlap,
//                          compression
//   ddp_worker --scenarios sampler-save   --state FILE --consumed K
//   ddp_worker --scenarios sampler-resume --state FILE --consumed K --original-world W
#include <chrono>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <torch/torch.h>

#include "ddp_models.h"
#include "dtrain/base/error.h"
#include "dtrain/torch/ddp.h"
#include "dtrain/torch/distributed_sampler.h"
#include "dtrain/torch/init.h"

namespace dtrain::testing {
namespace {

struct Args {
  std::vector<std::string> scenarios;
  std::string state;
  size_t consumed = 0;
  int originalWorld = 0;
};

struct Ctx {
  std::shared_ptr<ProcessGroup> group;
  int rank = 0;
  int world = 1;
  Args args;
};

#define EXPECT_OR_FAIL(cond, ...) DTRAIN_CHECK(cond, __VA_ARGS__)

std::shared_ptr<ProcessGroup> groupFromEnv() {
  InitOptions options;
  options.timeout = std::chrono::seconds(30);
  options.connectTimeout = std::chrono::seconds(30);
  return init(options);
}

torch::Tensor shardOf(const torch::Tensor& whole, const Ctx& c) {
  int64_t per = whole.size(0) / c.world;
  return whole.narrow(0, c.rank * per, per);
}

torch::optim::SGD sgdFor(const std::vector<torch::Tensor>& params) {
  return torch::optim::SGD(params, torch::optim::SGDOptions(0.05).momentum(0.9));
}

// rank 0's model equals the reference; the others start elsewhere (construction broadcasts).
template <typename Net>
std::pair<Net, Net> referenceAndMine(const Ctx& c, const std::function<Net()>& make) {
  torch::manual_seed(7);
  Net reference = make();
  torch::manual_seed(7 + c.rank);
  Net mine = make();
  return {reference, mine};
}

void expectClose(torch::nn::Module& actual, torch::nn::Module& expected, const Ctx& c) {
  auto want = expected.named_parameters();
  for (const auto& p : actual.named_parameters()) {
    double err = relativeError(p.value(), want[p.key()]);
    EXPECT_OR_FAIL(err <= 1e-5,
                   "rank {}: {} differs from the single-process run by {:.3g} (max 1e-5)", c.rank,
                   p.key(), err);
  }
}

// Every rank's tensor equals rank 0's, bit for bit.
void expectIdenticalAcrossRanks(const std::string& name, const torch::Tensor& t, const Ctx& c) {
  auto all = c.group->allgather(t.contiguous());
  for (int r = 1; r < c.world; ++r) {
    EXPECT_OR_FAIL(torch::equal(all[r], all[0]), "{} differs between rank 0 and rank {}", name, r);
  }
}

template <typename Net>
void equivalence(const Ctx& c, const std::function<Net()>& make,
                 const std::function<torch::Tensor(int64_t)>& inputs,
                 const std::function<torch::Tensor(int64_t)>& targets,
                 const std::function<torch::Tensor(torch::Tensor, torch::Tensor)>& loss) {
  const int steps = 3, perRank = 4;
  auto [reference, mine] = referenceAndMine<Net>(c, make);
  std::vector<torch::Tensor> xs, ys;
  for (int s = 0; s < steps; ++s) {
    torch::manual_seed(1000 + s);  // the same whole batch on every rank
    xs.push_back(inputs(c.world * perRank));
    ys.push_back(targets(c.world * perRank));
  }
  auto refSgd = sgdFor(reference->parameters());
  for (int s = 0; s < steps; ++s) {
    refSgd.zero_grad();
    loss(reference->forward(xs[s]), ys[s]).backward();
    refSgd.step();
  }
  DdpOptions options;
  options.firstBucketBytes = 256;  // several buckets even for these small models
  options.bucketBytes = 1024;
  DistributedDataParallel<Net> ddp(mine, c.group, options);
  auto sgd = sgdFor(ddp.parameters());
  for (int s = 0; s < steps; ++s) {
    sgd.zero_grad();
    loss(ddp(shardOf(xs[s], c)), shardOf(ys[s], c)).backward();
    sgd.step();
  }
  expectClose(*mine, *reference, c);
}

torch::Tensor mse(torch::Tensor a, torch::Tensor b) { return torch::mse_loss(a, b); }
torch::Tensor xent(torch::Tensor a, torch::Tensor b) {
  return torch::nn::functional::cross_entropy(a, b);
}

void scenarioMlp(const Ctx& c) {
  equivalence<Mlp>(
      c, [] { return Mlp(); },
      [](int64_t n) {
        return torch::randn({n, 8});
      },
      [](int64_t n) {
        return torch::randn({n, 4});
      },
      mse);
}

void scenarioCnn(const Ctx& c) {
  equivalence<Cnn>(
      c, [] { return Cnn(); },
      [](int64_t n) {
        return torch::randn({n, 3, 8, 8});
      },
      [](int64_t n) { return torch::randint(0, 5, {n}, torch::kLong); }, xent);
}

void scenarioBatchNorm(const Ctx& c) {
  torch::manual_seed(11 + c.rank);
  BnCnn net;
  DistributedDataParallel<BnCnn> ddp(net, c.group);
  auto sgd = sgdFor(ddp.parameters());
  for (int s = 0; s < 3; ++s) {
    torch::manual_seed(100 * s + c.rank);  // each rank its own batch
    sgd.zero_grad();
    xent(ddp(torch::randn({4, 3, 8, 8}) * (s + 1)), torch::randint(0, 5, {4}, torch::kLong))
        .backward();
    sgd.step();
  }
  ddp.syncBuffers();
  for (const auto& p : net->named_parameters()) expectIdenticalAcrossRanks(p.key(), p.value(), c);
  for (const auto& b : net->named_buffers()) expectIdenticalAcrossRanks(b.key(), b.value(), c);
}

void scenarioNoSync(const Ctx& c) {
  const int micro = 3, per = 2;
  auto [reference, mine] = referenceAndMine<Mlp>(c, [] { return Mlp(); });
  torch::manual_seed(5);
  auto x = torch::randn({c.world * micro * per, 8});
  auto y = torch::randn({c.world * micro * per, 4});
  auto refSgd = sgdFor(reference->parameters());
  refSgd.zero_grad();
  mse(reference->forward(x), y).backward();
  refSgd.step();

  DistributedDataParallel<Mlp> ddp(mine, c.group);
  auto sgd = sgdFor(ddp.parameters());
  sgd.zero_grad();
  auto xs = shardOf(x, c), ys = shardOf(y, c);
  auto run = [&](int m) {
    (mse(ddp(xs.narrow(0, m * per, per)), ys.narrow(0, m * per, per)) / micro).backward();
  };
  {
    auto guard = ddp.noSync();
    for (int m = 0; m < micro - 1; ++m) run(m);
  }
  run(micro - 1);
  sgd.step();
  expectClose(*mine, *reference, c);
}

// Rank r skips fc2 in step s when (s + r) % 3 == 0; the reference averages the ranks' losses.
void scenarioUnused(const Ctx& c) {
  const int steps = 3;
  auto [reference, mine] = referenceAndMine<BranchNet>(c, [] { return BranchNet(); });
  auto skips = [&](int s, int r) { return (s + r) % 3 == 0; };
  std::vector<torch::Tensor> xs, ys;
  for (int s = 0; s < steps; ++s) {
    torch::manual_seed(300 + s);
    xs.push_back(torch::randn({c.world * 2, 6}));
    ys.push_back(torch::randn({c.world * 2, 3}));
  }
  auto refSgd = sgdFor(reference->parameters());
  for (int s = 0; s < steps; ++s) {
    refSgd.zero_grad();
    torch::Tensor total = torch::zeros({});
    for (int r = 0; r < c.world; ++r) {
      Ctx other = c;
      other.rank = r;
      total = total +
              mse(reference->forward(shardOf(xs[s], other), skips(s, r)), shardOf(ys[s], other));
    }
    (total / c.world).backward();
    refSgd.step();
  }
  DdpOptions options;
  options.findUnusedParameters = true;
  DistributedDataParallel<BranchNet> ddp(mine, c.group, options);
  auto sgd = sgdFor(ddp.parameters());
  for (int s = 0; s < steps; ++s) {
    sgd.zero_grad();
    mse(ddp(shardOf(xs[s], c), skips(s, c.rank)), shardOf(ys[s], c)).backward();
    // PyTorch #69031: a rank that skipped fc2 still holds the synchronised gradient.
    expectIdenticalAcrossRanks("fc2.weight.grad", mine->fc2->weight.grad(), c);
    sgd.step();
  }
  expectClose(*mine, *reference, c);
}

// Runs `fn`, which must throw dtrain::Error mentioning every one of `parts`.
void expectError(const Ctx& c, const std::function<void()>& fn,
                 const std::vector<std::string>& parts) {
  try {
    fn();
  } catch (const Error& e) {
    for (const auto& part : parts) {
      EXPECT_OR_FAIL(std::string(e.what()).find(part) != std::string::npos,
                     "rank {}: \"{}\" missing from the error: {}", c.rank, part, e.what());
    }
    return;
  }
  DTRAIN_THROW(Error, "rank {}: expected an error mentioning \"{}\"", c.rank, parts.front());
}

void scenarioUnusedError(const Ctx& c) {
  BranchNet net;
  DistributedDataParallel<BranchNet> ddp(net, c.group);
  expectError(c,
              [&] {
                mse(ddp(torch::randn({2, 6}), true), torch::randn({2, 3})).backward();
              },
              {"fc2.weight", "fc2.bias", "received no gradient", "findUnusedParameters"});
  mse(ddp(torch::randn({2, 6}), false), torch::randn({2, 3})).backward();  // and carries on
}

void scenarioMismatch(const Ctx& c) {
  int last = c.world - 1;
  Mlp net(8, c.rank == last ? 17 : 16, 4);
  expectError(c, [&] { DistributedDataParallel<Mlp> ddp(net, c.group); },
              {"differs across ranks", "parameter fc1.weight Float [16, 8]",
               fmt::format("rank {} has parameter fc1.weight Float [17, 8]", last)});
}

struct SlowBackward : torch::autograd::Function<SlowBackward> {
  static torch::Tensor forward(torch::autograd::AutogradContext*, torch::Tensor x) {
    return x.clone();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list g) {
    std::this_thread::sleep_for(std::chrono::milliseconds(40));
    return {g[0]};
  }
};

struct SlowMlpImpl : MlpImpl {
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = SlowBackward::apply(torch::tanh(fc1(x)));
    return fc3(SlowBackward::apply(torch::tanh(fc2(h))));
  }
};
TORCH_MODULE(SlowMlp);

void scenarioOverlap(const Ctx& c) {
  SlowMlp net;
  DdpOptions options;
  options.firstBucketBytes = 256;
  options.bucketBytes = 1024;
  DistributedDataParallel<SlowMlp> ddp(net, c.group, options);
  mse(ddp(torch::randn({4, 8})), torch::randn({4, 4})).backward();
  const auto& s = ddp.lastIteration();
  using std::chrono::milliseconds;
  EXPECT_OR_FAIL(s.bucketLaunched.size() == 3, "expected 3 buckets, got {}",
                 s.bucketLaunched.size());
  auto lead = std::chrono::duration_cast<milliseconds>(s.lastGradient - s.bucketLaunched[0]);
  EXPECT_OR_FAIL(lead >= milliseconds(60),
                 "the first bucket's allreduce started only {} ms before the last gradient; "
                 "expected >= 60 (two 40 ms layers of backward were still to run)",
                 lead.count());
  EXPECT_OR_FAIL(s.bucketLaunched[1] < s.lastGradient, "the second bucket waited for the end");
}

void scenarioCompression(const Ctx& c) {
  auto grads = [&](GradientCompression compression) {
    torch::manual_seed(21);
    Mlp net;
    DdpOptions options;
    options.compression = compression;
    DistributedDataParallel<Mlp> ddp(net, c.group, options);
    torch::manual_seed(22 + c.rank);
    mse(ddp(torch::randn({4, 8})), torch::randn({4, 4})).backward();
    return torch::cat({net->fc1->weight.grad().flatten(), net->fc2->weight.grad().flatten(),
                       net->fc3->weight.grad().flatten()});
  };
  auto exact = grads(GradientCompression::None);
  auto fp16 = grads(GradientCompression::Fp16);
  auto bf16 = grads(GradientCompression::Bf16);
  double e16 = relativeError(fp16, exact), eb16 = relativeError(bf16, exact);
  EXPECT_OR_FAIL(e16 > 0 && e16 < 2e-3, "fp16 relative error {:.3g} (expected in (0, 2e-3))", e16);
  EXPECT_OR_FAIL(eb16 > 0 && eb16 < 2e-2, "bf16 relative error {:.3g} (expected in (0, 2e-2))",
                 eb16);
  expectIdenticalAcrossRanks("fp16-compressed gradients", fp16, c);
}

constexpr size_t kSamples = 37;
SamplerOptions samplerOptions() {
  SamplerOptions o;
  o.seed = 5;
  return o;
}

void scenarioSamplerSave(const Ctx& c) {
  DistributedSampler sampler(kSamples, c.world, c.rank, samplerOptions());
  sampler.setEpoch(3);
  for (size_t k = 0; k < c.args.consumed; ++k) sampler.next(1);
  auto state = sampler.state();
  // Every rank computes the same global position.
  auto cursors = c.group->allgather(torch::tensor({static_cast<int64_t>(state.cursor)}));
  for (const auto& t : cursors) {
    EXPECT_OR_FAIL(t.item<int64_t>() == static_cast<int64_t>(state.cursor), "cursors differ");
  }
  if (c.rank == 0) {
    auto bytes = state.encode();
    std::ofstream(c.args.state, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()),
               static_cast<std::streamsize>(bytes.size()));
  }
}

void scenarioSamplerResume(const Ctx& c) {
  std::ifstream in(c.args.state, std::ios::binary);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
  DistributedSampler sampler(kSamples, c.world, c.rank, samplerOptions());
  sampler.loadState(SamplerState::decode(bytes));
  // What the interrupted run (originalWorld ranks, `consumed` each) had not yet seen.
  std::set<int64_t> owed;
  for (size_t i = 0; i < kSamples; ++i) owed.insert(static_cast<int64_t>(i));
  for (int r = 0; r < c.args.originalWorld; ++r) {
    DistributedSampler before(kSamples, c.args.originalWorld, r, samplerOptions());
    before.setEpoch(3);
    for (size_t k = 0; k < c.args.consumed && k < before.size(); ++k) {
      owed.erase(static_cast<int64_t>(before.indices()[k]));
    }
  }
  std::vector<int64_t> mine(sampler.indices().begin(), sampler.indices().end());
  auto all = c.group->allgather(torch::tensor(mine, torch::kLong));
  std::multiset<int64_t> got;
  for (const auto& t : all) {
    for (int64_t i = 0; i < t.numel(); ++i) got.insert(t[i].item<int64_t>());
  }
  for (int64_t i : owed) {
    EXPECT_OR_FAIL(got.count(i) >= 1, "sample {} was owed but no rank resumed with it", i);
  }
  size_t expectedTotal = (owed.size() + c.world - 1) / c.world * c.world;
  EXPECT_OR_FAIL(got.size() == expectedTotal, "resumed ranks hold {} samples, expected {}",
                 got.size(), expectedTotal);
}

const std::map<std::string, std::function<void(const Ctx&)>>& scenarios() {
  static const std::map<std::string, std::function<void(const Ctx&)>> table = {
      {"mlp", scenarioMlp},
      {"cnn", scenarioCnn},
      {"batchnorm", scenarioBatchNorm},
      {"nosync", scenarioNoSync},
      {"unused", scenarioUnused},
      {"unused-error", scenarioUnusedError},
      {"mismatch", scenarioMismatch},
      {"overlap", scenarioOverlap},
      {"compression", scenarioCompression},
      {"sampler-save", scenarioSamplerSave},
      {"sampler-resume", scenarioSamplerResume},
  };
  return table;
}

Args parseArgs(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    DTRAIN_CHECK_ARG(i + 1 < argc, "{} needs a value", arg);
    std::string value = argv[++i];
    if (arg == "--scenarios") {
      std::stringstream in(value);
      for (std::string s; std::getline(in, s, ',');) a.scenarios.push_back(s);
    } else if (arg == "--state") {
      a.state = value;
    } else if (arg == "--consumed") {
      a.consumed = std::stoul(value);
    } else if (arg == "--original-world") {
      a.originalWorld = std::stoi(value);
    } else {
      DTRAIN_THROW(InvalidArgument, "unknown argument {}", arg);
    }
  }
  return a;
}

int run(int argc, char** argv) {
  Ctx c;
  c.args = parseArgs(argc, argv);
  torch::set_num_threads(1);
  c.group = groupFromEnv();
  c.rank = c.group->rank();
  c.world = c.group->size();
  int failures = 0;
  for (const auto& name : c.args.scenarios) {
    auto it = scenarios().find(name);
    DTRAIN_CHECK_ARG(it != scenarios().end(), "unknown scenario {}", name);
    try {
      it->second(c);
      std::cout << fmt::format("rank {} PASS {}\n", c.rank, name) << std::flush;
    } catch (const std::exception& e) {
      ++failures;
      std::cout << fmt::format("rank {} FAIL {}: {}\n", c.rank, name, e.what()) << std::flush;
    }
    c.group->barrier();  // the next scenario starts together
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace dtrain::testing

int main(int argc, char** argv) {
  try {
    return dtrain::testing::run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "ddp_worker: " << e.what() << "\n";
    return 2;
  }
}
