#pragma once
// Checkpointer::Impl: the parts behind dtrain::Checkpointer wired together, each owning its state
// and readable alone -- placement.h (where the ranks are; their small collectives and
// agreements), saver.h, restorer.h and shard_exchange.h. Private to the torch layer.

#include <memory>
#include <string>

#include "checkpoint/file_io.h"
#include "dtrain/torch/checkpoint.h"
#include "dtrain/torch/process_group.h"
#include "placement.h"
#include "restorer.h"
#include "saver.h"
#include "shard_exchange.h"
#include "state.h"

namespace dtrain {

struct Checkpointer::Impl {
  // Not collective: the Checkpointer's constructor then calls placement.place().
  Impl(std::shared_ptr<ProcessGroup> group, const CheckpointOptions& options,
       state::Registry& registered);

  // Collective when the group re-formed since the last call (its epoch moved): see Note [A
  // Checkpointer follows its group's epoch] in checkpointer.cpp. Every public call that makes
  // collectives starts with it.
  void followEpoch();

  const CheckpointOptions options;
  checkpoint::Placement placement;
  const std::string dir;                     // this node's directory
  std::shared_ptr<checkpoint::FileOps> ops;  // counts I/O calls over the process's saves
  checkpoint::ShardExchange exchange;
  checkpoint::Saver saver;
  checkpoint::Restorer restorer;
  bool signalInstalled = false;
  // The group's membership epoch that `placement` describes; -1: not placed yet (a rank taken
  // into a running round: its node's directory is not made yet either).
  int epoch = 0;
};

}  // namespace dtrain
