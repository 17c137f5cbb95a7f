#pragma once
// Progress: what each rank tells `launch` about itself while it runs -- its collectives (sequence
// number and the flight recorder's last entries), its training step, and a trainer's own figures
// (loss, samples/s, ...) -- so that launch can notice a stalled job, say which rank is behind and
// where, and serve a trainer's figures on its metrics endpoint beside its own samples.
//
// A rank publishes through the job's store from a thread of its own, at most once a second and
// only when something changed (see Note [Progress publisher]). Nothing here blocks the caller:
// setStep() and publishFigures() only record the latest values. Outside `launch` (no
// DTRAIN_STORE_ADDR) nothing is published and every call is a cheap no-op.
//
//   dtrain::progress::setStep(step);                                  // once per step
//   dtrain::progress::publishFigures(step, {{"loss", 0.25}, {"samples_per_s", 812.0}});
//
// The communicators register themselves (watchCollectives), so a training program using dtrain's
// collectives gets stall reports without calling anything.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace dtrain::progress {

// Note [Monitoring keys]
// ~~~~~~~~~~~~~~~~~~~~~~
// Everything monitoring writes to the job's store lives under the restart round's prefix
// ("round<N>/", docs/design.md), so a report of an earlier attempt is never read as a current one:
//
//   monitor/version        int64 counter, add(1) after every write below. The master reads it
//                          once per interval and reads the other keys only when it moved, so an
//                          idle job costs one round trip per interval.
//   monitor/rank/<R>       rank R's latest report (JSON, encodeReport): pid, step, collectives,
//                          the trainer's latest figures. Written by the rank's publisher thread.
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
  int64_t pid = 0;
  double time = 0;  // Unix seconds when it was published
  std::optional<int64_t> step;
  std::vector<CollectiveState> collectives;
  // The trainer's latest figures (publishFigures), with the step and time they were recorded.
  std::vector<std::pair<std::string, double>> figures;
  std::optional<int64_t> figuresStep;
  double figuresTime = 0;
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

// The figures of `step` (also sets the step). launch serves them on its endpoint as
// dtrain_<name>{node,rank}; names follow the metrics record rules ([a-zA-Z_][a-zA-Z0-9_]*).
void publishFigures(int64_t step, std::vector<std::pair<std::string, double>> fields);

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
