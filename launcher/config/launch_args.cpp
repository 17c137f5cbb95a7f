#include "launcher/config/launch_args.h"

#include <algorithm>
#include <cctype>
#include <string_view>

#include <fmt/format.h>

#include "dtrain/base/error.h"
#include "env_contract.h"
#include "launcher/config/hosts.h"
#include "launcher/config/scheduler_env.h"

namespace dtrain::launcher {

namespace {

using Apply = void (*)(LaunchConfig&, const std::string& value, const std::string& label);

// One row per option: the command table of `launch`. Names are canonical (dashes); torchrun's
// underscore spellings are normalised to them before lookup.
struct OptionSpec {
  const char* name;
  char shortName;         // 0: none
  const char* valueName;  // nullptr: a flag
  const char* help;
  Apply apply;                  // nullptr: handled by the caller (help, version)
  const char* alias = nullptr;  // another accepted long name (torchrun's)
};

const OptionSpec kOptions[] = {
    {"nproc-per-node", 0, "N|auto|gpu|cpu", "workers on this node (auto: visible GPUs, else CPUs)",
     [](LaunchConfig& c, const std::string& v, const std::string& l) {
       c.nprocPerNode = parseNproc(v, l);
     }},
    {"nnodes", 0, "N|MIN:MAX", "nodes in the job (1); MIN:MAX: elastic, go on with MIN or more",
     [](LaunchConfig& c, const std::string& v, const std::string& l) {
       std::tie(c.minNodes, c.maxNodes) = parseNnodes(v, l);
     }},
    {"node-rank", 0, "N", "this node's rank, manual multi-node (node 0 hosts the store)",
     [](LaunchConfig& c, const std::string& v, const std::string& l) {
       c.nodeRank = parseIntValue(v, l, 0, 65535);
     }},
    {"standalone", 0, nullptr, "one node, launcher-hosted store (the default)",
     [](LaunchConfig& c, const std::string& v, const std::string& l) {
       c.standalone = parseBool(v, l);
     }},
    {"max-restarts", 0, "N", "restart the whole group up to N times after a failure (0)",
     [](LaunchConfig& c, const std::string& v, const std::string& l) {
       c.maxRestarts = parseIntValue(v, l, 0, 1000000);
     }},
    {"on-node-loss", 0, "restart|continue",
     "a lost node: restart every node (default), or go on with the rest (multi-node)",
     [](LaunchConfig& c, const std::string& v, const std::string& l) {
       c.onNodeLoss = parseOnNodeLoss(v, l);
     }},
    {"on-node-join", 0, "restart|live",
     "a node joining an elastic job below MAX: restart every node (default), or take it in "
     "live (with on-node-loss continue)",
     [](LaunchConfig& c, const std::string& v, const std::string& l) {
       c.onNodeJoin = parseOnNodeJoin(v, l);
     }},
    {"max-reforms", 0, "K", "continue mode: at most K re-forms per window, then a restart (3)",
     [](LaunchConfig& c, const std::string& v, const std::string& l) {
       c.maxReforms = parseIntValue(v, l, 0, 1000000);
     }},
    {"reform-window", 0, "SECONDS", "the window of the re-form limit, seconds (3600)",
     [](LaunchConfig& c, const std::string& v, const std::string& l) {
       c.reformWindow = parseSeconds(v, l);
     }},
    {"monitor-interval", 0, "SECONDS",
     "accepted for torchrun and ignored (event-driven; see --sample-interval)",
     [](LaunchConfig& c, const std::string& v, const std::string& l) {
       c.monitorInterval = parseSeconds(v, l);
     }},
    {"grace-period", 0, "SECONDS", "SIGTERM to SIGKILL when stopping workers (30)",
     [](LaunchConfig& c, const std::string& v, const std::string& l) {
       c.gracePeriod = parseSeconds(v, l);
     }},
    {"exit-barrier-timeout", 0, "SECONDS",
     "after a worker exits 0, wait this long for the rest, then 124 (300; 0: none)",
     [](LaunchConfig& c, const std::string& v, const std::string& l) {
       c.exitBarrierTimeout = parseTimeoutSeconds(v, l);
     }},
    {"kill-timeout", 0, "SECONDS",
     "after SIGKILL, wait this long for workers to end, then name the survivors and exit 125 (60)",
     [](LaunchConfig& c, const std::string& v, const std::string& l) {
       c.killTimeout = parseSeconds(v, l);
     }},
    {"sample-interval", 0, "SECONDS",
     "sample workers' CPU and memory, the node and its GPUs every SECONDS (5)",
     [](LaunchConfig& c, const std::string& v, const std::string& l) {
       c.monitor.sampleInterval = parseSeconds(v, l);
     }},
    {"metrics-port", 0, "[HOST:]PORT", "serve Prometheus metrics at /metrics (0: a free port)",
     [](LaunchConfig& c, const std::string& v, const std::string& l) {
       parseMetricsEndpoint(v, l, c.monitor);
     }},
    {"metrics-file", 0, "PATH", "append every sample to PATH as JSONL metrics records",
     [](LaunchConfig& c, const std::string& v, const std::string& l) {
       DTRAIN_CHECK_ARG(!v.empty(), "{} is empty; HINT: give a file path", l);
       c.monitor.metricsFile = v;
     }},
    {"tensorboard-dir", 0, "DIR",
     "write the samples and every rank's records as TensorBoard scalars into DIR",
     [](LaunchConfig& c, const std::string& v, const std::string& l) {
       DTRAIN_CHECK_ARG(!v.empty(), "{} is empty; HINT: give a directory", l);
       c.monitor.tensorboardDir = v;
     }},
    {"status-interval", 0, "SECONDS", "print a one-line job status every SECONDS (0: off)",
     [](LaunchConfig& c, const std::string& v, const std::string& l) {
       c.monitor.statusInterval = parseTimeoutSeconds(v, l);
     }},
    {"stall-timeout", 0, "SECONDS",
     "report a stall when no rank advances for SECONDS (0: off, the default)",
     [](LaunchConfig& c, const std::string& v, const std::string& l) {
       c.monitor.stallTimeout = parseTimeoutSeconds(v, l);
     }},
    {"stall-action", 0, "report|stop", "on a stall: report and go on, or stop the job (exit 124)",
     [](LaunchConfig& c, const std::string& v, const std::string& l) {
       c.monitor.stallAction = parseStallAction(v, l);
     }},
    {"log-dir", 0, "DIR", "keep logs in DIR/RUN_ID/attempt_K/rank_N/{stdout,stderr}.log",
     [](LaunchConfig& c, const std::string& v, const std::string& l) {
       DTRAIN_CHECK_ARG(!v.empty(), "{} is empty; HINT: give a directory", l);
       c.logDir = v;
     }},
    {"redirects", 'r', "SPEC", "send streams to the log file only: 0..3 or 0:3,1:2 (torchrun)",
     [](LaunchConfig& c, const std::string& v, const std::string& l) {
       c.redirects = parseStreamSpec(v, l);
     }},
    {"tee", 't', "SPEC", "also write streams to the log file: 0..3 or 0:3,1:2 (torchrun)",
     [](LaunchConfig& c, const std::string& v, const std::string& l) {
       c.tee = parseStreamSpec(v, l);
     }},
    {"local-ranks-filter", 0, "RANKS", "show only these local ranks on the console, e.g. 0,3",
     [](LaunchConfig& c, const std::string& v, const std::string& l) {
       c.localRanksFilter = parseRankList(v, l);
     }},
    {"log-line-prefix-template", 0, "TEMPLATE",
     "console prefix; ${rank} ${local_rank} ${role_name} ${attempt} ${node_rank}",
     [](LaunchConfig& c, const std::string& v, const std::string&) {
       c.linePrefixTemplate = v;
       c.linePrefixGiven = true;
     }},
    {"log-max-bytes", 0, "BYTES", "rotate a log file past this size, 0 unlimited (1G)",
     [](LaunchConfig& c, const std::string& v, const std::string& l) {
       c.logMaxBytes = parseByteCount(v, l);
     }},
    {"env", 0, "KEY=VALUE", "set a variable for every worker (repeatable)",
     [](LaunchConfig& c, const std::string& v, const std::string& l) {
       c.env.push_back(parseEnvAssignment(v, l));
     }},
    {"run-id", 0, "ID", "job id: log directory name, TORCHELASTIC_RUN_ID (random)",
     [](LaunchConfig& c, const std::string& v, const std::string&) { c.runId = v; }, "rdzv-id"},
    {"master-addr", 0, "ADDR", "MASTER_ADDR for the workers (loopback)",
     [](LaunchConfig& c, const std::string& v, const std::string& l) {
       DTRAIN_CHECK_ARG(!v.empty(), "{} is empty", l);
       c.masterAddr = v;
     }},
    {"master-port", 0, "PORT", "MASTER_PORT, which rank 0 binds (a free port)",
     [](LaunchConfig& c, const std::string& v, const std::string& l) {
       c.masterPort = parseIntValue(v, l, 1, 65535);
     }},
    {"rdzv-endpoint", 0, "HOST:PORT", "where launch hosts the store (loopback, a free port)",
     [](LaunchConfig& c, const std::string& v, const std::string& l) {
       std::tie(c.rdzvHost, c.rdzvPort) = parseEndpoint(v, l);
     }},
    {"rdzv-backend", 0, "NAME", "accepted for torchrun: c10d or static",
     [](LaunchConfig& c, const std::string& v, const std::string&) { c.rdzvBackend = v; }},
    {"role", 0, "NAME", "ROLE_NAME of the workers (default)",
     [](LaunchConfig& c, const std::string& v, const std::string&) { c.role = v; }},
    {"python", 0, "PATH", "interpreter for .py programs and --module (python3)",
     [](LaunchConfig& c, const std::string& v, const std::string&) { c.python = v; }},
    {"no-python", 0, nullptr, "execute PROGRAM directly even if it ends in .py",
     [](LaunchConfig& c, const std::string& v, const std::string& l) {
       c.noPython = parseBool(v, l);
     }},
    {"module", 'm', nullptr, "run PROGRAM as a Python module (python -m PROGRAM)",
     [](LaunchConfig& c, const std::string& v, const std::string& l) {
       c.module = parseBool(v, l);
     }},
    {"start-method", 0, "METHOD", "accepted for torchrun (spawn|fork|forkserver); no effect",
     [](LaunchConfig&, const std::string& v, const std::string& l) {
       DTRAIN_CHECK_ARG(v == "spawn" || v == "fork" || v == "forkserver",
                        "{} {}: use spawn, fork or forkserver", l, quoteValue(v));
     }},
    {"hostfile", 0, "FILE", "start one agent per host over ssh: `host slots=N` lines",
     [](LaunchConfig& c, const std::string& v, const std::string& l) {
       DTRAIN_CHECK_ARG(!v.empty(), "{} is empty; HINT: give a file", l);
       c.hostfile = v;
     }},
    {"hosts", 0, "A,B|A:4,B:4", "like --hostfile, as a list (slots after ':')",
     [](LaunchConfig& c, const std::string& v, const std::string& l) {
       parseHostsOption(v, l);
       c.hosts = v;
     }},
    {"include", 0, "HOST[:SLOTS]@...", "only these hosts / slots of the list (DeepSpeed's syntax)",
     [](LaunchConfig& c, const std::string& v, const std::string& l) {
       parseHostFilter(v, l);
       c.include = v;
     }},
    {"exclude", 0, "HOST[:SLOTS]@...", "leave out these hosts / slots of the list",
     [](LaunchConfig& c, const std::string& v, const std::string& l) {
       parseHostFilter(v, l);
       c.exclude = v;
     }},
    {"token-file", 0, "FILE", "the job token for a manual multi-node job (or DTRAIN_STORE_TOKEN)",
     [](LaunchConfig& c, const std::string& v, const std::string& l) {
       DTRAIN_CHECK_ARG(!v.empty(), "{} is empty; HINT: give a file", l);
       c.tokenFile = v;
     }},
    {"rdzv-timeout", 0, "SECONDS", "wait this long for every node, then 124 (900)",
     [](LaunchConfig& c, const std::string& v, const std::string& l) {
       c.rdzvTimeout = parseSeconds(v, l);
     }},
    {"heartbeat-interval", 0, "SECONDS", "agents' heartbeat period (5)",
     [](LaunchConfig& c, const std::string& v, const std::string& l) {
       c.heartbeatInterval = parseSeconds(v, l);
     }},
    {"heartbeat-timeout", 0, "SECONDS", "a node silent this long is dead (30)",
     [](LaunchConfig& c, const std::string& v, const std::string& l) {
       c.heartbeatTimeout = parseSeconds(v, l);
     }},
    {"ssh-port", 0, "PORT", "ssh port of the other nodes (ssh's default)",
     [](LaunchConfig& c, const std::string& v, const std::string& l) {
       c.ssh.port = parseIntValue(v, l, 1, 65535);
     }},
    {"ssh-identity", 0, "FILE", "ssh -i FILE",
     [](LaunchConfig& c, const std::string& v, const std::string&) { c.ssh.identity = v; }},
    {"ssh-config", 0, "FILE", "ssh -F FILE",
     [](LaunchConfig& c, const std::string& v, const std::string&) { c.ssh.configFile = v; }},
    {"ssh-option", 0, "OPT=VALUE", "ssh -o OPT=VALUE (repeatable; wins over launch's own)",
     [](LaunchConfig& c, const std::string& v, const std::string& l) {
       DTRAIN_CHECK_ARG(v.find('=') != std::string::npos || v.find(' ') != std::string::npos,
                        "{} {} is not an ssh option; HINT: e.g. --ssh-option "
                        "ServerAliveInterval=5",
                        l, quoteValue(v));
       c.ssh.options.push_back(v);
     }},
    {"ssh-connect-timeout", 0, "SECONDS", "ssh -o ConnectTimeout (10)",
     [](LaunchConfig& c, const std::string& v, const std::string& l) {
       c.ssh.connectTimeout = parseSeconds(v, l);
     }},
    {"ssh-accept-new-host-keys", 0, nullptr,
     "trust a host key seen for the first time (StrictHostKeyChecking=accept-new)",
     [](LaunchConfig& c, const std::string& v, const std::string& l) {
       c.ssh.acceptNewHostKeys = parseBool(v, l);
     }},
    {"remote-launch", 0, "PATH", "launch on the other nodes (this launch's own path)",
     [](LaunchConfig& c, const std::string& v, const std::string& l) {
       DTRAIN_CHECK_ARG(!v.empty(), "{} is empty", l);
       c.remoteLaunch = v;
     }},
    {"remote-cwd", 0, "DIR", "working directory on the other nodes (this one's)",
     [](LaunchConfig& c, const std::string& v, const std::string& l) {
       DTRAIN_CHECK_ARG(!v.empty(), "{} is empty", l);
       c.remoteCwd = v;
     }},
    {"nccl-socket-ifname", 0, "IFACE|auto",
     "NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME (auto: the interface toward the store)",
     [](LaunchConfig& c, const std::string& v, const std::string& l) {
       DTRAIN_CHECK_ARG(!v.empty(), "{} is empty; HINT: an interface name, or auto", l);
       c.nccl.socketIfname = v;
     }},
    {"nccl-ib-disable", 0, nullptr, "NCCL_IB_DISABLE=1",
     [](LaunchConfig& c, const std::string& v, const std::string& l) {
       c.nccl.ibDisable = parseBool(v, l);
     }},
    {"nccl-debug", 0, "LEVEL", "NCCL_DEBUG (VERSION, WARN, INFO, TRACE)",
     [](LaunchConfig& c, const std::string& v, const std::string& l) {
       std::string u = v;
       for (auto& ch : u) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
       DTRAIN_CHECK_ARG(u == "VERSION" || u == "WARN" || u == "INFO" || u == "TRACE",
                        "{} {}: use VERSION, WARN, INFO or TRACE", l, quoteValue(v));
       c.nccl.debug = u;
     }},
    {"nccl-debug-subsys", 0, "LIST", "NCCL_DEBUG_SUBSYS, e.g. INIT,NET",
     [](LaunchConfig& c, const std::string& v, const std::string&) { c.nccl.debugSubsys = v; }},
    {"check", 0, nullptr,
     "preflight every node (ssh, binaries, libraries, ports, GPUs); start "
     "nothing",
     [](LaunchConfig& c, const std::string& v, const std::string& l) {
       c.check = parseBool(v, l);
     }},
    {"agent", 0, nullptr, "internal: a node's agent, started by the master (plan on stdin)",
     [](LaunchConfig& c, const std::string& v, const std::string& l) {
       c.agent = parseBool(v, l);
     }},
    {"dry-run", 0, nullptr, "print each worker's command and environment; start nothing",
     [](LaunchConfig& c, const std::string& v, const std::string& l) {
       c.dryRun = parseBool(v, l);
     }},
    {"version", 0, nullptr, "print the version and exit", nullptr},
    {"help", 'h', nullptr, "print this help and exit", nullptr},
};

const OptionSpec* findLong(const std::string& name) {
  for (const auto& o : kOptions) {
    if (name == o.name || (o.alias && name == o.alias)) return &o;
  }
  return nullptr;
}

const OptionSpec* findShort(char c) {
  for (const auto& o : kOptions) {
    if (o.shortName == c) return &o;
  }
  return nullptr;
}

std::string unknownOption(const std::string& arg) {
  return fmt::format("unknown option {}; HINT: see launch --help (an option meant for the program "
                     "goes after the program name, or after --)",
                     excerpt(arg));
}

}  // namespace

std::string optionEnvName(const std::string& option) {
  std::string name = env::kLaunchOptionPrefix;
  for (char c : option) {
    name += c == '-' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  }
  return name;
}

std::vector<std::string> valueOptionNames() {
  std::vector<std::string> names;
  for (const auto& o : kOptions) {
    if (o.valueName) names.emplace_back(o.name);
  }
  return names;
}

// Note [Option parsing]
// ~~~~~~~~~~~~~~~~~~~~~
// The command line is read here, against kOptions, with plain string operations: `--name value`,
// `--name=value`, `-r value`, `-r3`, torchrun's underscores. A value is never matched by a
// regular expression. launch used cxxopts 3.1 for this, which matches every argument with
// std::regex ("--([[:alnum:]][-_[:alnum:]\.]+)(=(.*))?|..."); libstdc++'s regex executor
// recurses once per character of `.*`, so a value of some 25 KB overflowed the 8 MiB stack and
// launch died of SIGSEGV (exit 139, which also reads as "a worker died by SIGSEGV"). Values are
// bounded only by the kernel (128 KiB per argument), and messages quote at most
// kMaxQuotedChars of one (see quoteValue in launch_config.h).
SplitArgs splitLauncherArgs(const std::vector<std::string>& args) {
  SplitArgs out;
  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') break;  // the program ("-" alone counts as one)

    const OptionSpec* spec = nullptr;
    std::string value;
    bool hasValue = false;
    if (arg[1] == '-') {
      const size_t eq = arg.find('=');
      std::string name = arg.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
      if (eq != std::string::npos) {
        value = arg.substr(eq + 1);
        hasValue = true;
      }
      std::replace(name.begin(), name.end(), '_', '-');  // torchrun's spellings
      spec = findLong(name);
      DTRAIN_CHECK_ARG(spec, "{}", unknownOption("--" + name));
    } else {
      spec = findShort(arg[1]);
      DTRAIN_CHECK_ARG(spec, "{}", unknownOption(arg.substr(0, 2)));
      if (arg.size() > 2) {  // -r3
        DTRAIN_CHECK_ARG(spec->valueName, "{}: a flag takes no value; HINT: write -{} alone",
                         excerpt(arg), arg[1]);
        value = arg.substr(2);
        hasValue = true;
      }
    }
    const std::string name = spec->name;
    if (name == "help") {
      out.help = true;
      continue;
    }
    if (name == "version") {
      out.version = true;
      continue;
    }
    if (spec->valueName == nullptr) {
      DTRAIN_CHECK_ARG(!hasValue || value == "1" || value == "true" || value == "0" ||
                           value == "false",
                       "--{} is a flag; HINT: write --{} without a value", name, name);
      out.options.push_back({name, hasValue ? value : "true"});
      continue;
    }
    if (!hasValue) {
      DTRAIN_CHECK_ARG(i + 1 < args.size(), "--{} needs a value ({}); HINT: --{} {}", name,
                       spec->valueName, name, spec->valueName);
      value = args[++i];
    }
    out.options.push_back({name, std::move(value)});
  }
  out.program.assign(args.begin() + static_cast<std::ptrdiff_t>(std::min(i, args.size())),
                     args.end());
  return out;
}

