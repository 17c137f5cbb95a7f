#pragma once
// Progress: what each rank tells `launch` about itself while it runs -- its collectives (sequence
// number and the flight recorder's last entries), its training step, and a trainer's own figures
// (loss, samples/s, ...) -- so that launch can notice a stalled job, say which rank is behind and
// where, and serve a trainer's figures on its metrics endpoint beside its own samples.
//
// A rank publishes through the job's store from a thread of its own, at most once a second and
// only when something changed (docs/design.md "Monitoring"). Nothing here blocks the caller:
// setStep() and publishFigures() only record the latest values. Outside `launch` (no
// DTRAIN_STORE_ADDR) nothing is published and every call is a cheap no-op.
//
//   dtrain::progress::setStep(step);                                  // once per step
//   dtrain::progress::publishFigures(step, {{"loss", 0.25}, {"samples_per_s", 812.0}});
//
// A program that uses dtrain::metrics::Metrics calls neither: under launch its records come here
// by themselves (metrics::LaunchSink). The communicators register themselves
// (watchCollectives), so a training program using dtrain's collectives gets stall reports
// without calling anything.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/base/metrics.h"

namespace dtrain::progress {

// Note [Monitoring keys]
// ~~~~~~~~~~~~~~~~~~~~~~
// Everything monitoring writes to the job's store lives under the restart round's prefix
// ("round<N>/", docs/design.md), so a report of an earlier attempt is never read as a current one:
//
//   monitor/version        int64 counter, add(1) after every write below. The master reads it
//                          once per interval and reads the other keys only when it moved, so an
//                          idle job costs one round trip per interval.
//   monitor/rank/<R>       rank R's latest report (JSON, encodeReport): pid, node rank, step,
//                          collectives, the trainer's latest figures and recent records (Note
//                          [Trainer records]). Written by the rank's publisher thread.
// and, for a job on several nodes (written by each node's launch agent; the master samples its
// own node directly):
//   monitor/node/<N>       node N's latest resource samples (a JSON array of metrics records,
//                          source "launch"), each sample interval;
//   monitor/stacks/request {"id": K, "ranks": [...]}: the master asks every agent for the native
//                          stacks of those of the stuck ranks it runs (K from the counter
//                          monitor/stacks/requests); each agent answers in
//   monitor/stacks/<N>     {"request": K, "stacks": {"<rank>": "<text>"}}.
//
// Values are small JSON documents; the store's limits (64 MiB a value) are far away.

// Note [Trainer records]
// ~~~~~~~~~~~~~~~~~~~~~~
// A trainer's figures serve two readers in launch: its endpoint, which shows the latest value of
// every series, and its --metrics-file, which should hold the records as the trainer made them
// (each step's loss at that step), not a once-a-second sample of them. So a report carries both:
//   figures   the latest value of every field ever recorded, with the newest step and time
//             (merged: an evaluation's test_accuracy stays while later steps record only loss);
//   records   the newest records themselves, numbered 1, 2, ... in the order recorded, kept
//             while they are younger than kRecentRecordSeconds and at most kRecentRecords of
//             them. launch reads the reports about every second and appends each record
//             numbered above the last it wrote, so a trainer that records fewer than
//             kRecentRecords between two reads loses none; beyond that launch's file misses
//             some (it counts them and says so in its log), while the trainer's own JSONL file,
//             if it writes one, has them all. launch labels them with the node its samples
//             give the rank or -- before the first sample of a remote node arrived -- the node
//             the report's node rank (GROUP_RANK) names; a record waits in the report until
//             its node is known.
// The cost is bounded: one report a second, at most kRecentRecords records in it.
constexpr size_t kRecentRecords = 64;
constexpr double kRecentRecordSeconds = 5.0;
constexpr const char* kVersionKey = "monitor/version";
constexpr const char* kStackRequestKey = "monitor/stacks/request";
std::string rankKey(int rank);
std::string nodeKey(int nodeRank);
std::string stacksKey(int nodeRank);

// One collective of a rank's flight recorder, as published.
struct CollectiveEntry {
  uint64_t seq = 0;
  std::string what;   // "allreduce(float32 x 4096, sum)"
  std::string state;  // "queued" (issued, not started), "running", "done", "failed", "skipped"
  double ms = 0;      // queued to done, or to the moment of publishing while still open

  bool open() const { return state == "queued" || state == "running"; }
};

// One communicator of a rank: collectives issued so far and the last ones, oldest first.
struct CollectiveState {
  std::string name;     // "pg/default"
  uint64_t issued = 0;  // the next collective gets this sequence number
  std::vector<CollectiveEntry> tail;
};

// What a rank publishes (monitor/rank/<R>).
struct RankReport {
  int rank = -1;
  int nodeRank = -1;  // GROUP_RANK: which node's launch started it (-1: not known)
  int64_t pid = 0;
  double time = 0;  // Unix seconds when it was published
  std::optional<int64_t> step;
  std::vector<CollectiveState> collectives;
  // The trainer's latest value of each figure, with the newest step and time one was recorded
  // (Note [Trainer records]).
  std::vector<std::pair<std::string, double>> figures;
  std::optional<int64_t> figuresStep;
  double figuresTime = 0;
  // The trainer's newest records as it made them (time, step, gpu, fields; source, run id, node
  // and rank are launch's to fill), oldest first; the last one is number `lastRecord`.
  std::vector<metrics::Record> records;
  uint64_t lastRecord = 0;
};

// JSON text of a report, and back. decodeReport throws InvalidArgument naming what is wrong.
// A non-finite figure travels as null and comes back as NaN.
std::string encodeReport(const RankReport& report);
RankReport decodeReport(const std::string& json);

// True when `after` shows progress over `before`: another collective issued, one changed state,
// another step, or new figures. Times and durations alone are not progress.
bool advanced(const RankReport& before, const RankReport& after);

// --- What a training program (or dtrain's own layers) calls. Thread-safe, never blocks. ---

// This rank's training step (the latest one wins).
void setStep(int64_t step);

// The figures of `step` (also sets the step), recorded now: launch serves them on its endpoint as
// dtrain_<name>{node,rank} (each keeps its latest value until recorded again) and appends them to
// its --metrics-file as a trainer record. Names follow the metrics record rules
// ([a-zA-Z_][a-zA-Z0-9_]*, not a schema key); invalid ones are dropped by launch.
void publishFigures(int64_t step, std::vector<std::pair<std::string, double>> fields);

// A metrics record (its time, step, gpu and fields), as publishFigures. What metrics::LaunchSink
// calls.
void publishRecord(const metrics::Record& record);

// Whether this process publishes: it was started by launch (DTRAIN_STORE_ADDR and RANK are set).
bool publishing();

// A source of collective state, polled by the publisher thread (never by the communicator's
// thread, which is the one that hangs). Keep the returned registration for as long as the source
// may be called; destroying it waits for a call in progress and removes the source.
class Registration {
 public:
  Registration() = default;
  explicit Registration(uint64_t id) : id_(id) {}
  ~Registration();
  Registration(Registration&& other) noexcept : id_(other.id_) { other.id_ = 0; }
  Registration& operator=(Registration&& other) noexcept;
  Registration(const Registration&) = delete;
  Registration& operator=(const Registration&) = delete;

 private:
  uint64_t id_ = 0;
};
Registration watchCollectives(std::function<CollectiveState()> source);

// Publishes what changed right now instead of at the next tick (tests; a trainer about to exit).
// Waits at most `timeoutMs`; returns whether it was published.
bool flushProgress(int timeoutMs = 2000);

}  // namespace dtrain::progress
