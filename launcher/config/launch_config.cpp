#include "launcher/config/launch_config.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "dtrain/base/error.h"
#include "env_contract.h"
#include "parse_int.h"

namespace dtrain::launcher {

namespace {

bool validIdentifier(const std::string& name) {
  if (name.empty() || std::isdigit(static_cast<unsigned char>(name[0]))) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
}

constexpr const char* kPlaceholders[] = {"${rank}", "${local_rank}", "${role_name}", "${attempt}",
                                         "${node_rank}"};

}  // namespace

int StreamSpec::streamsFor(int localRank) const {
  auto it = perRank.find(localRank);
  return it == perRank.end() ? all : it->second;
}

bool StreamSpec::any() const {
  if (all != 0) return true;
  return std::any_of(perRank.begin(), perRank.end(), [](const auto& kv) { return kv.second != 0; });
}

namespace {

// At most kMaxQuotedChars of `text`, with control characters, quotes and backslashes escaped.
std::string escapedHead(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size() && i < kMaxQuotedChars; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c >= 0x20 && c != 0x7f) {
      out += static_cast<char>(c);
    } else {
      out += fmt::format("\\x{:02x}", c);
    }
  }
  return out;
}

std::string cutNote(const std::string& text) {
  return text.size() > kMaxQuotedChars ? fmt::format(" ({} characters)", text.size()) : "";
}

}  // namespace

std::string excerpt(const std::string& text) {
  return escapedHead(text) + (text.size() > kMaxQuotedChars ? "..." : "") + cutNote(text);
}

std::string quoteValue(const std::string& text) {
  return "\"" + escapedHead(text) + (text.size() > kMaxQuotedChars ? "...\"" : "\"") +
         cutNote(text);
}

std::string optionLabel(const LaunchConfig& config, const std::string& option) {
  auto it = config.optionSources.find(option);
  if (it != config.optionSources.end()) return it->second + " (environment)";
  return "--" + option;
}

int parseIntValue(const std::string& text, const std::string& label, int64_t min, int64_t max) {
  int64_t v = 0;
  DTRAIN_CHECK_ARG(parseInt64(text, &v), "{} {} is not an integer; HINT: give a number in {}..{}",
                   label, quoteValue(text), min, max);
  DTRAIN_CHECK_ARG(v >= min && v <= max, "{} {} is out of range; HINT: give a number in {}..{}",
                   label, v, min, max);
  return static_cast<int>(v);
}

namespace {

// A finite number of seconds in 0..kMaxTimeoutSeconds; `hint` shows the accepted forms.
double parseNonNegativeSeconds(const std::string& text, const std::string& label,
                               const char* hint) {
  char* end = nullptr;
  errno = 0;
  double v = text.empty() ? 0 : std::strtod(text.c_str(), &end);
  DTRAIN_CHECK_ARG(!text.empty() && errno == 0 && end == text.c_str() + text.size() &&
                       std::isfinite(v),
                   "{} {} is not a number of seconds; HINT: {}", label, quoteValue(text), hint);
  DTRAIN_CHECK_ARG(v >= 0 && v <= kMaxTimeoutSeconds, "{} {} is out of range; HINT: {}", label,
                   quoteValue(text), hint);
  return v;
}

}  // namespace

double parseSeconds(const std::string& text, const std::string& label) {
  constexpr const char* kHint = "e.g. 30 or 0.5";
  double v = parseNonNegativeSeconds(text, label, kHint);
  DTRAIN_CHECK_ARG(v > 0, "{} {} must be greater than zero; HINT: {}", label, quoteValue(text),
                   kHint);
  return v;
}

double parseTimeoutSeconds(const std::string& text, const std::string& label) {
  return parseNonNegativeSeconds(text, label, "e.g. 300 or 0.5, or 0 for no limit");
}

int64_t parseByteCount(const std::string& text, const std::string& label) {
  std::string digits = text;
  int64_t scale = 1;
  if (!digits.empty()) {
    switch (std::toupper(static_cast<unsigned char>(digits.back()))) {
      case 'K': scale = int64_t{1} << 10; break;
      case 'M': scale = int64_t{1} << 20; break;
      case 'G': scale = int64_t{1} << 30; break;
      default: break;
    }
    if (scale != 1) digits.pop_back();
  }
  int64_t v = 0;
  DTRAIN_CHECK_ARG(parseInt64(digits, &v) && v >= 0 && v <= (int64_t{1} << 50) / scale,
                   "{} {} is not a byte count; HINT: e.g. 0 (unlimited), 65536, 64k, 1G", label,
                   quoteValue(text));
  return v * scale;
}

