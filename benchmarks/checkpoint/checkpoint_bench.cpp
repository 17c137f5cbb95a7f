// checkpoint_bench: dtrain's Checkpointer beside the peers that do the same job, interleaved in
// one run (benchmarks/README.md, "checkpoint_bench").
//
//   checkpoint_bench [--reps N] [--dir D] [--no-peer] [--smoke]
//       I/O: a ResNet-50-sized state (25.6M parameters + SGD momentum + BatchNorm buffers, ~205 MB)
//       saved and loaded by dtrain, by torch.save/torch.load (DTRAIN_PYTHON's torch, with fsync),
//       and written by `dd conv=fsync` / read by `dd` (raw bytes, the floor); cold reads after
//       posix_fadvise(DONTNEED) on the file (no root needed).
//   launch --nproc-per-node R checkpoint_bench --train [--steps N] [--every K] [--rounds N]
//                                              [--smoke]
//       Training throughput with no checkpoints, a synchronous save every K steps and an
//       asynchronous one, interleaved round by round: the cost per step and what an async save
//       costs the step it overlaps.
//   launch --nproc-per-node R checkpoint_bench --sharded --job save|load ...
//       One job of dcp_bench.py: sharded checkpoints (ZeRO-3) beside PyTorch's DCP over FSDP2
//       (sharded_bench.h).
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "common/stats.h"
#include "dtrain/base/store.h"
#include "dtrain/dtrain.h"
#include "sharded_bench.h"

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

using dtrain::bench::median;

// The parameters and buffers of torchvision's resnet50 (25,557,032 parameters), by shape.
// `small` (--smoke): the first stage only.
struct ResNet50State : torch::nn::Module {
  explicit ResNet50State(bool small) {
    conv("conv1", 64, 3, 7);
    bn("bn1", 64);
    const int blocks[] = {3, small ? 0 : 4, small ? 0 : 6, small ? 0 : 3},
              planes[] = {64, 128, 256, 512};
    int64_t in = 64;
    for (int l = 0; l < 4; ++l) {
      for (int b = 0; b < blocks[l]; ++b) {
        std::string p = fmt::format("layer{}_{}_", l + 1, b);
        int64_t w = planes[l];
        conv(p + "conv1", w, in, 1);
        bn(p + "bn1", w);
        conv(p + "conv2", w, w, 3);
        bn(p + "bn2", w);
        conv(p + "conv3", w * 4, w, 1);
        bn(p + "bn3", w * 4);
        if (b == 0) {
          conv(p + "downsample_0", w * 4, in, 1);
          bn(p + "downsample_1", w * 4);
        }
        in = w * 4;
      }
    }
    register_parameter("fc_weight", torch::randn({1000, in}));
    register_parameter("fc_bias", torch::randn({1000}));
  }
  void conv(const std::string& name, int64_t out, int64_t in, int64_t k) {
    register_parameter(name + "_weight", torch::randn({out, in, k, k}));
  }
  void bn(const std::string& name, int64_t c) {
    register_parameter(name + "_weight", torch::randn({c}));
    register_parameter(name + "_bias", torch::randn({c}));
    register_buffer(name + "_running_mean", torch::randn({c}));
    register_buffer(name + "_running_var", torch::rand({c}));
    register_buffer(name + "_num_batches_tracked", torch::zeros({}, torch::kLong));
  }
};

// A child process with a pipe each way (the Python peer) or none (dd).
struct Child {
  pid_t pid = -1;
  FILE* in = nullptr;   // its stdin
  FILE* out = nullptr;  // its stdout
};

Child spawn(const std::vector<std::string>& argv, bool pipes) {
  int toChild[2] = {-1, -1}, fromChild[2] = {-1, -1};
  if (pipes && (::pipe(toChild) != 0 || ::pipe(fromChild) != 0)) return {};
  Child c;
  c.pid = ::fork();
  if (c.pid == 0) {
    if (pipes) {
      ::dup2(toChild[0], 0);
      ::dup2(fromChild[1], 1);
      ::close(toChild[1]);
      ::close(fromChild[0]);
    }
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    ::_exit(127);
  }
  if (pipes) {
    ::close(toChild[0]);
    ::close(fromChild[1]);
    c.in = ::fdopen(toChild[1], "w");
    c.out = ::fdopen(fromChild[0], "r");
  }
  return c;
}

