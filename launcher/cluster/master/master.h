#pragma once
// The master of a multi-node job, in the launch that hosts the store (the fan-out master, or node
// rank 0 of a manual job): its monitor, which aggregates the job, and its Coordinator, on a thread
// of its own, on the store.

#include <atomic>
#include <functional>
#include <memory>
#include <thread>

#include "dtrain/base/tcp_store.h"
#include "launcher/cluster/master/coordinator.h"
#include "launcher/cluster/plan/plan.h"
#include "launcher/exit_codes.h"
#include "launcher/monitor/monitor.h"

namespace dtrain::launcher {

class Master {
 public:
  // Makes the master's monitor (Note [Monitor roles] in launcher/monitor/monitor.h): binding
  // --metrics-port here makes a busy one a usage error before any node starts.
  // `server`: the job's store, in this process (its request counts are logged); may be null.
  Master(const LaunchConfig& config, const MultiNodePlan& plan,
         const store::TcpStoreServer* server = nullptr);
  ~Master();
  Master(const Master&) = delete;
  Master& operator=(const Master&) = delete;

  // Connects to the store and runs the coordinator on a thread of its own. `wake` (may be empty)
  // is called on that thread when the coordinator has nodes to start again, and once it has ended
  // the job.
  void start(std::function<void()> wake = {});
  Coordinator& coordinator() { return *coordinator_; }
  // The coordinator has ended the job.
  bool done() const { return done_; }
  // Waits until the coordinator has ended the job and stops the monitor; launch's exit code.
  int finish();

 private:
  const LaunchConfig& config_;
  const MultiNodePlan& plan_;
  const store::TcpStoreServer* server_;
  std::unique_ptr<monitor::Monitor> watcher_;
  std::unique_ptr<Coordinator> coordinator_;
  std::atomic<bool> done_{false};
  int code_ = kExitInfrastructure;  // written by thread_, read after it is joined
  std::thread thread_;
};

}  // namespace dtrain::launcher
