#pragma once
// StallDetector: decides from the ranks' published progress (dtrain/base/progress.h) that a job is
// stuck, and which ranks hold the others up. Pure: fed reports and times, tested by tables; the
// monitor adds native stacks and decides what to do (--stall-action).

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/base/progress.h"

namespace dtrain::launcher::monitor {

// Note [Stall detection]
// ~~~~~~~~~~~~~~~~~~~~~~
// A rank advances when its published report changes in a way that counts
// (progress::advanced: a collective issued or changing state, another step, new figures); the
// master stamps each change with its own clock, so node clocks never matter. With
// --stall-timeout S, a stall is either
//   - no progress: no live rank advanced for S seconds (a hang in a collective stops every rank
//     within milliseconds, since the others wait in the same collective), or
//   - a lag: some ranks advanced within S while others did not for S (a rank stuck outside
//     collectives while the others still have work that needs nobody).
// Which ranks are *behind* comes from the flight recorders, as PyTorch's flight-recorder
// analysis does it: a rank that has issued fewer collectives than the others has not reached the
// one they wait in; at equal counts, a rank whose newest collective is still "queued" (issued,
// never started) holds up those that are "running" it. When every stuck rank is inside the same
// collective, none stands out -- a network or driver hang -- and the report says so and leaves
// it to the native stacks. Ranks that publish nothing (a program without dtrain's runtime) are
// listed and never judged. A stall is reported once; it ends when a stuck rank advances again.

struct RankProgress {
  progress::RankReport report;
  double lastAdvance = 0;  // the master's steady clock, seconds
  bool ended = false;      // its worker has exited: no longer judged
};

struct Stall {
  enum class Kind { NoProgress, Lagging };
  Kind kind = Kind::NoProgress;
  double quietSeconds = 0;  // every stuck rank has made no progress for at least this long
  std::vector<int> stuck;   // no progress for at least the timeout
  std::vector<int> behind;  // of those, the ranks holding the others up (may be empty)
  std::vector<int> moving;  // ranks that still advance (a lag)
  std::vector<int> silent;  // live ranks that publish no progress
  std::string where;        // one line: why `behind` are behind, or that none stands out
};

class StallDetector {
 public:
  explicit StallDetector(double timeoutSeconds) : timeout_(timeoutSeconds) {}

  // A new attempt: every rank starts over. `worldSize` ranks are expected.
  void reset(int worldSize);
  void update(double now, const progress::RankReport& report);
  void rankEnded(int rank);
  // The stall that starts now, if one does (each is reported once).
  std::optional<Stall> check(double now);
  bool inStall() const { return reported_; }

  const std::map<int, RankProgress>& ranks() const { return ranks_; }
  double timeout() const { return timeout_; }

 private:
  double timeout_;
  int worldSize_ = 0;
  std::map<int, RankProgress> ranks_;
  bool reported_ = false;
};

// The communicator a stall is judged on: "pg/default" when the rank has it, else its first.
const progress::CollectiveState* primaryCollectives(const progress::RankReport& report);

// Fills stall.behind and stall.where from the stuck ranks' reports (see Note [Stall detection]).
void findBehind(Stall& stall, const std::map<int, RankProgress>& ranks);

struct StallReportContext {
  std::string option = "--stall-timeout";
  double timeout = 0;
  bool stopping = false;              // --stall-action stop
  std::map<int, std::string> nodes;   // rank -> node name
  std::map<int, std::string> stacks;  // rank -> native stack text, or why there is none
};

// The report printed on stderr, one "launch: " headline and indented detail lines.
std::string formatStallReport(const Stall& stall, const std::map<int, RankProgress>& ranks,
                              const StallReportContext& ctx);

// "0-3, 5" style rank lists.
std::string formatRanks(const std::vector<int>& ranks);

}  // namespace dtrain::launcher::monitor