bool parseBool(const std::string& text, const std::string& label) {
  std::string t = text;
  for (auto& c : t) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (t == "1" || t == "true" || t == "yes" || t == "on") return true;
  if (t == "0" || t == "false" || t == "no" || t == "off" || t.empty()) return false;
  DTRAIN_THROW(InvalidArgument, "{} {} is not a boolean; HINT: use 1/0, true/false", label,
               quoteValue(text));
}

NprocSpec parseNproc(const std::string& text, const std::string& label) {
  NprocSpec spec;
  if (text == "auto") {
    spec.kind = NprocSpec::Kind::Auto;
  } else if (text == "gpu") {
    spec.kind = NprocSpec::Kind::Gpu;
  } else if (text == "cpu") {
    spec.kind = NprocSpec::Kind::Cpu;
  } else {
    int64_t v = 0;
    DTRAIN_CHECK_ARG(parseInt64(text, &v) && v >= 1 && v <= kMaxWorkersPerNode,
                     "{} {} is not a worker count; HINT: give 1..{}, or auto, gpu, cpu", label,
                     quoteValue(text), kMaxWorkersPerNode);
    spec.count = static_cast<int>(v);
  }
  return spec;
}

StreamSpec parseStreamSpec(const std::string& text, const std::string& label) {
  constexpr const char* kForms = "0 (none), 1 (stdout), 2 (stderr), 3 (both), or per local rank "
                                 "as 0:3,1:2";
  StreamSpec spec;
  int64_t v = 0;
  if (text.find(':') == std::string::npos) {
    DTRAIN_CHECK_ARG(parseInt64(text, &v) && v >= 0 && v <= 3, "{} {} is not valid; HINT: use {}",
                     label, quoteValue(text), kForms);
    spec.all = static_cast<int>(v);
    return spec;
  }
  for (const auto& part : splitAt(text, ',')) {
    size_t colon = part.find(':');
    int64_t rank = 0;
    DTRAIN_CHECK_ARG(
        colon != std::string::npos && parseInt64(part.substr(0, colon), &rank) && rank >= 0 &&
            rank < kMaxWorkersPerNode && parseInt64(part.substr(colon + 1), &v) && v >= 0 && v <= 3,
        "{} {}: bad entry {}; HINT: use {}", label, quoteValue(text), quoteValue(part), kForms);
    DTRAIN_CHECK_ARG(spec.perRank.emplace(static_cast<int>(rank), static_cast<int>(v)).second,
                     "{} {}: local rank {} is listed twice", label, quoteValue(text), rank);
  }
  return spec;
}

std::pair<int, int> parseNnodes(const std::string& text, const std::string& label) {
  size_t colon = text.find(':');
  int64_t lo = 0;
  int64_t hi = 0;
  bool ok = colon == std::string::npos
                ? parseInt64(text, &lo) && (hi = lo, true)
                : parseInt64(text.substr(0, colon), &lo) && parseInt64(text.substr(colon + 1), &hi);
  DTRAIN_CHECK_ARG(ok, "{} {} is not a node count; HINT: N or MIN:MAX, e.g. 2 or 1:4", label,
                   quoteValue(text));
  DTRAIN_CHECK_ARG(lo >= 1 && hi >= 1 && lo <= 65536 && hi <= 65536,
                   "{} {}: node counts must be 1..65536", label, quoteValue(text));
  DTRAIN_CHECK_ARG(lo <= hi, "{} {}: the minimum {} is greater than the maximum {}", label,
                   quoteValue(text), lo, hi);
  return {static_cast<int>(lo), static_cast<int>(hi)};
}

