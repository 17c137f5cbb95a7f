#pragma once
// The worker environment (docs/design.md#worker-environment), by name. The launcher writes it
// (launcher/node/worker_env.*), the runtime reads it (dtrain::init); both spell the names from
// here.

namespace dtrain::env {

// torchrun's variables, so a PyTorch script runs unchanged under `launch`.
constexpr const char* kRank = "RANK";
constexpr const char* kLocalRank = "LOCAL_RANK";
constexpr const char* kWorldSize = "WORLD_SIZE";
constexpr const char* kLocalWorldSize = "LOCAL_WORLD_SIZE";
constexpr const char* kGroupRank = "GROUP_RANK";
constexpr const char* kGroupWorldSize = "GROUP_WORLD_SIZE";
constexpr const char* kRoleRank = "ROLE_RANK";
constexpr const char* kRoleWorldSize = "ROLE_WORLD_SIZE";
constexpr const char* kRoleName = "ROLE_NAME";
constexpr const char* kMasterAddr = "MASTER_ADDR";
constexpr const char* kMasterPort = "MASTER_PORT";
constexpr const char* kRestartCount = "TORCHELASTIC_RESTART_COUNT";
constexpr const char* kMaxRestarts = "TORCHELASTIC_MAX_RESTARTS";
constexpr const char* kRunId = "TORCHELASTIC_RUN_ID";
constexpr const char* kUseAgentStore = "TORCHELASTIC_USE_AGENT_STORE";
constexpr const char* kErrorFile = "TORCHELASTIC_ERROR_FILE";
constexpr const char* kOmpNumThreads = "OMP_NUM_THREADS";
constexpr const char* kCudaVisibleDevices = "CUDA_VISIBLE_DEVICES";

// dtrain's own.
constexpr const char* kStoreAddr = "DTRAIN_STORE_ADDR";
constexpr const char* kStorePort = "DTRAIN_STORE_PORT";
constexpr const char* kStoreToken = "DTRAIN_STORE_TOKEN";  // secret: environment only
constexpr const char* kDtrainRestartCount = "DTRAIN_RESTART_COUNT";
constexpr const char* kDtrainRunId = "DTRAIN_RUN_ID";
// The node's stable id (a decimal integer): the host-list index of a fan-out job, --node-rank of a
// manual one (SLURM_NODEID, PET_NODE_RANK). Unlike GROUP_RANK it does not change when an elastic
// job re-forms with other nodes; node-local state (checkpoint directories, shard replicas) is
// keyed by it. Readers fall back to GROUP_RANK when it is absent (torchrun, srun without launch).
constexpr const char* kNodeId = "DTRAIN_NODE_ID";
// `launch --on-node-loss continue`: "continue" tells the runtime to watch the round's membership
// epochs (Note [Membership epochs] in membership.h) and re-form in memory when a node is lost;
// absent under the default (restart). DTRAIN_NODE_LOSS_WAIT: the seconds a worker whose
// collective failed waits for the master's next epoch before it fails as today
// (--heartbeat-timeout + 5).
constexpr const char* kOnNodeLoss = "DTRAIN_ON_NODE_LOSS";
constexpr const char* kNodeLossWait = "DTRAIN_NODE_LOSS_WAIT";
// The membership epoch a worker of a node taken into a running round starts in (`launch
// --on-node-join live`); unset or 0: the round's plan.
constexpr const char* kJoinEpoch = "DTRAIN_JOIN_EPOCH";
// The seconds a member's step in flight may run on once a node taken into the running round is
// ready, before it is cut short for the join (Note [Joins at step boundaries] in
// runtime/comm/world_reform.cpp); 20 when unset, 0: at once. Forwarded like the settings below.
constexpr const char* kJoinWait = "DTRAIN_JOIN_WAIT";

// Runtime settings, forwarded to every node.
constexpr const char* kVerbose = "DTRAIN_VERBOSE";
constexpr const char* kBackend = "DTRAIN_BACKEND";
constexpr const char* kShm = "DTRAIN_SHM";
constexpr const char* kFault = "DTRAIN_FAULT";
constexpr const char* kIoFault = "DTRAIN_IO_FAULT";

// Launcher options from the environment: DTRAIN_LAUNCH_<OPTION>, never forwarded.
constexpr const char* kLaunchOptionPrefix = "DTRAIN_LAUNCH_";

// What --dry-run and logs print instead of the token.
constexpr const char* kRedacted = "<redacted>";

}  // namespace dtrain::env
