#pragma once
// launch's own exit codes (docs/design.md#exit-codes); every other code is a worker's, passed
// through. kExitPreempted (75) means the same to a worker and to launch: dtrain/base/exit_codes.h.

#include "dtrain/base/exit_codes.h"

namespace dtrain::launcher {

constexpr int kExitUsage = 2;             // a usage error: nothing was started
constexpr int kExitDeadline = 124;        // a deadline passed (rendezvous, exit barrier, stall)
constexpr int kExitInfrastructure = 125;  // launcher or infrastructure error
constexpr int kExitNotExecutable = 126;   // the program cannot be executed
constexpr int kExitNotFound = 127;        // the program was not found

}  // namespace dtrain::launcher
