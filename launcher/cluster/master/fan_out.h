#pragma once
// The fan-out master (--hostfile / --hosts): one agent per host -- over the system ssh for other
// hosts, as a child for its own -- each with its plan on stdin, while the coordinator runs the
// rounds on the store. See Note [Fan-out master loop] in fan_out.cpp.

#include <string>
#include <vector>

#include "dtrain/base/tcp_store.h"
#include "launcher/cluster/plan/plan.h"

namespace dtrain::launcher {

// The command that starts node `index`'s agent: ssh argv, or this launch for a local host.
std::vector<std::string> agentCommand(const LaunchConfig& config, const MultiNodePlan& plan,
                                      int index);

// Runs the job on every host of `plan` (the store, `server`, is up already); returns launch's exit
// code.
int runFanOut(const LaunchConfig& config, const MultiNodePlan& plan, const EnvMap& environment,
              const store::TcpStoreServer* server);

}  // namespace dtrain::launcher
