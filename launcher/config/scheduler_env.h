#pragma once
// Launch options implied by a scheduler's environment, below the command line and
// DTRAIN_LAUNCH_* in precedence:
//   - Slurm, inside an allocation of more than one node (one launch per node, e.g. `srun
//     --ntasks-per-node=1 launch ...`): SLURM_JOB_NODELIST (expanded without scontrol),
//     SLURM_NNODES and SLURM_NODEID give --nnodes, --node-rank and the rendezvous host (the
//     list's first node);
//   - Kubernetes' PyTorchJob, which starts torchrun-style jobs through PET_* variables (torchrun
//     reads PET_<OPTION>): PET_NNODES, PET_NODE_RANK, PET_NPROC_PER_NODE, PET_MASTER_ADDR (the
//     rendezvous host, and MASTER_ADDR), PET_MASTER_PORT (MASTER_PORT), PET_RDZV_ENDPOINT,
//     PET_RDZV_ID, PET_MAX_RESTARTS.
// Pure: a function of the variables; parseLaunchArgs() applies the result.

#include <map>
#include <string>
#include <vector>

namespace dtrain::launcher {

struct SchedulerSetting {
  std::string option;  // a launch option ("nnodes")
  std::string value;
  std::string source;  // the variable(s) it came from, for messages ("SLURM_NNODES")
};

// PET_* wins over SLURM_* when both are present (a PyTorchJob is never inside Slurm; a Slurm job
// that sets PET_* meant them). Throws InvalidArgument naming the variable when a Slurm node list
// cannot be expanded or does not match SLURM_NNODES.
std::vector<SchedulerSetting> schedulerSettings(const std::map<std::string, std::string>& env);

}  // namespace dtrain::launcher
