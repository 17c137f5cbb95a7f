#pragma once
// What only this node can know, found out once, in one step, before its workers start (Note
// [Node probe]): the program's path here, the CPUs and GPUs and so the number of workers, for a
// multi-node job the interface NCCL and Gloo use and this node's address toward the store, and
// that --log-dir can be written here. The one-node job (job.h) and every agent of a multi-node
// job (launcher/cluster/agent/agent.h) probe their node this way, then run the plan.

#include <string>
#include <vector>

#include "launcher/config/launch_config.h"
#include "launcher/node/nccl_env.h"
#include "launcher/node/program.h"
#include "launcher/node/worker_env.h"

namespace dtrain::launcher {

// Note [Node probe]
// ~~~~~~~~~~~~~~~~~
// The job-wide options are resolved and checked once, where the job starts (validate(), the
// multi-node plan of launcher/cluster/plan/plan.h); what depends on a node is found out on that
// node, in probeNode(), in this order: the program (127 / 126 when it is missing or not
// executable), --log-dir (writable, or creatable), the number of workers (the host list's slots or
// GPU slots, else --nproc-per-node against the CPUs and visible GPUs here), and for a multi-node
// job the interface toward the store and this node's address on it. The first problem is the
// answer: the one-node job exits with it; an agent sends it to the master in its join, and the job
// ends naming the node.

// What the node is probed for, besides the job's options.
struct ProbeRequest {
  std::string label;      // this node in messages: the host list's name, else the host name
  int slots = 0;          // workers from the host list; 0: --nproc-per-node
  std::vector<int> gpus;  // GPU slots from the host list (--include host:0,2): one worker each
  std::string storeAddr;  // a multi-node job's store; empty: a one-node job
};

struct NodeProbe {
  WorkerCommand command;   // what every worker execs, found here
  int cpuCount = 1;        // CPUs this launch may use
  int localWorldSize = 1;  // workers on this node
  InterfaceChoice iface;   // multi-node: NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME
  std::string address;     // multi-node: this node's address toward the store
};

// Probes this node (see Note [Node probe]); `environment` is the one the workers inherit (its
// PATH and CUDA_VISIBLE_DEVICES count). Throws ProgramNotFound (127), ProgramNotExecutable (126)
// or InvalidArgument (2) naming the problem on this node, dtrain::Error (125) otherwise.
NodeProbe probeNode(const LaunchConfig& config, const EnvMap& environment,
                    const ProbeRequest& request);

// `config`'s worker command resolved against the PATH of `environment`; `host` names this node
// in messages. Throws as resolveWorkerCommand() does.
WorkerCommand lookUpProgram(const LaunchConfig& config, const EnvMap& environment,
                            const std::string& host);

// Facts of this machine (its host name: net::hostName()).
int usableCpus();  // the CPUs this process may run on
// GPUs a CUDA program here would see, without loading CUDA: CUDA_VISIBLE_DEVICES when set,
// else the driver's list.
int visibleGpus(const EnvMap& environment);

// Checks that `dir` is, or can be created as, a writable directory. Throws InvalidArgument
// naming `label` and the path otherwise. Leaves nothing behind (it probes with a directory it
// removes at once).
void checkWritableDir(const std::string& dir, const std::string& label);

}  // namespace dtrain::launcher
