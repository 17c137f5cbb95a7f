#pragma once
// TorchPeer: PyTorch's torch.distributed.all_reduce on gloo, run as a separate process group
// (python3 -m torch.distributed.run, i.e. torchrun) that allreduce_bench drives size by size, so
// both are measured in the same run under the same machine load. Only rank 0 of the benchmark
// owns one.

#include <chrono>
#include <memory>
#include <optional>
#include <string>

namespace dtrain::bench {

// A loopback port nobody listens on right now (bound, then released), or 0.
int freeLoopbackPort();

class TorchPeer {
 public:
  struct Result {
    double medianUs = 0;
    long wrong = 0;
  };

  // Starts `world` torch workers running `script`; returns null (and says why on stderr) when
  // python or torch is missing.
  static std::unique_ptr<TorchPeer> start(const std::string& python, const std::string& script,
                                          int world, const std::string& dtype);
  ~TorchPeer();

  // Runs one size; nullopt (after printing the peer's log) if the peer died or timed out.
  std::optional<Result> run(size_t bytes, int warmup, int iters, std::chrono::seconds timeout);

 private:
  TorchPeer() = default;
  void stop();
  void dumpLog() const;

  std::string dir_;
  int commands_ = -1;
  int results_ = -1;
  int pid_ = -1;
  std::string pending_;  // bytes read from the results FIFO but not yet consumed
};

}  // namespace dtrain::bench
