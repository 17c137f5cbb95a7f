// comm_worker: a torch-free program that does nothing but collectives, for the communicator's
// real-process tests (comm_processes_test.cpp, beside it). Started by `launch`, or directly with
// srun/mpirun-style variables. Joins the world through connectWorld() (what dtrain::init() does,
// minus torch), then runs --iters allreduces, each checked against its closed form (rank r
// contributes r + i % 5, plus the iteration).
//
// At each iteration i it obeys the process-level faults of DTRAIN_FAULT with step=i (exit,
// signal, abort, stop, slow); the runtime-level ones (hang, skip-collective, wrong-shape) are the
// communicator's, whose sequence numbers equal i here.
//
// Prints (stdout, line-buffered):
//   "rank R/N: ready backend=gloo launcher=launch pid=P"
//   "rank R/N: FAILED at iteration I after MS ms: <error>"   then exits 3 (4: InvalidArgument)
//   "rank R/N: OK: I allreduces of C floats, every element exact"  at the end, exit 0
//
// Flags: --iters N (10), --count C (4096), --timeout-ms T (3000), --shape A,B (sent as the
// tensor shape; default C), --iter-ms MS (sleep per iteration), --ignore-sigterm (survivors keep
// running after launch starts tearing the job down, so they can report their own failure),
// --check (DTRAIN_CHECK_COLLECTIVES for this world).
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/base/error.h"
#include "dtrain/base/progress.h"
#include "dtrain/comm/world.h"
#include "fault.h"

namespace {

using Clock = std::chrono::steady_clock;
using dtrain::fault::Kind;

struct Flags {
  int iters = 10;
  size_t count = 4096;
  int timeoutMs = 3000;
  std::vector<int64_t> shape;
  int iterMs = 0;
  bool ignoreSigterm = false;
  bool check = false;
};

Flags parse(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "comm_worker: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--iters") f.iters = std::stoi(next());
    else if (a == "--count") f.count = std::stoul(next());
    else if (a == "--timeout-ms") f.timeoutMs = std::stoi(next());
    else if (a == "--iter-ms") f.iterMs = std::stoi(next());
    else if (a == "--ignore-sigterm") f.ignoreSigterm = true;
    else if (a == "--check") f.check = true;
    else if (a == "--shape") {
      std::string s = next();
      for (size_t at = 0; at <= s.size();) {
        size_t comma = s.find(',', at);
        f.shape.push_back(std::stoll(s.substr(at, comma - at)));
        if (comma == std::string::npos) break;
        at = comma + 1;
      }
    } else {
      std::fprintf(stderr, "comm_worker: unknown flag %s\n", a.c_str());
      std::exit(2);
    }
  }
  return f;
}

// Process-level faults; hang / skip-collective / wrong-shape belong to the communicator.
void injectProcessFaults(int rank, int64_t step) {
  for (const auto& f : dtrain::fault::activeFaults()) {
    const bool processLevel = f.kind == Kind::Exit || f.kind == Kind::Signal ||
                              f.kind == Kind::Abort || f.kind == Kind::Stop || f.kind == Kind::Slow;
    if (processLevel && f.matches(rank, step, 0)) {
      std::printf("rank %d: fault %s at iteration %lld\n", rank, f.describe().c_str(),
                  static_cast<long long>(step));
      std::fflush(stdout);
      dtrain::fault::execute(f);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  const Flags flags = parse(argc, argv);
  if (flags.ignoreSigterm) signal(SIGTERM, SIG_IGN);
  dtrain::comm::World world;
  std::string who = "rank ?";
  int iteration = -1;
  auto started = Clock::now();
  try {
    dtrain::comm::WorldOptions o;
    o.timeout = std::chrono::milliseconds(flags.timeoutMs);
    o.connectTimeout = std::chrono::milliseconds(20000);
    o.checkCollectives = flags.check;
    world = dtrain::comm::connectWorld(o);
    auto& c = *world.communicator;
    who = "rank " + std::to_string(c.rank()) + "/" + std::to_string(c.size());
    std::printf("%s: ready backend=%s launcher=%s pid=%d\n", who.c_str(), world.backend.c_str(),
                dtrain::comm::launcherName(world.env.launcher), static_cast<int>(getpid()));
    std::vector<float> data(flags.count);
    dtrain::comm::CallOptions call;
    call.shape = flags.shape;
    const int n = c.size();
    for (iteration = 0; iteration < flags.iters; ++iteration) {
      dtrain::progress::setStep(iteration);  // what launch's stall report shows as the step
      injectProcessFaults(c.rank(), iteration);
      for (size_t i = 0; i < data.size(); ++i)
        data[i] = static_cast<float>(c.rank() + i % 5 + iteration);
      started = Clock::now();
      c.allreduce(data.data(), data.size(), dtrain::comm::DataType::Float32,
                  dtrain::comm::ReduceOp::Sum, call);
      // A collective skipped by fault injection leaves the data as it was: nothing to check.
      const bool skipped = dtrain::fault::findFault(Kind::SkipCollective, c.rank(), iteration, 0);
      for (size_t i = 0; i < data.size() && !skipped; ++i) {
        const float want = static_cast<float>(n * (n - 1) / 2 + n * (i % 5 + iteration));
        if (data[i] != want) {
          std::printf("%s: WRONG at iteration %d element %zu: %g, expected %g\n", who.c_str(),
                      iteration, i, data[i], want);
          return 5;
        }
      }
      if (flags.iterMs > 0) std::this_thread::sleep_for(std::chrono::milliseconds(flags.iterMs));
    }
    dtrain::comm::shutdownWorld(world);
    std::printf("%s: OK: %d allreduces of %zu floats, every element exact\n", who.c_str(),
                flags.iters, flags.count);
    return 0;
  } catch (const std::exception& e) {
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - started).count();
    std::printf("%s: FAILED at iteration %d after %.0f ms: %s\n", who.c_str(), iteration, ms,
                e.what());
    std::fflush(stdout);
    return dynamic_cast<const dtrain::InvalidArgument*>(&e) ? 4 : 3;
  }
}