namespace {

// The command line's options, in order (repeatable --env keeps every occurrence; for the others
// the last one wins). `seen` collects the options given.
void applyCommandLine(const SplitArgs& split, LaunchConfig& config,
                      std::vector<std::string>* seen) {
  for (const auto& option : split.options) {
    const OptionSpec* spec = findLong(option.name);
    if (!spec || !spec->apply) continue;
    spec->apply(config, option.value, "--" + option.name);
    config.appliedOptions.emplace_back(option.name, option.value);
    seen->push_back(option.name);
  }
}

// DTRAIN_LAUNCH_<OPTION> for the options not `seen` yet.
void applyOptionVariables(const std::map<std::string, std::string>& environment,
                          LaunchConfig& config, std::vector<std::string>* seen) {
  for (const auto& [key, value] : environment) {
    if (key.rfind(env::kLaunchOptionPrefix, 0) != 0) continue;
    const OptionSpec* spec = nullptr;
    for (const auto& o : kOptions) {
      if (o.apply && optionEnvName(o.name) == key) spec = &o;
    }
    DTRAIN_CHECK_ARG(spec,
                     "environment variable {} names no launch option; HINT: unset it, or "
                     "see launch --help for the options (DTRAIN_LAUNCH_<OPTION>)",
                     excerpt(key));
    if (std::find(seen->begin(), seen->end(), spec->name) != seen->end()) continue;
    config.optionSources[spec->name] = key;
    std::string label = key + " (environment)";
    if (std::string(spec->name) == "env") {
      // Several assignments: one per line.
      for (const std::string& line : splitAt(value, '\n')) {
        if (line.empty()) continue;
        spec->apply(config, line, label);
        config.appliedOptions.emplace_back(spec->name, line);
      }
    } else {
      spec->apply(config, value, label);
      config.appliedOptions.emplace_back(spec->name, value);
    }
    seen->push_back(spec->name);
  }
}

// What a scheduler's variables imply (Slurm, Kubernetes' PET_*), for the options not `seen`.
void applySchedulerVariables(const std::map<std::string, std::string>& environment,
                             LaunchConfig& config, std::vector<std::string>* seen) {
  for (const auto& s : schedulerSettings(environment)) {
    if (std::find(seen->begin(), seen->end(), s.option) != seen->end()) continue;
    const OptionSpec* spec = findLong(s.option);
    if (!spec || !spec->apply) continue;
    config.optionSources[spec->name] = s.source;
    spec->apply(config, s.value, s.source + " (environment)");
    config.appliedOptions.emplace_back(spec->name, s.value);
    seen->push_back(spec->name);
  }
}

}  // namespace

