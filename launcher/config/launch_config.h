#pragma once
// LaunchConfig: everything `launch` was asked to do, as a plain struct.
//
// It is filled by parseLaunchArgs() (launch_args.h) from the command line and DTRAIN_LAUNCH_*
// variables, checked by validate() without touching the machine, and only then turned into
// processes by the supervisor. Values that depend on the machine ("auto" worker counts, free
// ports, the run id when none is given) stay symbolic here and are resolved at launch time.

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "launcher/config/monitor_options.h"
#include "launcher/config/nccl_options.h"
#include "launcher/config/ssh_options.h"
#include "text.h"

namespace dtrain::launcher {

constexpr const char* kDefaultPython = "python3";
constexpr const char* kDefaultRole = "default";
constexpr const char* kDefaultRdzvBackend = "c10d";
constexpr const char* kDefaultLinePrefixTemplate = "[rank ${rank}]: ";
// A multi-node job's default: which node a line came from, too.
constexpr const char* kDefaultMultiNodeLinePrefixTemplate = "[node${node_rank} rank${rank}]: ";
constexpr int kDefaultMultiNodeStorePort = 29400;  // docs/design.md, Ports
constexpr int kDefaultMultiNodeMasterPort = 29500;
constexpr double kDefaultRdzvTimeoutSeconds = 900;
constexpr double kDefaultHeartbeatIntervalSeconds = 5;
constexpr double kDefaultHeartbeatTimeoutSeconds = 30;
constexpr int kDefaultMaxRestarts = 0;
constexpr int kDefaultMaxReforms = 3;                 // --max-reforms: per --reform-window
constexpr double kDefaultReformWindowSeconds = 3600;  // --reform-window
constexpr double kDefaultGracePeriodSeconds = 30.0;
constexpr double kDefaultMonitorIntervalSeconds = 0.1;
constexpr double kDefaultExitBarrierTimeoutSeconds = 300.0;  // torchrun's exit_barrier_timeout
constexpr double kDefaultKillTimeoutSeconds = 60.0;  // see Note [Last deadline] in supervisor.h
constexpr double kMaxTimeoutSeconds = 1e9;  // ~31 years: any longer is a typo (and overflows)
constexpr int64_t kDefaultLogMaxBytes = int64_t{1} << 30;  // per file, one rotated copy kept
constexpr int64_t kMinLogMaxBytes = 4096;
constexpr int kMaxWorkersPerNode = 4096;

// Bits of a StreamSpec value, torchrun's Std: 0 none, 1 stdout, 2 stderr, 3 both.
constexpr int kStdoutBit = 1;
constexpr int kStderrBit = 2;

// How many workers to start on this node: a count, or decided by the machine as torchrun does
// (auto: the visible GPUs, else the CPUs; gpu; cpu).
struct NprocSpec {
  enum class Kind { Count, Auto, Gpu, Cpu };
  Kind kind = Kind::Count;
  int count = 1;
};

// --on-node-loss: what a multi-node job does when a node of the running round is lost (its
// heartbeat goes silent, its agent ends, its workers are killed by a signal launch did not send).
// Restart: today's -- stop the round, restart from the checkpoint while --max-restarts lasts.
// Continue: the survivors go on in the next membership epoch (Note [Membership epochs] in
// runtime/base/membership.h; Note [Node loss] in launcher/cluster/master/node_loss.h).
enum class OnNodeLoss { Restart, Continue };

// --on-node-join: what an elastic job running below MAX of --nnodes MIN:MAX does when a node
// comes to join. Restart: today's -- stop the round through the workers' preemption path and
// plan every node in the next one (Note [Coordinator loop]). Live (needs --on-node-loss
// continue): take it into the running round in the next membership epoch; the members re-form
// with it and hand it their state (Note [Joining a running round] in
// launcher/cluster/master/node_loss.h). For DDP programs that step through TrainingState::tryStep.
enum class OnNodeJoin { Restart, Live };

// The value of --redirects / --tee: which streams of which local rank ("3", or "0:3,1:2").
struct StreamSpec {
  int all = 0;                 // ranks not listed in perRank
  std::map<int, int> perRank;  // local rank -> bits
  int streamsFor(int localRank) const;
  bool any() const;
};

struct LaunchConfig {
  // What to run. A program ending in ".py" runs under `python` unless noPython; `module` runs
  // `python -m program`.
  std::string program;
  std::vector<std::string> programArgs;
  std::string python = kDefaultPython;
  bool noPython = false;
  bool module = false;

  // The job's shape.
  NprocSpec nprocPerNode;
  int minNodes = 1;
  int maxNodes = 1;
  int nodeRank = -1;  // -1: not given (0 for one node; manual multi-node needs it)
  bool standalone = false;
  std::string rdzvBackend = kDefaultRdzvBackend;
  std::string rdzvHost;    // empty: loopback
  int rdzvPort = 0;        // 0: a free port
  std::string masterAddr;  // empty: loopback
  int masterPort = 0;      // 0: a free port
  std::string runId;       // empty: a random one at launch
  std::string role = kDefaultRole;

  // Supervision.
  int maxRestarts = kDefaultMaxRestarts;
  double monitorInterval = kDefaultMonitorIntervalSeconds;  // accepted for torchrun; we do not poll
  double gracePeriod = kDefaultGracePeriodSeconds;          // SIGTERM -> SIGKILL, seconds
  // Once a worker exits 0, the others must end within this many seconds (0: no limit). See
  // Note [Exit barrier] in supervisor/supervisor.h.
  double exitBarrierTimeout = kDefaultExitBarrierTimeoutSeconds;
  // After SIGKILL, how long to wait for every process of a worker to end before reporting the
  // ones left (state D) and exiting 125. See Note [Last deadline] in supervisor/supervisor.h.
  double killTimeout = kDefaultKillTimeoutSeconds;
  // A lost node: restart (default) or go on without it; at most maxReforms re-forms per
  // reformWindow seconds, then the restart path.
  OnNodeLoss onNodeLoss = OnNodeLoss::Restart;
  OnNodeJoin onNodeJoin = OnNodeJoin::Restart;
  int maxReforms = kDefaultMaxReforms;
  double reformWindow = kDefaultReformWindowSeconds;

