#pragma once
// Progress: the progress lines of a data-parallel training loop, printed on rank 0: the mean loss
// and accuracy over an interval of steps and over every rank, the job's samples/s, the time left.
// Under `launch` stdout is a pipe that launch prefixes line by line, so each report is a whole
// line; run directly on a terminal, the line is redrawn in place.
//
//   Progress progress(*group, epochs, totalSteps);
//   progress.add(loss, correct, samples);                   // every step, on every rank
//   if (step % logEvery == 0) progress.report(epoch, step);  // collective: every rank, same steps

#include <chrono>
#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>

#include <dtrain/torch/process_group.h>

namespace examples {

// H:MM:SS, rounded to the second.
std::string formatDuration(double seconds);

class Progress {
 public:
  // `unit`: what add()'s samples count ("samples", "tokens"); epochs <= 0: no epoch shown.
  Progress(dtrain::ProcessGroup& group, int64_t epochs, int64_t totalSteps,
           std::string unit = "samples");

  // One step of this rank: its loss (mean over its samples), correct predictions, samples.
  void add(double loss, double correct, double samples);

  // The line for the steps added since the last report, `extra` appended. Collective (one small
  // allreduce): every rank calls it at the same steps.
  void report(int64_t epoch, int64_t step, const std::string& extra = "");

  // Any other line from rank 0 (evaluation, summary): ends a line being redrawn first.
  void line(const std::string& text, bool redraw = false);

 private:
  using Clock = std::chrono::steady_clock;

  dtrain::ProcessGroup& group_;
  int64_t epochs_, totalSteps_;
  std::string unit_;
  bool terminal_;
  bool open_ = false;  // a redrawn line without its newline yet
  at::Tensor sums_;    // double [3]: loss x samples, correct, samples
  int64_t steps_ = 0;
  Clock::time_point start_ = Clock::now();
};

}  // namespace examples