ParsedCommand parseLaunchArgs(const std::vector<std::string>& args,
                              const std::map<std::string, std::string>& environment) {
  ParsedCommand out;
  SplitArgs split = splitLauncherArgs(args);
  if (split.help) {
    out.action = ParsedCommand::Action::Help;
    return out;
  }
  if (split.version) {
    out.action = ParsedCommand::Action::Version;
    return out;
  }

  LaunchConfig& config = out.config;
  std::vector<std::string> seen;
  applyCommandLine(split, config, &seen);
  applyOptionVariables(environment, config, &seen);
  // A launch started by the master as an agent takes its options from the master only.
  if (!config.agent) applySchedulerVariables(environment, config, &seen);

  DTRAIN_CHECK_ARG(!split.program.empty(),
                   "no program given; HINT: launch [options] [--] PROGRAM [ARGS...], e.g. "
                   "launch --nproc-per-node 2 ./train");
  config.program = split.program[0];
  config.programArgs.assign(split.program.begin() + 1, split.program.end());
  DTRAIN_CHECK_ARG(!config.program.empty(), "the program name is empty; HINT: launch [options] "
                                            "[--] PROGRAM [ARGS...]");
  validate(config);
  return out;
}

void applyLaunchOption(LaunchConfig& config, const std::string& name, const std::string& value,
                       const std::string& label) {
  const OptionSpec* spec = findLong(name);
  DTRAIN_CHECK_ARG(spec && spec->apply, "{}: unknown option --{}", label, name);
  spec->apply(config, value, label);
  config.appliedOptions.emplace_back(spec->name, value);
}