  // Output.
  std::string logDir;  // empty: no log files unless redirects/tee ask for them
  StreamSpec redirects;
  StreamSpec tee;
  std::vector<int> localRanksFilter;  // empty: every local rank on the console
  std::string linePrefixTemplate = kDefaultLinePrefixTemplate;
  int64_t logMaxBytes = kDefaultLogMaxBytes;  // 0: unlimited

  // Watching the job: sampling, metrics endpoint and file, status line, stall detection.
  MonitorOptions monitor;

  std::vector<std::pair<std::string, std::string>> env;  // --env KEY=VALUE, in order
  bool dryRun = false;

  // Multi-node. Fan-out: --hostfile / --hosts (with --include / --exclude), the ssh options and
  // the remote launch; manual: --nnodes > 1 with --node-rank and --rdzv-endpoint. See
  // launcher/cluster/multinode.h.
  std::string hostfile;
  std::string hosts;    // --hosts text
  std::string include;  // DeepSpeed's host:slot syntax
  std::string exclude;
  std::string tokenFile;
  double rdzvTimeout = kDefaultRdzvTimeoutSeconds;
  double heartbeatInterval = kDefaultHeartbeatIntervalSeconds;
  double heartbeatTimeout = kDefaultHeartbeatTimeoutSeconds;
  remote::SshOptions ssh;
  std::string remoteLaunch;  // empty: the master's own path
  std::string remoteCwd;     // empty: the master's working directory
  NcclOptions nccl;
  bool check = false;  // --check: the preflight table, nothing started
  bool agent = false;  // --agent: a node's agent, its plan on stdin (started by the master)
  bool linePrefixGiven = false;

  // Every option value applied, in order ("max-restarts", "3"), from the command line and
  // DTRAIN_LAUNCH_*: the master hands the job's options to the agents of other nodes.
  std::vector<std::pair<std::string, std::string>> appliedOptions;

  // Where each option's value came from when it was not the command line
  // ("nproc-per-node" -> "DTRAIN_LAUNCH_NPROC_PER_NODE"), so messages name what the user typed.
  std::map<std::string, std::string> optionSources;
};

// "--nproc-per-node", or "DTRAIN_LAUNCH_NPROC_PER_NODE (environment)" when it came from there.
std::string optionLabel(const LaunchConfig& config, const std::string& option);

// Throws InvalidArgument naming the option and what to do. Pure: does not look at the machine.
void validate(const LaunchConfig& config);

// How much of a user's value a message quotes (a value may be 128 KiB).
constexpr size_t kMaxQuotedChars = 200;

// `text` for a one-line message: control characters escaped, at most kMaxQuotedChars of it, and
// how long it was when cut ("abc... (40000 characters)"). excerpt() leaves out the quotes.
std::string excerpt(const std::string& text);
std::string quoteValue(const std::string& text);

// Value parsers: each throws InvalidArgument naming `label` and the accepted forms.
NprocSpec parseNproc(const std::string& text, const std::string& label);
StreamSpec parseStreamSpec(const std::string& text, const std::string& label);
std::pair<int, int> parseNnodes(const std::string& text, const std::string& label);  // "2", "1:4"
std::pair<std::string, int> parseEndpoint(const std::string& text, const std::string& label);
std::vector<int> parseRankList(const std::string& text, const std::string& label);
std::pair<std::string, std::string> parseEnvAssignment(const std::string& text,
                                                       const std::string& label);
int parseIntValue(const std::string& text, const std::string& label, int64_t min, int64_t max);
double parseSeconds(const std::string& text, const std::string& label);         // > 0
double parseTimeoutSeconds(const std::string& text, const std::string& label);  // >= 0, 0: none
int64_t parseByteCount(const std::string& text, const std::string& label);      // "64k", "1G", "0"
bool parseBool(const std::string& text, const std::string& label);
OnNodeLoss parseOnNodeLoss(const std::string& text, const std::string& label);  // restart|continue
const char* onNodeLossName(OnNodeLoss mode);
OnNodeJoin parseOnNodeJoin(const std::string& text, const std::string& label);  // restart|live
// The index of `text` among `choices` ([name, what it means], ...), else InvalidArgument: "LABEL
// "text": use a (what a means) or b (...)".
size_t parseChoice(const std::string& text, const std::string& label,
                   const std::vector<std::pair<const char*, const char*>>& choices);

// The number of workers for `spec` on a machine with `cpus` usable CPUs and `gpus` visible GPUs.
// Throws InvalidArgument for "gpu" on a machine without GPUs.
int resolveNproc(const NprocSpec& spec, int cpus, int gpus);

// The console prefix of one worker's lines: ${rank}, ${local_rank}, ${role_name}, ${attempt},
// ${node_rank}.
std::string expandLinePrefix(const std::string& templ, int rank, int localRank,
                             const std::string& role, int attempt, int nodeRank = 0);

// True when the config describes a job on more than one node (or on a host list).
bool isMultiNode(const LaunchConfig& config);

// Variables of the worker environment (docs/design.md#worker-environment) that --env may not
// override.
bool isReservedWorkerVariable(const std::string& name);

}  // namespace dtrain::launcher
