#include "progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <utility>

#include <ATen/ATen.h>
#include <fmt/format.h>

namespace examples {

std::string formatDuration(double seconds) {
  const auto s = static_cast<int64_t>(std::max(0.0, seconds) + 0.5);
  return fmt::format("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60);
}

Progress::Progress(dtrain::ProcessGroup& group, int64_t epochs, int64_t totalSteps,
                   std::string unit)
    : group_(group),
      epochs_(epochs),
      totalSteps_(totalSteps),
      unit_(std::move(unit)),
      terminal_(group.rank() == 0 && isatty(STDOUT_FILENO)),
      sums_(at::zeros({3}, at::kDouble)) {}

void Progress::add(double loss, double correct, double samples) {
  sums_[0] += loss * samples;
  sums_[1] += correct;
  sums_[2] += samples;
  ++steps_;
}

void Progress::report(int64_t epoch, int64_t step, const std::string& extra) {
  group_.allreduce(sums_);  // sums over every rank
  const double elapsed = std::chrono::duration<double>(Clock::now() - start_).count();
  const double samples = sums_[2].item<double>();
  const double eta = elapsed / static_cast<double>(steps_) *
                     static_cast<double>(totalSteps_ - step);
  const std::string epochPart = epochs_ > 0 ? fmt::format("epoch {}/{}  ", epoch + 1, epochs_)
                                            : std::string();
  line(fmt::format("{}step {}/{}  loss {:.4f}  acc {:5.1f}%  {:.0f} {}/s  eta {}{}", epochPart,
                   step, totalSteps_, sums_[0].item<double>() / samples,
                   100 * sums_[1].item<double>() / samples, samples / elapsed, unit_,
                   formatDuration(eta), extra),
       /*redraw=*/true);
  sums_.zero_();
  steps_ = 0;
  start_ = Clock::now();
}

void Progress::line(const std::string& text, bool redraw) {
  if (group_.rank() != 0) return;
  if (terminal_ && redraw) {
    std::printf("\r%s", text.c_str());
    open_ = true;
  } else {
    std::printf("%s%s\n", open_ ? "\n" : "", text.c_str());
    open_ = false;
  }
  std::fflush(stdout);
}

}  // namespace examples
