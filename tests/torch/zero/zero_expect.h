#pragma once
// gtest assertions of the ZeRO tests over trainMlp's results (zero_support.h).

#include <gtest/gtest.h>

#include "zero_support.h"

namespace dtrain::testing {

// Every rank's parameters equal rank 0's, bit for bit.
inline void expectRanksBitwiseEqual(const ZeroResult& r) {
  for (size_t rank = 1; rank < r.params.size(); ++rank) {
    for (const auto& [name, t] : r.params[0]) {
      EXPECT_TRUE(torch::equal(r.params[rank].at(name), t)) << name << " differs on rank " << rank;
    }
  }
}

// Rank 0's parameters within `tolerance` (relativeError) of the reference's.
inline void expectClose(const ZeroResult& got, const ZeroResult& want, double tolerance) {
  for (const auto& [name, t] : want.params[0]) {
    const double err = relativeError(got.params[0].at(name).to(torch::kDouble),
                                     t.to(torch::kDouble));
    EXPECT_LE(err, tolerance) << name;
  }
}

}  // namespace dtrain::testing