std::pair<std::string, int> parseEndpoint(const std::string& text, const std::string& label) {
  std::string host = text;
  std::string port;
  if (!text.empty() && text[0] == '[') {  // [::1]:29400
    size_t close = text.find(']');
    DTRAIN_CHECK_ARG(close != std::string::npos, "{} {}: unclosed '['", label, quoteValue(text));
    host = text.substr(1, close - 1);
    if (close + 1 < text.size()) {
      DTRAIN_CHECK_ARG(text[close + 1] == ':', "{} {}: expected ':' after ']'", label,
                       quoteValue(text));
      port = text.substr(close + 2);
    }
  } else if (size_t colon = text.rfind(':'); colon != std::string::npos) {
    DTRAIN_CHECK_ARG(text.find(':') == colon,
                     "{} {}: an IPv6 address needs brackets; HINT: [::1]:29400", label,
                     quoteValue(text));
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
  }
  DTRAIN_CHECK_ARG(!host.empty(), "{} {} has no host; HINT: HOST:PORT, e.g. 10.0.0.1:29400", label,
                   quoteValue(text));
  int p = 0;
  if (!port.empty()) p = parseIntValue(port, label + " port", 1, 65535);
  return {host, p};
}

std::vector<int> parseRankList(const std::string& text, const std::string& label) {
  std::vector<int> ranks;
  for (const auto& part : splitAt(text, ',')) {
    int64_t v = 0;
    DTRAIN_CHECK_ARG(parseInt64(part, &v) && v >= 0 && v < kMaxWorkersPerNode,
                     "{} {}: {} is not a local rank; HINT: e.g. 0,3", label, quoteValue(text),
                     quoteValue(part));
    if (std::find(ranks.begin(), ranks.end(), v) == ranks.end()) {
      ranks.push_back(static_cast<int>(v));
    }
  }
  return ranks;
}

std::pair<std::string, std::string> parseEnvAssignment(const std::string& text,
                                                       const std::string& label) {
  size_t eq = text.find('=');
  std::string key = text.substr(0, eq);
  DTRAIN_CHECK_ARG(eq != std::string::npos && validIdentifier(key),
                   "{} {} is not KEY=VALUE with KEY a variable name; HINT: --env "
                   "NCCL_DEBUG=INFO",
                   label, quoteValue(text));
  DTRAIN_CHECK_ARG(!isReservedWorkerVariable(key),
                   "{} {}: {} is set by launch for every worker and cannot be overridden; HINT: "
                   "use the matching launch option",
                   label, quoteValue(text), key);
  return {key, text.substr(eq + 1)};
}

bool isReservedWorkerVariable(const std::string& name) {
  static const char* const kReserved[] = {
      env::kRank,        env::kLocalRank,      env::kWorldSize,     env::kLocalWorldSize,
      env::kGroupRank,   env::kGroupWorldSize, env::kRoleRank,      env::kRoleWorldSize,
      env::kRoleName,    env::kMasterAddr,     env::kMasterPort,    env::kRestartCount,
      env::kMaxRestarts, env::kRunId,          env::kUseAgentStore, env::kErrorFile,
      env::kStoreAddr,   env::kStorePort,      env::kStoreToken,    env::kDtrainRestartCount,
      env::kDtrainRunId, env::kOnNodeLoss,     env::kNodeLossWait,  env::kJoinEpoch,
  };
  for (const char* r : kReserved) {
    if (name == r) return true;
  }
  return name.rfind(env::kLaunchOptionPrefix, 0) == 0;
}

size_t parseChoice(const std::string& text, const std::string& label,
                   const std::vector<std::pair<const char*, const char*>>& choices) {
  std::string offered;
  for (size_t i = 0; i < choices.size(); ++i) {
    if (text == choices[i].first) return i;
    offered += fmt::format("{}{} ({})",
                           i == 0                    ? ""
                           : i + 1 == choices.size() ? " or "
                                                     : ", ",
                           choices[i].first, choices[i].second);
  }
  DTRAIN_THROW(InvalidArgument, "{} {}: use {}", label, quoteValue(text), offered);
}

OnNodeLoss parseOnNodeLoss(const std::string& text, const std::string& label) {
  return parseChoice(text, label,
                     {{"restart", "stop every node and restart from the checkpoint, the default"},
                      {"continue", "the surviving nodes go on without the lost one"}}) == 0
             ? OnNodeLoss::Restart
             : OnNodeLoss::Continue;
}

const char* onNodeLossName(OnNodeLoss mode) {
  return mode == OnNodeLoss::Continue ? "continue" : "restart";
}

