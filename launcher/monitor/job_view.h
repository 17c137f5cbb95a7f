#pragma once
// JobView: the master's picture of the whole job for the endpoint and the status line -- each
// node's latest sample records (its own, or an agent's read from the store), each rank's trainer
// figures, and the job's state. Thread-safe: the monitor thread writes, a scrape reads.

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "launcher/monitor/records.h"

namespace dtrain::launcher::monitor {

class JobView {
 public:
  void setJob(int attempt, int worldSize, int maxRestarts);
  // `ranks`: those the stall report blames (dtrain_rank_stalled), empty when none is.
  void setStalled(bool stalled, std::vector<int> ranks = {});
  // The multi-node master's --heartbeat-timeout (0: none), served beside the nodes' ages.
  void setHeartbeatTimeout(double seconds);
  // Node `node`'s latest records (they replace its earlier ones), heard of at `now` (steady
  // seconds): its heartbeat age counts from there.
  void ingest(const std::string& node, std::vector<Record> records, double now);
  // The ranks' latest trainer records (source "trainer"), all of them at once.
  void setTrainerRecords(std::vector<Record> records);
  // A new attempt: ranks' records of the earlier one are dropped (nodes stay, with their age).
  void newAttempt(int attempt);

  // Every node's records, then the trainer records.
  std::vector<Record> latest() const;
  JobState job(double now) const;
  std::string prometheus(double now) const;
  std::string statusLine(double now) const;

 private:
  struct Node {
    std::vector<Record> records;
    double heardAt = 0;
  };
  mutable std::mutex mutex_;
  std::map<std::string, Node> nodes_;  // guarded by mutex_
  std::vector<Record> trainer_;        // guarded by mutex_
  JobState job_;                       // guarded by mutex_ (heartbeat ages filled on read)
};

}  // namespace dtrain::launcher::monitor
