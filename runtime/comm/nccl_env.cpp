// validateNcclEnvironment(): NCCL reads its NCCL_* variables itself and treats many bad values
// as "unset" (a typo in NCCL_IB_DISABLE silently keeps InfiniBand on) or aborts deep inside
// ncclCommInitRank. Checking the ones that matter up front turns that into an error at init that
// names the variable (docs/reliability.md P7, PyTorch's test_invalid_nccl_blocking_wait_env).
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dtrain/base/error.h"
#include "dtrain/comm/nccl_communicator.h"
#include "parse_int.h"

namespace dtrain::comm {

namespace {

enum class Grammar { Bool, Int, Enum, EnumList, Interfaces, IntOrEnum };

struct Rule {
  const char* name;
  Grammar grammar;
  long long min = 0;
  long long max = 0;
  std::vector<const char*> words = {};  // case-insensitive unless exactCase
  bool exactCase = false;               // NCCL compares with strcmp (the path levels)
  const char* expects = nullptr;        // what the error says instead of "NCCL expects ..."
};

const std::vector<Rule>& rules() {
  // NCCL's path types up to SYS, as NCCL_P2P_LEVEL and NCCL_NET_GDR_LEVEL take them (exact case:
  // "pix" is not PIX to NCCL, which then keeps its default without a word).
  static const std::vector<const char*> kPathLevels = {"LOC", "NVL", "NVB", "C2C", "PIX",
                                                       "PXB", "P2C", "PXN", "PHB", "SYS"};
  static const std::vector<Rule> kRules = {
      {"NCCL_DEBUG", Grammar::Enum, 0, 0, {"VERSION", "WARN", "INFO", "TRACE", "ABORT"}},
      {"NCCL_IB_DISABLE", Grammar::Bool},
      {"NCCL_P2P_DISABLE", Grammar::Bool},
      {"NCCL_SHM_DISABLE", Grammar::Bool},
      {"NCCL_NVLS_ENABLE", Grammar::Int, 0, 2},  // 2: NCCL's default, NVLS where supported
      {"NCCL_CUMEM_ENABLE", Grammar::Bool},
      {"NCCL_COLLNET_ENABLE", Grammar::Bool},
      {"NCCL_CHECK_POINTERS", Grammar::Bool},
      {"NCCL_IGNORE_CPU_AFFINITY", Grammar::Bool},
      {"NCCL_NET_GDR_READ", Grammar::Bool},
      {"NCCL_CROSS_NIC", Grammar::Int, 0, 2},
      {"NCCL_BUFFSIZE", Grammar::Int, 1, 1LL << 40},
      {"NCCL_NTHREADS", Grammar::Int, 64, 1024},
      {"NCCL_MIN_NCHANNELS", Grammar::Int, 1, 1024},
      {"NCCL_MAX_NCHANNELS", Grammar::Int, 1, 1024},
      {"NCCL_MIN_CTAS", Grammar::Int, 1, 1024},
      {"NCCL_MAX_CTAS", Grammar::Int, 1, 1024},
      {"NCCL_SOCKET_NTHREADS", Grammar::Int, 1, 16},
      {"NCCL_NSOCKS_PERTHREAD", Grammar::Int, 1, 64},
      {"NCCL_IB_TIMEOUT", Grammar::Int, 1, 31},
      {"NCCL_IB_RETRY_CNT", Grammar::Int, 0, 7},
      {"NCCL_IB_GID_INDEX", Grammar::Int, -1, 255},
      {"NCCL_NET_GDR_LEVEL", Grammar::IntOrEnum, 0, 5, kPathLevels, true},
      {"NCCL_P2P_LEVEL", Grammar::IntOrEnum, 0, 5, kPathLevels, true},
      // NCCL reads it over any configuration: with 1 init has no deadline and an abort waits
      // for a caller inside NCCL (Note [Non-blocking communicators] in nccl/nccl_progress.h).
      {"NCCL_COMM_BLOCKING",
       Grammar::Enum,
       0,
       0,
       {"0"},
       true,
       "dtrain's NCCL communicators are non-blocking, so that init has a deadline and an abort "
       "never waits for a call inside NCCL: 0 or unset"},
      {"NCCL_LAUNCH_MODE", Grammar::Enum, 0, 0, {"PARALLEL", "GROUP"}},
      {"NCCL_SOCKET_FAMILY", Grammar::Enum, 0, 0, {"AF_INET", "AF_INET6"}},
      {"NCCL_PROTO", Grammar::EnumList, 0, 0, {"LL", "LL128", "SIMPLE"}},
      {"NCCL_ALGO",
       Grammar::EnumList,
       0,
       0,
       {"RING", "TREE", "COLLNET", "COLLNETDIRECT", "COLLNETCHAIN", "NVLS", "NVLSTREE", "PAT"}},
      {"NCCL_SOCKET_IFNAME", Grammar::Interfaces},
      {"NCCL_IB_HCA", Grammar::Interfaces},
      // PyTorch's (and their older NCCL_ spellings), which users carry over from Python jobs.
      {"TORCH_NCCL_BLOCKING_WAIT", Grammar::Bool},
      {"NCCL_BLOCKING_WAIT", Grammar::Bool},
      {"TORCH_NCCL_ASYNC_ERROR_HANDLING", Grammar::Int, 0, 3},
      {"NCCL_ASYNC_ERROR_HANDLING", Grammar::Int, 0, 3},
      {"TORCH_NCCL_DESYNC_DEBUG", Grammar::Bool},
      {"TORCH_NCCL_ENABLE_MONITORING", Grammar::Bool},
      {"TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", Grammar::Int, 1, 31536000},
  };
  return kRules;
}

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

bool isInt(const std::string& v, long long min, long long max) {
  int64_t x = 0;
  return parseInt64(v, &x) && x >= min && x <= max;
}

bool isWord(const std::string& v, const std::vector<const char*>& words, bool exactCase = false) {
  const std::string u = exactCase ? v : upper(v);
  return std::any_of(words.begin(), words.end(), [&](const char* w) { return u == w; });
}

// NCCL_ALGO / NCCL_PROTO: "Ring,Tree", "^LL128", and per-collective forms such as
// "allreduce:tree;broadcast:ring" (NCCL >= 2.24).
bool isWordList(const std::string& v, const std::vector<const char*>& words) {
  if (v.empty()) return false;
  std::string text = v;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find_first_of(",;", start);
    std::string token = text.substr(start,
                                    end == std::string::npos ? std::string::npos : end - start);
    size_t colon = token.find(':');
    if (colon != std::string::npos) token = token.substr(colon + 1);
    if (!token.empty() && token[0] == '^') token = token.substr(1);
    // A per-collective entry may itself list several, joined by ','; each is checked in turn.
    if (!token.empty() && !isWord(token, words)) return false;
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return true;
}

bool isInterfaceList(const std::string& v) {
  if (v.empty()) return false;
  return std::none_of(v.begin(), v.end(),
                      [](char c) { return std::isspace(static_cast<unsigned char>(c)); });
}

std::string accepted(const Rule& r) {
  switch (r.grammar) {
    case Grammar::Bool: return "0 or 1";
    case Grammar::Int: return fmt::format("an integer in [{}, {}]", r.min, r.max);
    case Grammar::Enum: return fmt::format("one of {}", fmt::join(r.words, ", "));
    case Grammar::EnumList:
      return fmt::format("a comma-separated list of {} (optionally starting with ^)",
                         fmt::join(r.words, ", "));
    case Grammar::Interfaces:
      return "a comma-separated list of interface names or prefixes without spaces "
             "(optionally starting with ^ or =)";
    case Grammar::IntOrEnum:
      return fmt::format("an integer in [{}, {}] or one of {}", r.min, r.max,
                         fmt::join(r.words, ", "));
  }
  return "";
}

bool valid(const Rule& r, const std::string& v) {
  switch (r.grammar) {
    case Grammar::Bool: return v == "0" || v == "1";
    case Grammar::Int: return isInt(v, r.min, r.max);
    case Grammar::Enum: return isWord(v, r.words, r.exactCase);
    case Grammar::EnumList: return isWordList(v, r.words);
    case Grammar::Interfaces: return isInterfaceList(v);
    case Grammar::IntOrEnum: return isInt(v, r.min, r.max) || isWord(v, r.words, r.exactCase);
  }
  return true;
}

}  // namespace

void validateNcclEnvironment(const std::function<const char*(const char*)>& env) {
  auto lookup = env ? env : [](const char* name) -> const char* { return std::getenv(name); };
  for (const Rule& r : rules()) {
    const char* value = lookup(r.name);
    if (value == nullptr) continue;
    const std::string expected = r.expects != nullptr ? r.expects
                                                      : fmt::format("NCCL expects {}", accepted(r));
    DTRAIN_CHECK_ARG(valid(r, value),
                     "{}=\"{}\" is not a valid value: {}. HINT: fix or unset {} "
                     "(launch forwards NCCL_* variables to every node)",
                     r.name, value, expected, r.name);
  }
}

}  // namespace dtrain::comm
