#include "launcher/cluster/remote/remote_command.h"

#include <fmt/format.h>

#include "dtrain/base/error.h"
#include "parse_int.h"

namespace dtrain::launcher::remote {

namespace {

constexpr const char* kPlanMagic = "dtrain-agent-plan 1\n";
constexpr size_t kMaxRecordBytes = 64 << 20;
constexpr size_t kMaxRecords = 100000;

std::string seconds(double s) {
  return fmt::format("{}", std::max(1, static_cast<int>(s + 0.999)));
}

}  // namespace

std::string remoteScript(const std::string& cwd, const std::vector<std::string>& argv) {
  std::string out;
  if (!cwd.empty()) {
    const std::string q = singleQuote(cwd);
    out = "cd " + q + " 2>/dev/null || { echo launch: no directory " + q +
          " on this node, HINT: --remote-cwd DIR >&2; exit 125; }; ";
  }
  out += "exec";
  for (const auto& a : argv) out += " " + singleQuote(a);
  return out;
}

std::string remoteShellCommand(const std::string& cwd, const std::vector<std::string>& argv) {
  // See Note [Remote command lines]: what every login shell reads alike inside single quotes.
  const std::string script = remoteScript(cwd, argv);
  if (script.find_first_of("\\\n!") == std::string::npos)
    return "exec sh -c " + singleQuote(script);
  return "exec sh -c 'c=\"$(echo " + base64(script) + " | base64 -d)\" && eval \"$c\"'";
}

std::string base64(const std::string& bytes) {
  static const char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const uint32_t v = static_cast<uint32_t>(static_cast<uint8_t>(bytes[i])) << 16 |
                       static_cast<uint32_t>(static_cast<uint8_t>(bytes[i + 1])) << 8 |
                       static_cast<uint8_t>(bytes[i + 2]);
    for (int shift : {18, 12, 6, 0}) out += kAlphabet[(v >> shift) & 63];
  }
  if (i < bytes.size()) {
    uint32_t v = static_cast<uint32_t>(static_cast<uint8_t>(bytes[i])) << 16;
    if (i + 1 < bytes.size()) v |= static_cast<uint32_t>(static_cast<uint8_t>(bytes[i + 1])) << 8;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += i + 1 < bytes.size() ? kAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

std::vector<std::string> sshArgv(const SshOptions& o, const std::string& host,
                                 const std::string& command) {
  std::vector<std::string> argv{o.program, "-T"};
  for (const auto& opt : o.options) {
    argv.push_back("-o");
    argv.push_back(opt);
  }
  argv.insert(argv.end(),
              {"-o", "BatchMode=yes", "-o", "ConnectTimeout=" + seconds(o.connectTimeout)});
  if (o.acceptNewHostKeys) argv.insert(argv.end(), {"-o", "StrictHostKeyChecking=accept-new"});
  if (o.port > 0) argv.insert(argv.end(), {"-p", std::to_string(o.port)});
  if (!o.identity.empty()) argv.insert(argv.end(), {"-i", o.identity});
  if (!o.configFile.empty()) argv.insert(argv.end(), {"-F", o.configFile});
  argv.insert(argv.end(), {"--", host, command});
  return argv;
}

std::string sshFailureHint(const std::string& host, const std::string& err,
                           const SshOptions& options) {
  auto has = [&](const char* s) { return err.find(s) != std::string::npos; };
  if (has("Host key verification failed") || has("No ED25519 host key is known") ||
      has("No RSA host key is known") || has("REMOTE HOST IDENTIFICATION HAS CHANGED")) {
    if (has("REMOTE HOST IDENTIFICATION HAS CHANGED")) {
      return fmt::format("HINT: the host key of {} changed since it was recorded; if the machine "
                         "was reinstalled, remove the old key (ssh-keygen -R {}) and add the new "
                         "one",
                         host, host);
    }
    return fmt::format("HINT: {}'s host key is not known here and launch never asks; add it "
                       "(ssh-keyscan -H {} >> ~/.ssh/known_hosts, after checking its "
                       "fingerprint), or pass --ssh-accept-new-host-keys{}",
                       host, host,
                       options.acceptNewHostKeys ? " (given: check the known_hosts file named "
                                                   "by --ssh-config / -o UserKnownHostsFile)"
                                                 : "");
  }
  if (has("Permission denied")) {
    return fmt::format("HINT: ssh to {} needs a key that works without a prompt (BatchMode): "
                       "ssh-copy-id {}, or --ssh-identity FILE",
                       host, host);
  }
  if (has("Connection timed out") || has("Connection refused") || has("No route to host") ||
      has("Could not resolve hostname") || has("Network is unreachable")) {
    return fmt::format("HINT: check that {} is up, its sshd listens{}, and no firewall drops "
                       "port {}",
                       host, options.port > 0 ? " on --ssh-port" : "",
                       options.port > 0 ? options.port : 22);
  }
  return "";
}

std::string encodePlan(const Records& records) {
  std::string out = kPlanMagic;
  for (const auto& [name, value] : records) {
    out += name + " " + std::to_string(value.size()) + "\n";
    out += value;
    out += "\n";
  }
  out += "end 0\n\n";
  return out;
}

Records decodePlan(const std::string& text) {
  const std::string magic = kPlanMagic;
  DTRAIN_CHECK_ARG(text.compare(0, magic.size(), magic) == 0,
                   "agent plan: does not start with \"{}\"; HINT: launch --agent reads its plan "
                   "from the master's launch of the same version",
                   magic.substr(0, magic.size() - 1));
  Records out;
  size_t at = magic.size();
  while (true) {
    size_t nl = text.find('\n', at);
    DTRAIN_CHECK_ARG(nl != std::string::npos && nl - at < 256,
                     "agent plan: record header at byte {} is cut short", at);
    std::string header = text.substr(at, nl - at);
    size_t sp = header.find(' ');
    int64_t len = 0;
    DTRAIN_CHECK_ARG(sp != std::string::npos && sp > 0 && parseInt64(header.substr(sp + 1), &len) &&
                         len >= 0 && static_cast<size_t>(len) <= kMaxRecordBytes,
                     "agent plan: bad record header \"{}\" at byte {}", header, at);
    std::string name = header.substr(0, sp);
    at = nl + 1;
    if (name == "end") break;
    DTRAIN_CHECK_ARG(text.size() >= at + static_cast<size_t>(len) + 1 &&
                         text[at + static_cast<size_t>(len)] == '\n',
                     "agent plan: record \"{}\" is cut short ({} bytes announced)", name, len);
    DTRAIN_CHECK_ARG(out.size() < kMaxRecords, "agent plan: more than {} records", kMaxRecords);
    out.emplace_back(name, text.substr(at, static_cast<size_t>(len)));
    at += static_cast<size_t>(len) + 1;
  }
  return out;
}

size_t planEnd(const std::string& text) {
  // Walk the records: the end marker's "\n\n" could also occur inside a value.
  const std::string magic = kPlanMagic;
  if (text.size() < magic.size()) return std::string::npos;
  size_t at = magic.size();
  while (true) {
    size_t nl = text.find('\n', at);
    if (nl == std::string::npos) return std::string::npos;
    std::string header = text.substr(at, nl - at);
    size_t sp = header.find(' ');
    int64_t len = 0;
    if (sp == std::string::npos || !parseInt64(header.substr(sp + 1), &len) || len < 0 ||
        static_cast<size_t>(len) > kMaxRecordBytes) {
      return nl + 1;  // malformed: let decodePlan say so
    }
    at = nl + 1;
    if (header.substr(0, sp) == "end") return text.size() > at ? at + 1 : std::string::npos;
    at += static_cast<size_t>(len) + 1;
    if (at > text.size()) return std::string::npos;
  }
}

}  // namespace dtrain::launcher::remote