int waitChild(const Child& c) {
  int status = 0;
  ::waitpid(c.pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

double timeCommand(const std::vector<std::string>& argv) {
  auto t = Clock::now();
  Child c = spawn(argv, false);
  DTRAIN_CHECK(waitChild(c) == 0, "{} failed", argv[0]);
  return since(t);
}

struct Peer {
  Child child;
  bool ok = false;
  double ask(const std::string& command) {
    std::fprintf(child.in, "%s\n", command.c_str());
    std::fflush(child.in);
    char line[256];
    DTRAIN_CHECK(std::fgets(line, sizeof(line), child.out), "the torch peer died at \"{}\"",
                 command);
    return std::atof(line);
  }
};

uint64_t fileSize(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

std::shared_ptr<dtrain::ProcessGroup> soloGroup() {
  dtrain::InitOptions o;
  o.rank = 0;
  o.worldSize = 1;
  o.localRank = 0;
  o.store = std::make_shared<dtrain::store::HashStore>();
  o.backend = "gloo";
  return dtrain::init(o);
}

// The torch.save/torch.load peer (checkpoint_peer.py, run by the build's DTRAIN_PYTHON) over the
// same state's shapes; not ok when Python or torch is missing.
Peer startPeer(const std::string& dir, torch::nn::Module& model) {
  Peer peer;
  if (::access(DTRAIN_PYTHON, X_OK) != 0) return peer;
  nlohmann::json spec;
  spec["model"] = nlohmann::json::array();
  spec["optimizer"] = nlohmann::json::array();
  for (const auto& p : model.named_parameters()) {
    spec["model"].push_back({p.key(), p.value().sizes().vec()});
    spec["optimizer"].push_back({p.key(), p.value().sizes().vec()});
  }
  for (const auto& b : model.named_buffers())
    spec["model"].push_back({b.key(), b.value().sizes().vec()});
  std::ofstream(dir + "/spec.json") << spec.dump();
  peer.child = spawn(
      {DTRAIN_PYTHON, DTRAIN_CHECKPOINT_BENCH_DIR "/checkpoint_peer.py", dir + "/spec.json"}, true);
  char line[64];
  peer.ok = std::fgets(line, sizeof(line), peer.child.out) && std::string(line) == "ready\n";
  if (!peer.ok) std::printf("# torch peer unavailable (%s cannot import torch)\n", DTRAIN_PYTHON);
  return peer;
}

// Seconds per operation, one sample per repetition; the files' sizes.
struct IoTimes {
  std::map<std::string, std::vector<double>> t;
  uint64_t bytes = 0, torchBytes = 0;
};

// Every operation once per repetition, the contenders interleaved.
IoTimes measureIo(int reps, dtrain::Checkpointer& checkpointer, Peer& peer,
                  const std::string& dir) {
  IoTimes io;
  auto& t = io.t;
  int64_t step = 0;
  for (int rep = 0; rep < reps; ++rep) {
    // Each timed operation starts once the previous save's pruning (which runs after save() and
    // wait() return, on the save thread) has ended, as it has long ended in training when the
    // next save comes: committedSteps() waits for it. Neither side pays for it here.
    checkpointer.committedSteps();
    auto start = Clock::now();
    checkpointer.save(++step);
    t["save"].push_back(since(start));
    checkpointer.committedSteps();
    std::string file = checkpointer.nodeDirectory() + "/" + fmt::format("step-{:08d}", step);
    io.bytes = fileSize(file);
    // dd's input and the warm load read it from the page cache: a save of this size writes its
    // bulk with O_DIRECT (Note [Staged direct writes] in file_io.cpp) and leaves none cached,
    // where torch.save's buffered write leaves all of it.
    dtrain::bench::readIntoCache(file);
    t["dd write+fsync"].push_back(timeCommand(
        {"dd", "if=" + file, "of=" + dir + "/dd.bin", "bs=4M", "conv=fsync", "status=none"}));
    if (peer.ok) {
      t["torch.save+fsync"].push_back(peer.ask("save " + dir + "/torch.pt"));
      io.torchBytes = fileSize(dir + "/torch.pt");
    }
    start = Clock::now();
    checkpointer.restore();
    t["load"].push_back(since(start));
    if (peer.ok) t["torch.load"].push_back(peer.ask("load " + dir + "/torch.pt"));
    dtrain::bench::dropFromCache(file);
    start = Clock::now();
    checkpointer.restore();
    t["load cold"].push_back(since(start));
    if (peer.ok) {
      peer.ask("drop " + dir + "/torch.pt");
      t["torch.load cold"].push_back(peer.ask("load " + dir + "/torch.pt"));
    }
    t["dd read"].push_back(
        timeCommand({"dd", "if=" + file, "of=/dev/null", "bs=4M", "status=none"}));
    dtrain::bench::dropFromCache(dir + "/dd.bin");
    t["dd read cold"].push_back(
        timeCommand({"dd", "if=" + dir + "/dd.bin", "of=/dev/null", "bs=4M", "status=none"}));
    checkpointer.committedSteps();
    start = Clock::now();
    checkpointer.saveAsync(++step);
    t["async snapshot"].push_back(since(start));
    checkpointer.wait();
    t["async total"].push_back(since(start));
  }
  return io;
}

void printIo(IoTimes& io, int64_t numel, int reps) {
  auto& t = io.t;
  auto gbps = [](uint64_t b, double s) { return s > 0 ? b / s / 1e9 : 0.0; };
  std::printf("# state: %.1fM parameters + momentum + buffers; dtrain file %.1f MB, torch.save "
              "file %.1f MB; "
              "%d interleaved repetitions, medians\n",
              numel / 1e6, io.bytes / 1e6, io.torchBytes / 1e6, reps);
  std::printf("%-18s %10s %8s\n", "operation", "time_ms", "GB/s");
  for (const auto& [name, v] : t) {
    uint64_t b = name.rfind("torch", 0) == 0 ? io.torchBytes : io.bytes;
    std::printf("%-18s %10.1f %8.2f\n", name.c_str(), median(v) * 1e3, gbps(b, median(v)));
  }
  auto ratio = [&](const char* a, const char* b) {
    return t.count(a) && t.count(b) ? median(t[b]) / median(t[a]) : 0.0;
  };
  std::printf(
      "# ratios (above 1: dtrain faster): save vs dd+fsync %.2f, save vs torch.save+fsync %.2f, "
      "load vs torch.load %.2f (cold %.2f), load vs dd read %.2f (cold %.2f); "
      "async snapshot / sync save %.2f\n",
      ratio("save", "dd write+fsync"), ratio("save", "torch.save+fsync"),
      ratio("load", "torch.load"), ratio("load cold", "torch.load cold"), ratio("load", "dd read"),
      ratio("load cold", "dd read cold"), median(t["async snapshot"]) / median(t["save"]));
}

int benchIo(int reps, std::string dir, bool withPeer, bool small) {
  torch::set_num_threads(1);
  bool temporary = dir.empty();
  if (temporary) {
    char tmpl[] = "/tmp/dtrain-checkpoint-bench-XXXXXX";
    dir = ::mkdtemp(tmpl);
  }
  auto group = soloGroup();
  torch::manual_seed(0);
  auto model = std::make_shared<ResNet50State>(small);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  for (auto& p : model->parameters()) p.mutable_grad() = torch::randn_like(p);
  sgd.step();  // creates the momentum buffers
  int64_t numel = 0;
  for (const auto& p : model->parameters()) numel += p.numel();

  dtrain::CheckpointOptions options(dir + "/dtrain");
  options.keepLast = 2;
  options.handlePreemption = false;
  dtrain::Checkpointer checkpointer(group, options);
  checkpointer.addModule("model", model);
  checkpointer.addOptimizer("sgd", sgd);

  Peer peer;
  if (withPeer) peer = startPeer(dir, *model);
  IoTimes io = measureIo(reps, checkpointer, peer, dir);
  if (peer.ok) {
    std::fprintf(peer.child.in, "quit\n");
    std::fflush(peer.child.in);
    waitChild(peer.child);
  }
  printIo(io, numel, reps);
  if (temporary) std::system(("rm -rf " + dir).c_str());
  return 0;
}

// A model of ResNet-50's size whose step costs compute (an MLP of 26.2M parameters at width
// 4096; --smoke uses width 256).
torch::nn::Sequential trainModel(int64_t width) {
  return torch::nn::Sequential(torch::nn::Linear(1024, width), torch::nn::ReLU(),
                               torch::nn::Linear(width, width), torch::nn::ReLU(),
                               torch::nn::Linear(width, 1024), torch::nn::ReLU(),
                               torch::nn::Linear(1024, 1000));
}

// Every rank needs the same directory: rank 0 makes it and broadcasts its path.
std::string sharedTempDir(dtrain::ProcessGroup& group) {
  char tmpl[] = "/tmp/dtrain-checkpoint-train-XXXXXX";
  std::string dir;
  if (group.rank() == 0) dir = ::mkdtemp(tmpl);
  auto path = torch::zeros({256}, torch::kByte);
  std::memcpy(path.data_ptr(), dir.data(), dir.size());
  group.broadcast(path);
  return reinterpret_cast<const char*>(path.data_ptr());
}

constexpr const char* kVariants[] = {"none", "sync", "async"};

// Per variant: every step's duration (a save's call included in its step), the saves' calls,
// the steps that held a save, the rounds' durations. Seconds.
struct TrainTimes {
  std::map<std::string, std::vector<double>> durations, saveCalls, total;
  std::map<std::string, std::vector<size_t>> saveAt;
};

struct TrainJob {
  dtrain::DistributedDataParallel<torch::nn::Sequential>& ddp;
  torch::optim::SGD& sgd;
  dtrain::Checkpointer& checkpointer;
  torch::Tensor x, y;
};

// --rounds rounds of --steps steps per variant, the variants interleaved round by round.
TrainTimes runVariants(TrainJob& job, int steps, int every, int rounds) {
  TrainTimes times;
  int64_t saveStep = 0;
  for (int round = 0; round < rounds; ++round) {
    for (const char* variant : kVariants) {
      std::string v = variant;
      auto begin = Clock::now();
      for (int s = 0; s < steps; ++s) {
        auto t = Clock::now();
        job.sgd.zero_grad();
        torch::nn::functional::cross_entropy(job.ddp(job.x), job.y).backward();
        job.sgd.step();
        // Mid-period, so that a save's window of steps lies inside the round.
        if (s % every == every / 2 && v != "none") {
          auto st = Clock::now();
          if (v == "sync") {
            job.checkpointer.save(++saveStep);
          } else {
            job.checkpointer.saveAsync(++saveStep);
          }
          times.saveCalls[v].push_back(since(st));
          times.saveAt[v].push_back(times.durations[v].size());
        }
        times.durations[v].push_back(since(t));
      }
      job.checkpointer.wait();
      times.total[v].push_back(since(begin));
    }
  }
  return times;
}

// Note [Paired costs]
// The machine's load swings more between rounds than a save costs, so the cost of a save is
// measured step by step: the plain step P is the median of every step that neither holds a save
// nor follows one within kWindow steps (the background write of an async save overlaps those); a
// save costs the sum of (step - P) over its window.
// The level of a whole round can still move by more than 10 ms a step against P (the variants'
// rounds take turns, and the load, the page cache and the memory a round's allocations land on
// differ between them), and five such steps are as much as an asynchronous save's whole cost.
// So each save is also measured against its own round: its local level L is the median of the
// kLocal steps just before it (the previous save lies 40 steps or more before those), and
// `local` columns sum (step - L) over the window. The `none` variant, which never saves, is
// measured the same way at the asynchronous saves' positions: a control, which shows how far
// the estimate strays when there is no save at all.
constexpr size_t kWindow = 5;
constexpr size_t kLocal = 10;

double plainStep(TrainTimes& times) {
  std::vector<double> plain;
  for (const char* variant : kVariants) {
    const auto& durations = times.durations[variant];
    std::vector<bool> near(durations.size(), false);
    for (size_t at : times.saveAt[variant]) {
      for (size_t i = at; i < std::min(at + kWindow, durations.size()); ++i) near[i] = true;
    }
    for (size_t i = 0; i < durations.size(); ++i) {
      if (!near[i]) plain.push_back(durations[i]);
    }
  }
  return median(plain);
}

void printTrain(TrainTimes& times, double P, int every) {
  std::printf("%-6s %10s %14s %14s %12s %12s %12s %12s %12s\n", "saves", "round_s", "save_call_ms",
              "save_step_ms", "loss_step_%", "window_ms", "loss_win_%", "local_ms", "loss_local_%");
  for (const char* variant : kVariants) {
    std::string v = variant;
    const auto& durations = times.durations[v];
    std::vector<double> costs, locals, saveSteps;
    // `none` saves nothing: its windows at the asynchronous saves' places are the control.
    for (size_t at : times.saveAt[v == "none" ? std::string("async") : v]) {
      const size_t end = std::min(at + kWindow, durations.size());
      double c = 0;
      for (size_t i = at; i < end; ++i) c += durations[i] - P;
      costs.push_back(c);
      if (v != "none") saveSteps.push_back(durations[at]);
      if (at < kLocal) continue;  // no round of its own before it (--smoke)
      const double level = median(
          std::vector<double>(durations.begin() + static_cast<long>(at - kLocal),
                              durations.begin() + static_cast<long>(at)));
      double l = 0;
      for (size_t i = at; i < end; ++i) l += durations[i] - level;
      locals.push_back(l);
    }
    const double cost = v == "none" ? 0.0 : median(costs);
    const double local = median(locals);
    // loss_step_%: the save's own step over a plain one; loss_win_%: the whole window's excess
    // (for async, the background write's competition too); loss_local_%: the window against the
    // round's own level (Note [Paired costs]); each per `every` steps.
    double stepExcess = saveSteps.empty() ? 0 : median(saveSteps) - P;
    std::printf("%-6s %10.2f %14.1f %14.1f %12.2f %12.1f %12.2f %12.1f %12.2f\n", variant,
                median(times.total[v]), median(times.saveCalls[v]) * 1e3, median(saveSteps) * 1e3,
                stepExcess / (every * P) * 100, cost * 1e3, cost / (every * P) * 100, local * 1e3,
                local / (every * P) * 100);
  }
  // Where a save's cost falls: each step after it, over P, the median over the saves; the steps
  // past the window show what the window leaves out.
  for (const char* variant : {"sync", "async"}) {
    const auto& durations = times.durations[variant];
    std::printf("# %s: steps s+0 .. s+%zu over P, ms (median over its saves; window | after):",
                variant, 2 * kWindow - 1);
    for (size_t offset = 0; offset < 2 * kWindow; ++offset) {
      std::vector<double> excess;
      for (size_t at : times.saveAt[variant]) {
        if (at + offset < durations.size()) excess.push_back(durations[at + offset] - P);
      }
      std::printf("%s %.1f", offset == kWindow ? " |" : "", median(excess) * 1e3);
    }
    std::printf("\n");
  }
  std::vector<double> asyncSteps;
  for (size_t at : times.saveAt["async"]) asyncSteps.push_back(times.durations["async"][at]);
  std::printf("# an async save costs the step it starts in %.1f ms over a plain step: %.0f%% of a "
              "synchronous save's call (%.1f ms)\n",
              (median(asyncSteps) - P) * 1e3,
              (median(asyncSteps) - P) / median(times.saveCalls["sync"]) * 100,
              median(times.saveCalls["sync"]) * 1e3);
}

int benchTrain(int steps, int every, int rounds, int batch, int64_t width) {
  torch::set_num_threads(1);
  auto group = dtrain::init();
  const std::string dir = sharedTempDir(*group);
  torch::manual_seed(0);
  auto net = trainModel(width);
  dtrain::DistributedDataParallel<torch::nn::Sequential> ddp(net, group);
  torch::optim::SGD sgd(ddp.parameters(), torch::optim::SGDOptions(0.001).momentum(0.9));
  dtrain::CheckpointOptions options(dir);
  options.handlePreemption = false;
  options.keepLast = 2;
  dtrain::Checkpointer checkpointer(group, options);
  checkpointer.addModule("model", net);
  checkpointer.addOptimizer("sgd", sgd);
  TrainJob job{ddp, sgd, checkpointer, torch::randn({batch, 1024}),
               torch::randint(0, 1000, {batch})};
  TrainTimes times = runVariants(job, steps, every, rounds);
  if (group->rank() == 0) {
    int64_t numel = 0;
    for (const auto& p : net->parameters()) numel += p.numel();
    const double P = plainStep(times);  // Note [Paired costs]
    std::printf(
        "# %d rank(s), %.1fM parameters, batch %d per rank, a save every %d steps, %d rounds of "
        "%d steps per variant, interleaved; plain step %.1f ms (median)\n",
        group->size(), numel / 1e6, batch, every, rounds, steps, P * 1e3);
    printTrain(times, P, every);
    std::system(("rm -rf " + dir).c_str());
  }
  group->shutdown();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc > 1 && std::string(argv[1]) == "--sharded") {
      dtrain::bench::ShardedConfig config;
      try {
        config = dtrain::bench::parseShardedArgs(argc - 2, argv + 2);
      } catch (const std::exception& e) {  // parsing throws for usage errors only (a bad number)
        std::fprintf(stderr, "checkpoint_bench: %s\n", e.what());
        return 2;
      }
      return dtrain::bench::runShardedJob(config);
    }
    bool train = false, smoke = false, peer = true;
    int reps = 5, steps = 100, every = 50, rounds = 2, batch = 16;
    std::string dir;
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      auto num = [&] { return i + 1 < argc ? std::atoi(argv[++i]) : 0; };
      if (a == "--train") train = true;
      else if (a == "--smoke") smoke = true;
      else if (a == "--no-peer") peer = false;
      else if (a == "--reps") reps = num();
      else if (a == "--steps") steps = num();
      else if (a == "--every") every = num();
      else if (a == "--rounds") rounds = num();
      else if (a == "--batch") batch = num();
      else if (a == "--dir") dir = i + 1 < argc ? argv[++i] : "";
      else if (a == "--help" || a == "-h") {
        std::printf(
            "usage: checkpoint_bench [--reps N] [--dir D] [--no-peer] [--smoke]\n"
            "       launch --nproc-per-node R checkpoint_bench --train [--steps N] [--every K] "
            "[--rounds N] [--batch B] [--smoke]\n"
            "       launch --nproc-per-node R checkpoint_bench --sharded --job save|load "
            "--dir D --reference F --result F\n"
            "              [--io N] [--width N] [--layers N] [--batch B]   "
            "(dcp_bench.py runs it)\n");
        return 0;
      } else {
        std::fprintf(stderr, "checkpoint_bench: unknown argument %s (see --help)\n", a.c_str());
        return 2;
      }
    }
    if (smoke) {
      reps = 1;
      steps = 4;
      every = 2;
      rounds = 1;
      batch = 2;
    }
    DTRAIN_CHECK_ARG(reps > 0 && steps > 0 && every > 0 && rounds > 0 && batch > 0,
                     "counts must be positive");
    return train ? benchTrain(steps, every, rounds, batch, smoke ? 256 : 4096)
                 : benchIo(reps, dir, peer && !smoke, smoke);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "checkpoint_bench: %s\n", e.what());
    return 1;
  }
}
