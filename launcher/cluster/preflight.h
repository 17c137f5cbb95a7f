#pragma once
// `launch --check`: before any GPU time is spent, every node of a host list is checked in
// parallel, with the options the real launch would use, and one table is printed, a row per node:
// ssh reachable (its error when not); launch at the same path with the same version; the program
// there and every library it links resolved (ldd); the store port free on the master and
// reachable from every node, the master port free on node 0 and reachable from the others (a
// port a firewall drops is named as such); the interface each node would use and its address;
// GPUs against the workers; libtorch / CUDA / NCCL libraries equal on every node. Exit 0 when all
// is well, else 125 with one line per problem saying what to fix.
//
// Each node runs `launch --agent` with a plan whose "mode" record is "check": the same program,
// the same ssh, the same working directory as the job.

#include <map>
#include <string>
#include <vector>

#include "launcher/cluster/plan/plan.h"
#include "launcher/config/launch_config.h"

namespace dtrain::launcher {

// One node's facts, as it prints them ("dtrain-check KEY VALUE" lines) and the master reads them.
using NodeFacts = std::map<std::string, std::string>;

// On the node: gathers the facts and prints them on stdout. `masterAddr` is node 0's address,
// `masterPort` MASTER_PORT; node 0 (requestedRank 0) holds the port open for the others' probes.
int runNodeCheck(const AgentSetup& setup, const std::string& masterAddr, int masterPort,
                 const EnvMap& environment);

// Pure: the facts from a node's stdout lines.
NodeFacts parseNodeFacts(const std::vector<std::string>& lines);

// Pure: the problems in the rows (`nodes` in node order, `labels` their hosts), one line each
// with what to fix; empty when all is well. `ssh` holds, per node, "" or why it could not run.
std::vector<std::string> preflightProblems(const std::vector<std::string>& labels,
                                           const std::vector<NodeFacts>& nodes,
                                           const std::vector<std::string>& ssh,
                                           const std::string& masterVersion,
                                           const std::string& storeWhere, int masterPort);

// The table.
std::string formatPreflightTable(const std::vector<std::string>& labels,
                                 const std::vector<NodeFacts>& nodes,
                                 const std::vector<std::string>& ssh);

// On the master: runs the check on every node of `plan` and prints the table; returns 0 or 125.
int runPreflight(const LaunchConfig& config, const MultiNodePlan& plan, const EnvMap& environment);

}  // namespace dtrain::launcher