OnNodeJoin parseOnNodeJoin(const std::string& text, const std::string& label) {
  return parseChoice(
             text, label,
             {{"restart", "stop every node and restart with the new one from the checkpoint, the "
                          "default"},
              {"live", "take it into the running round"}}) == 0
             ? OnNodeJoin::Restart
             : OnNodeJoin::Live;
}

int resolveNproc(const NprocSpec& spec, int cpus, int gpus) {
  cpus = std::max(cpus, 1);
  switch (spec.kind) {
    case NprocSpec::Kind::Count: return spec.count;
    case NprocSpec::Kind::Cpu: return cpus;
    case NprocSpec::Kind::Auto: return gpus > 0 ? gpus : cpus;
    case NprocSpec::Kind::Gpu:
      DTRAIN_CHECK_ARG(gpus > 0, "--nproc-per-node gpu: no GPU is visible on this machine; HINT: "
                                 "give a count, or auto to fall back to the CPUs");
      return gpus;
  }
  return spec.count;
}

bool isMultiNode(const LaunchConfig& config) {
  return config.maxNodes > 1 || !config.hostfile.empty() || !config.hosts.empty();
}

std::string expandLinePrefix(const std::string& templ, int rank, int localRank,
                             const std::string& role, int attempt, int nodeRank) {
  std::string out;
  out.reserve(templ.size() + 8);
  for (size_t i = 0; i < templ.size();) {
    auto at = [&](const char* p) {
      return templ.compare(i, std::char_traits<char>::length(p), p) == 0;
    };
    if (at("${rank}")) {
      out += std::to_string(rank);
      i += 7;
    } else if (at("${local_rank}")) {
      out += std::to_string(localRank);
      i += 13;
    } else if (at("${role_name}")) {
      out += role;
      i += 12;
    } else if (at("${attempt}")) {
      out += std::to_string(attempt);
      i += 10;
    } else if (at("${node_rank}")) {
      out += std::to_string(nodeRank);
      i += 12;
    } else {
      out += templ[i++];
    }
  }
  return out;
}

