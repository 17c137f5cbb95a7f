#pragma once
// Exit codes that mean the same to a training program and to `launch`
// (docs/design.md#exit-codes). Torch-free: `launch` uses them too.

namespace dtrain {

// launch's and a worker's exit code after a preemption: every rank checkpointed on SIGTERM;
// rerunning the same command resumes (docs/design.md, exit codes).
constexpr int kExitPreempted = 75;

}  // namespace dtrain
