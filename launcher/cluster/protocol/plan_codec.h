#pragma once
// The plan on an agent's stdin: how the master hands each node its AgentSetup (plan.h), as
// length-prefixed records (remote::encodePlan), never on a command line.

#include "launcher/cluster/plan/plan.h"
#include "launcher/cluster/remote/remote_command.h"

namespace dtrain::launcher {

// The plan the master writes on an agent's stdin, and its reading on the other side. The job's
// options travel as ("option", "name=value") records in the order they were applied, the
// environment as ("env", "KEY=VALUE") records, the token in its own record.
remote::Records agentPlanRecords(const AgentSetup& setup);
// `base` is the agent's own parse of its command line (`--agent -- PROGRAM ARGS...`). Throws
// InvalidArgument naming a bad record.
AgentSetup agentSetupFromRecords(const remote::Records& records, const LaunchConfig& base);

}  // namespace dtrain::launcher
