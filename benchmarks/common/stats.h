#pragma once
// The statistics every benchmark's tables print, one definition each, so that a figure means the
// same in every table (benchmarks/README.md, "How to read the figures"). The Python drivers and
// peers use the same definitions from stats.py beside this file.
//
// Note [Paired statistics]
// dtrain and its peer run interleaved -- turn by turn, rep by rep or round by round -- so sample i
// of one side ran next to sample i of the other in time. A ratio between them is taken per pair
// and the median of those ratios reported: a swing of the machine's load then moves both sides of
// a ratio together, instead of one side of a ratio of medians.

#include <algorithm>
#include <cstddef>
#include <vector>

namespace dtrain::bench {

// The middle of the sorted values; of an even count, the mean of the two middle ones.
// `whenEmpty` for no values at all (0, or what a table prints as "none", e.g. -1 for "-").
inline double median(std::vector<double> v, double whenEmpty = 0) {
  if (v.empty()) return whenEmpty;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// The q-quantile, q in [0, 1], interpolated linearly between the two nearest ranks: 0 is the
// smallest value, 1 the largest, and 0.5 the median above (p50 is the median, never another
// middle). `whenEmpty` as for median().
inline double percentile(std::vector<double> v, double q, double whenEmpty = 0) {
  if (v.empty()) return whenEmpty;
  std::sort(v.begin(), v.end());
  const double at = std::clamp(q, 0.0, 1.0) * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<size_t>(at);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (at - static_cast<double>(lo));
}

// The smallest and the largest value: the spread a table prints beside a median, as
// "median (min)" or "median [min-max]".
struct Spread {
  double min = 0;
  double max = 0;
};

// Both `whenEmpty` for no values.
inline Spread spread(const std::vector<double>& v, double whenEmpty = 0) {
  if (v.empty()) return {whenEmpty, whenEmpty};
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  return {*lo, *hi};
}

// f(a[i], b[i]) for each pair of samples that ran side by side (Note [Paired statistics]). A
// sample of the longer series without a partner is left out.
template <class F>
std::vector<double> pairwise(const std::vector<double>& a, const std::vector<double>& b, F f) {
  std::vector<double> out;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) out.push_back(f(a[i], b[i]));
  return out;
}

// a[i] / b[i] for each pair; a pair whose b[i] is not positive (nothing measured) is left out.
inline std::vector<double> pairedRatios(const std::vector<double>& a,
                                        const std::vector<double>& b) {
  std::vector<double> out;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (b[i] > 0) out.push_back(a[i] / b[i]);
  }
  return out;
}

// The ratio a table prints for two interleaved series: the median of their paired ratios a / b.
inline double pairedRatio(const std::vector<double>& a, const std::vector<double>& b,
                          double whenEmpty = 0) {
  return median(pairedRatios(a, b), whenEmpty);
}

}  // namespace dtrain::bench