std::string helpText() {
  // One line per option: names and value in a column, the help text beside it (below it when the
  // names are too wide), wrapped at kWidth.
  constexpr size_t kHelpColumn = 32;
  constexpr size_t kWidth = 100;
  std::string text = "Start, supervise and restart a distributed training job.\n"
                     "Usage:\n"
                     "  launch [options] [--] PROGRAM [ARGS...]\n\n";
  for (const auto& o : kOptions) {
    std::string names = o.shortName ? fmt::format("  -{}, --{}", o.shortName, o.name)
                                    : fmt::format("      --{}", o.name);
    if (o.valueName) names += fmt::format(" {}", o.valueName);
    text += names;
    size_t column = names.size();
    if (column + 2 > kHelpColumn) {
      text += "\n";
      column = 0;
    }
    text.append(kHelpColumn - column, ' ');
    column = kHelpColumn;
    std::string_view help = o.help;
    while (!help.empty()) {
      size_t room = kWidth - column;
      size_t cut = help.size() <= room ? help.size() : help.rfind(' ', room);
      if (cut == std::string_view::npos || cut == 0) cut = std::min(help.size(), room);
      text += help.substr(0, cut);
      help.remove_prefix(cut);
      while (!help.empty() && help.front() == ' ') help.remove_prefix(1);
      text += "\n";
      if (!help.empty()) text.append(kHelpColumn, ' ');
    }
  }
  text += R"(
A program ending in .py runs under --python, as torchrun does; anything else is executed.
torchrun's spellings work too: --nproc_per_node, --rdzv_endpoint, --rdzv_id, --rdzv_backend,
--master_addr, --master_port, --node_rank, --nnodes, --max_restarts, --no_python, ...
Every option can also come from the environment as DTRAIN_LAUNCH_<OPTION>
(e.g. DTRAIN_LAUNCH_NPROC_PER_NODE=4); the command line wins.

Multi-node: `launch --hostfile=FILE ...` (or --hosts=a,b) on the master starts every node over
ssh; or run `launch --nnodes=N --node-rank=R --rdzv-endpoint=HOST:PORT ...` on every node (node 0
hosts the store; the token from --token-file=FILE or DTRAIN_STORE_TOKEN). Inside Slurm
(SLURM_NNODES, SLURM_NODEID, SLURM_JOB_NODELIST) and Kubernetes' PyTorchJob (PET_*) those options
come from the scheduler's variables. `launch --check` with the same options checks every node.

Exit codes: 0 every worker exited 0; 1-123 the root-cause worker's exit code; 2 usage error
(nothing was started); 75 preempted (every worker checkpointed on SIGTERM); 124 a deadline
passed (rendezvous, heartbeat, the exit barrier, a stall under --stall-action=stop); 125
launcher or infrastructure error, or workers survived SIGKILL (--kill-timeout); 126/127 program not
executable/not found; 128+N the root-cause worker was killed by signal N, or launch itself
received signal N.
)";
  return text;
}

}  // namespace dtrain::launcher
