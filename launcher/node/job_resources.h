#pragma once
// What a job takes from the node before anything starts, shared by the one-node job and the
// multi-node one: its token and run id (the kernel's randomness), addresses (the resolver), a
// free port, and its job directory.

#include <string>

#include "launcher/node/worker_env.h"

namespace dtrain::launcher {

// A fresh job token: 32 random bytes from the kernel, hex.
std::string newJobToken();
// A random run id (12 hex digits).
std::string newRunId();

// An IPv4 literal for `host` ("localhost" -> 127.0.0.1). Workers get addresses, never names.
// Throws InvalidArgument naming `label` when the name does not resolve.
std::string resolveAddress(const std::string& host, const std::string& label);
// A port nobody listens on right now (bind to port 0, read it back, close). Rank 0 binds it a
// moment later; the window is the same as torchrun's.
int freePort(const std::string& address);
// The job directory when no --log-dir is given: for error files, and for log files that
// --redirects / --tee ask for (torchrun writes those to a temporary directory too). Removed when
// the job ends, also when launch is killed: see Note [Temporary job directory].
std::string makeTempJobDir(const EnvMap& environment, const std::string& runId);
// The job directory: `logDir`/RUN_ID (absolute), or a fresh temporary one when `logDir` is empty.
std::string jobDirFor(const std::string& logDir, const EnvMap& environment,
                      const std::string& runId);

}  // namespace dtrain::launcher
