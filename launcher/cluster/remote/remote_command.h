#pragma once
// The command lines launch runs on other nodes, as pure functions: POSIX single quoting of every
// remote word, the `ssh` argv (always the system ssh, never a shell of our own), and the agent
// plan that travels on ssh's stdin -- the token and the forwarded environment never appear in a
// command line (visible in the remote /proc/*/cmdline, and one argument is capped at 128 KiB).
// See Note [Remote command lines].

#include <string>
#include <utility>
#include <vector>

namespace dtrain::launcher::remote {

// Note [Remote command lines]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// ssh joins its command words with spaces and hands the result to the remote login shell, so
// every word is wrapped in single quotes, with each ' written as '\'' : inside single quotes a
// POSIX shell (sh, dash, bash, zsh) takes every byte literally -- spaces, ", $(id), backticks,
// ;, &&, *, ~, newlines, non-ASCII bytes -- and the empty string stays a word. The words are the
// working directory, the launch binary, `--agent` and the program's argv; nothing else. The
// rest of the plan (options, the job token, the forwarded environment) is written to ssh's
// stdin as length-prefixed records (encodePlan), which need no quoting at all and which no
// `ps` shows. ssh's SendEnv is not used: Debian's sshd accepts only LANG and LC_*.

// 'word' with every ' as '\'' -- always quoted, also when it would not need it.
std::string singleQuote(const std::string& word);

// `cd 'DIR' && exec 'WORD' 'WORD'...` (no cd when `cwd` is empty). A directory missing on the
// remote node ends the command with exit 125 and a line naming it.
std::string remoteShellCommand(const std::string& cwd, const std::vector<std::string>& argv);

// How to reach the other nodes.
struct SshOptions {
  std::string program = "ssh";
  int port = 0;                   // 0: ssh's default (or the config's)
  std::string identity;           // -i
  std::string configFile;         // -F
  std::vector<std::string> options;  // -o passthrough, in order, before launch's own
  double connectTimeout = 10;     // seconds: -o ConnectTimeout
  bool acceptNewHostKeys = false; // -o StrictHostKeyChecking=accept-new
};

// The argv of `ssh ... HOST COMMAND`: -T, the user's -o options first (ssh takes the first value
// it sees, so they win), then BatchMode=yes (never a password prompt) and ConnectTimeout,
// accept-new host keys only when asked, -p / -i / -F, `--`, the host and the command.
std::vector<std::string> sshArgv(const SshOptions& options, const std::string& host,
                                 const std::string& command);

// What ssh's own failures mean, from its stderr: a HINT for the user, or empty.
std::string sshFailureHint(const std::string& host, const std::string& sshStderr,
                           const SshOptions& options);

// The agent plan: named records, byte-exact for any value (NUL, newlines, non-UTF-8 bytes).
// "dtrain-agent-plan 1\n" then per record "NAME LENGTH\n" + LENGTH bytes + "\n", then "end 0\n\n".
using Records = std::vector<std::pair<std::string, std::string>>;
std::string encodePlan(const Records& records);
// Throws InvalidArgument naming what is wrong (version, a truncated record, sizes past the caps).
Records decodePlan(const std::string& text);
// Where the end marker of a complete plan is in `text` (bytes read so far), or npos.
size_t planEnd(const std::string& text);

}  // namespace dtrain::launcher::remote
