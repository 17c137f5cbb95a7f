#pragma once
// PeerProcess: an allreduce implementation allreduce_bench compares against, run as its own group
// of processes and driven size by size over FIFOs, so that it and dtrain are measured in the same
// run, interleaved, under the same machine load. Only rank 0 of the benchmark owns peers.
//
// Protocol: commands "run BYTES WARMUP ITERS [MODE]" and "quit", one per line, go to
// <dir>/commands (read by the peer's rank 0, which shares them) or, with perRankCommands, to
// <dir>/commands.<r> for every rank r (each rank blocks on its own FIFO between sizes, so a peer
// that busy-polls inside its collectives, as MPI does, is idle while the others are measured).
// The peer's rank 0 answers "BYTES MEDIAN_US WRONG" on <dir>/results: the median time of one call
// on rank 0, and the elements that differ from the closed form after one checked call (rank r
// contributes r + i % 5).
//
// Peers: torch.distributed (gloo) under torchrun (torch_peer.py), Open MPI's MPI_Allreduce under
// mpirun (mpi_peer.cpp), and the bare shared-memory probe (shm_probe.cpp).

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace dtrain::bench {

class PeerProcess {
 public:
  struct Result {
    double medianUs = 0;
    long wrong = 0;
  };
  struct Spec {
    std::string name;  // "torch", "mpi", "probe": for messages
    // The command line; "{dir}", "{commands}" and "{results}" in an argument are replaced by the
    // FIFO directory and paths.
    std::vector<std::string> argv;
    int ranks = 1;
    bool perRankCommands = false;
  };

  // Starts the peer (its own process group); null, having said why on stderr, when it cannot.
  static std::unique_ptr<PeerProcess> start(const Spec& spec);
  ~PeerProcess();

  // One size; nullopt (after printing the peer's log) when the peer died, timed out or refused.
  std::optional<Result> run(size_t bytes, int warmup, int iters, std::chrono::seconds timeout,
                            const std::string& mode = "");
  const std::string& name() const { return spec_.name; }

 private:
  PeerProcess() = default;
  void stop();
  void dumpLog() const;
  bool sendCommand(const std::string& line);

  Spec spec_;
  std::string dir_;
  std::vector<int> commands_;
  int results_ = -1;
  int pid_ = -1;
  std::string pending_;  // bytes read from the results FIFO but not yet consumed
};

// A loopback port nobody listens on right now (bound, then released), or 0.
int freeLoopbackPort();

// torch.distributed.all_reduce (gloo) under torchrun with `world` ranks; null when `python` cannot
// import torch.distributed.
std::unique_ptr<PeerProcess> startTorchPeer(const std::string& python, const std::string& script,
                                            int world, const std::string& dtype);
// MPI_Allreduce under `mpirun` (Open MPI, shared-memory transport) with `world` ranks; null when
// there is no mpirun or no peer binary.
std::unique_ptr<PeerProcess> startMpiPeer(const std::string& mpirun, const std::string& binary,
                                          int world, const std::string& dtype);
// The bare shared-memory probe with `world` ranks and buffers of up to `maxBytes`.
std::unique_ptr<PeerProcess> startProbe(const std::string& binary, int world, size_t maxBytes);

}  // namespace dtrain::bench