namespace {

// The program, the worker count and the nodes: one node, a host list, or a manual multi-node job.
void validateShape(const LaunchConfig& c) {
  auto label = [&](const char* option) { return optionLabel(c, option); };
  DTRAIN_CHECK_ARG(!c.program.empty(),
                   "no program given; HINT: launch [options] [--] PROGRAM [ARGS...]");
  DTRAIN_CHECK_ARG(c.nprocPerNode.kind != NprocSpec::Kind::Count ||
                       (c.nprocPerNode.count >= 1 && c.nprocPerNode.count <= kMaxWorkersPerNode),
                   "{} {} is out of range; HINT: give 1..{}, or auto", label("nproc-per-node"),
                   c.nprocPerNode.count, kMaxWorkersPerNode);
  DTRAIN_CHECK_ARG(c.minNodes >= 1 && c.minNodes <= c.maxNodes,
                   "{} {}:{}: the minimum must be 1..maximum", label("nnodes"), c.minNodes,
                   c.maxNodes);
  const bool fanOut = !c.hostfile.empty() || !c.hosts.empty();
  DTRAIN_CHECK_ARG(c.hostfile.empty() || c.hosts.empty(),
                   "{} and {} both give the host list; HINT: use one of them", label("hostfile"),
                   label("hosts"));
  DTRAIN_CHECK_ARG(c.include.empty() || c.exclude.empty(),
                   "{} and {} exclude each other (as in DeepSpeed); HINT: list what to run with "
                   "{} alone",
                   label("include"), label("exclude"), label("include"));
  DTRAIN_CHECK_ARG(fanOut || (c.include.empty() && c.exclude.empty()),
                   "{} / {} filter a host list; HINT: give --hostfile or --hosts too",
                   label("include"), label("exclude"));
  if (c.maxNodes == 1 && !fanOut) {
    DTRAIN_CHECK_ARG(c.nodeRank <= 0,
                     "{} {}: a one-node job has only node rank 0; HINT: drop {}, or give "
                     "--nnodes N for a multi-node job",
                     label("node-rank"), c.nodeRank, label("node-rank"));
  } else if (fanOut) {
    DTRAIN_CHECK_ARG(c.nodeRank < 0 || c.agent,
                     "{}: with a host list the node ranks follow the list; HINT: drop {}",
                     label("node-rank"), label("node-rank"));
  } else if (!c.agent && !c.check) {
    DTRAIN_CHECK_ARG(c.nodeRank >= 0,
                     "{} {}: a multi-node job needs this node's rank; HINT: --node-rank R on "
                     "every node (0 hosts the store), or --hostfile / --hosts to start every node "
                     "from here",
                     label("nnodes"), c.maxNodes);
    DTRAIN_CHECK_ARG(c.nodeRank < c.maxNodes, "{} {} is not below {} {}", label("node-rank"),
                     c.nodeRank, label("nnodes"), c.maxNodes);
    DTRAIN_CHECK_ARG(!c.rdzvHost.empty(),
                     "{} {}: the nodes must meet at an address; HINT: --rdzv-endpoint "
                     "HOST:PORT, the address of node rank 0 (port {} by default)",
                     label("nnodes"), c.maxNodes, kDefaultMultiNodeStorePort);
  }
}

// Timeouts, ports, restarts and the monitor's options.
void validateSupervision(const LaunchConfig& c) {
  auto label = [&](const char* option) { return optionLabel(c, option); };
  for (const auto& [opt, v] : {std::make_pair("rdzv-timeout", c.rdzvTimeout),
                               std::make_pair("heartbeat-interval", c.heartbeatInterval),
                               std::make_pair("heartbeat-timeout", c.heartbeatTimeout)}) {
    DTRAIN_CHECK_ARG(v > 0 && v <= kMaxTimeoutSeconds, "{} {} must be greater than zero seconds",
                     label(opt), v);
  }
  DTRAIN_CHECK_ARG(c.heartbeatTimeout > c.heartbeatInterval,
                   "{} {:g} must be longer than {} {:g}: a node would be declared dead between "
                   "two heartbeats; HINT: a timeout of 3-6 intervals",
                   label("heartbeat-timeout"), c.heartbeatTimeout, label("heartbeat-interval"),
                   c.heartbeatInterval);
  DTRAIN_CHECK_ARG(c.rdzvBackend == "c10d" || c.rdzvBackend == "static",
                   "{} {} is not supported; HINT: launch hosts its own store: use c10d (the "
                   "default) or static",
                   label("rdzv-backend"), quoteValue(c.rdzvBackend));
  DTRAIN_CHECK_ARG(c.rdzvPort >= 0 && c.rdzvPort <= 65535, "{} port {} is out of range 1..65535",
                   label("rdzv-endpoint"), c.rdzvPort);
  DTRAIN_CHECK_ARG(c.masterPort >= 0 && c.masterPort <= 65535, "{} {} is out of range 1..65535",
                   label("master-port"), c.masterPort);
  DTRAIN_CHECK_ARG(c.rdzvPort == 0 || c.masterPort == 0 || c.rdzvPort != c.masterPort ||
                       (!c.rdzvHost.empty() && !c.masterAddr.empty() && c.rdzvHost != c.masterAddr),
                   "{} and {} both use port {}: the store and rank 0 cannot share a port; HINT: "
                   "pick another port for one of them",
                   label("rdzv-endpoint"), label("master-port"), c.masterPort);
  DTRAIN_CHECK_ARG(c.maxRestarts >= 0, "{} {} must be 0 or more", label("max-restarts"),
                   c.maxRestarts);
  DTRAIN_CHECK_ARG(c.onNodeJoin != OnNodeJoin::Live || c.onNodeLoss == OnNodeLoss::Continue,
                   "{} live needs {} continue: a node taken into the running round joins its "
                   "membership epochs, which only that mode has",
                   label("on-node-join"), label("on-node-loss"));
  DTRAIN_CHECK_ARG(c.maxReforms >= 0, "{} {} must be 0 or more", label("max-reforms"),
                   c.maxReforms);
  DTRAIN_CHECK_ARG(c.reformWindow > 0 && c.reformWindow <= kMaxTimeoutSeconds,
                   "{} {} must be greater than zero seconds (and at most {:g})",
                   label("reform-window"), c.reformWindow, kMaxTimeoutSeconds);
  DTRAIN_CHECK_ARG(c.gracePeriod > 0 && c.gracePeriod <= kMaxTimeoutSeconds,
                   "{} {} must be greater than zero seconds (and at most {:g})",
                   label("grace-period"), c.gracePeriod, kMaxTimeoutSeconds);
  DTRAIN_CHECK_ARG(c.exitBarrierTimeout >= 0 && c.exitBarrierTimeout <= kMaxTimeoutSeconds,
                   "{} {} must be 0 (no limit) or a number of seconds up to {:g}",
                   label("exit-barrier-timeout"), c.exitBarrierTimeout, kMaxTimeoutSeconds);
  DTRAIN_CHECK_ARG(c.killTimeout > 0 && c.killTimeout <= kMaxTimeoutSeconds,
                   "{} {} must be greater than zero seconds (and at most {:g})",
                   label("kill-timeout"), c.killTimeout, kMaxTimeoutSeconds);
  DTRAIN_CHECK_ARG(c.monitorInterval > 0, "{} {} must be greater than zero seconds",
                   label("monitor-interval"), c.monitorInterval);
  validateMonitorOptions(c.monitor, [&](const std::string& o) { return optionLabel(c, o); });
}

// How the program runs and where its output goes: interpreter, role, logs, run id, prefix, --env.
void validateProgramAndOutput(const LaunchConfig& c) {
  auto label = [&](const char* option) { return optionLabel(c, option); };
  DTRAIN_CHECK_ARG(!(c.noPython && c.module),
                   "--no-python and --module contradict each other; HINT: drop one of them");
  DTRAIN_CHECK_ARG(!c.python.empty(), "{} is empty; HINT: e.g. --python /usr/bin/python3",
                   label("python"));
  DTRAIN_CHECK_ARG(!c.role.empty(), "{} is empty", label("role"));
  DTRAIN_CHECK_ARG(c.logMaxBytes == 0 || c.logMaxBytes >= kMinLogMaxBytes,
                   "{} {} is too small; HINT: 0 (unlimited) or at least {} bytes",
                   label("log-max-bytes"), c.logMaxBytes, kMinLogMaxBytes);

  // The run id names directories: keep it to a safe alphabet.
  DTRAIN_CHECK_ARG(c.runId.size() <= 128 &&
                       std::all_of(c.runId.begin(), c.runId.end(),
                                   [](char ch) {
                                     return std::isalnum(static_cast<unsigned char>(ch)) ||
                                            ch == '-' || ch == '_' || ch == '.';
                                   }) &&
                       c.runId != "." && c.runId != "..",
                   "{} {} may use only letters, digits, '-', '_' and '.' (at most 128)",
                   label("run-id"), quoteValue(c.runId));

  for (const auto* spec : {&c.redirects, &c.tee}) {
    DTRAIN_CHECK_ARG(spec->all >= 0 && spec->all <= 3, "{} {} must be 0..3",
                     label(spec == &c.redirects ? "redirects" : "tee"), spec->all);
  }

  // Every ${...} in the prefix template must be one we know, so a typo shows up now.
  for (size_t at = c.linePrefixTemplate.find("${"); at != std::string::npos;
       at = c.linePrefixTemplate.find("${", at + 2)) {
    bool known = std::any_of(
        std::begin(kPlaceholders), std::end(kPlaceholders), [&](const char* p) {
          return c.linePrefixTemplate.compare(at, std::char_traits<char>::length(p), p) == 0;
        });
    DTRAIN_CHECK_ARG(known,
                     "{} {} has an unknown placeholder at offset {}; HINT: use ${{rank}}, "
                     "${{local_rank}}, ${{role_name}}, ${{attempt}}",
                     label("log-line-prefix-template"), quoteValue(c.linePrefixTemplate), at);
  }

  for (const auto& kv : c.env) {
    DTRAIN_CHECK_ARG(validIdentifier(kv.first) && !isReservedWorkerVariable(kv.first),
                     "{} {}=...: not a variable launch lets you set; HINT: KEY must be a name "
                     "and not one of the worker variables launch sets",
                     label("env"), excerpt(kv.first));
  }
}

}  // namespace

void validate(const LaunchConfig& c) {
  validateShape(c);
  validateSupervision(c);
  validateProgramAndOutput(c);
}

}  // namespace dtrain::launcher
