#pragma once
// The median every benchmark reports: one definition, so that a figure means the same in every
// table (medians of interleaved runs; benchmarks/README.md).

#include <algorithm>
#include <vector>

namespace dtrain::bench {

// The middle of the sorted values; of an even count, the mean of the two middle ones.
// `whenEmpty` for no values at all (0, or what a table prints as "none").
inline double median(std::vector<double> v, double whenEmpty = 0) {
  if (v.empty()) return whenEmpty;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace dtrain::bench
