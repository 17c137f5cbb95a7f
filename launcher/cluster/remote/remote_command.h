#pragma once
// The command lines launch runs on other nodes, as pure functions: POSIX single quoting of every
// remote word, the `ssh` argv (always the system ssh, never a shell of our own), and the agent
// plan that travels on ssh's stdin -- the token and the forwarded environment never appear in a
// command line (visible in the remote /proc/*/cmdline, and one argument is capped at 128 KiB).
// See Note [Remote command lines].

#include <string>
#include <utility>
#include <vector>

#include "launcher/config/ssh_options.h"
#include "launcher/node/shell_quote.h"

namespace dtrain::launcher::remote {

// Note [Remote command lines]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// ssh joins its command words with spaces and hands the result to the remote user's login shell,
// which may be sh, bash, zsh, csh, tcsh or fish. So the command is always run by `sh -c`, and the
// login shell only has to pass one word to it: `exec sh -c 'SCRIPT'`. SCRIPT is a POSIX command in
// which every word is wrapped in single quotes, with each ' written as '"'"' : inside single quotes
// sh takes every byte literally -- spaces, ", $(id), backticks, ;, &&, *, ~, newlines, non-ASCII
// bytes -- and the empty string stays a word. The words are the working directory, the launch
// binary, `--agent` and the program's argv; nothing else.
//
// The outer single quotes are read alike by every login shell as long as SCRIPT holds no
// backslash (fish reads \\ and \' inside single quotes), no newline (csh and tcsh refuse one
// inside quotes) and no ! (csh's history expansion); its quotes travel as '"'"' , which all of them
// read as one ' (so does sh inside SCRIPT: no backslash is needed for a quote). A SCRIPT with one
// of those three characters (they can only come from the
// directory or an argument) travels encoded instead, as
//   exec sh -c 'c="$(echo BASE64 | base64 -d)" && eval "$c"'
// -- letters, digits and + / = only -- so the argument still arrives byte-identical (base64 is
// coreutils'; without it sh says "base64: not found" and the session ends with 127).
//
// The rest of the plan (options, the job token, the forwarded environment) is written to ssh's
// stdin as length-prefixed records (encodePlan), which need no quoting at all and which no `ps`
// shows. ssh's SendEnv is not used: Debian's sshd accepts only LANG and LC_*.

// The POSIX script: `cd 'DIR' && exec 'WORD' 'WORD'...` (no cd when `cwd` is empty). A directory
// missing on the remote node ends it with exit 125 and a line naming it.
std::string remoteScript(const std::string& cwd, const std::vector<std::string>& argv);

// What ssh runs through the remote login shell: `exec sh -c '<remoteScript>'`, or its encoded
// form (see the note).
std::string remoteShellCommand(const std::string& cwd, const std::vector<std::string>& argv);

// RFC 4648 base64, with padding.
std::string base64(const std::string& bytes);

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
