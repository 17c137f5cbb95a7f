// splitAt() and trim(): the text helpers of the fault-spec, host-list and option parsers.
#include <gtest/gtest.h>

#include "text.h"

namespace dtrain::text_test {
namespace {

using Parts = std::vector<std::string>;

TEST(Text, SplitAtKeepsEmptyParts) {
  EXPECT_EQ(splitAt("a,,b", ','), (Parts{"a", "", "b"}));
  EXPECT_EQ(splitAt("", ','), (Parts{""}));
  EXPECT_EQ(splitAt(",", ','), (Parts{"", ""}));
  EXPECT_EQ(splitAt("abc", ','), (Parts{"abc"}));
  EXPECT_EQ(splitAt("a:b:", ':'), (Parts{"a", "b", ""}));
}

TEST(Text, TrimRemovesOnlyTheGivenBlanksAtBothEnds) {
  EXPECT_EQ(trim("  a b\t"), "a b");
  EXPECT_EQ(trim(" \t "), "");
  EXPECT_EQ(trim("x\r"), "x\r");
  EXPECT_EQ(trim(" x\r\n", " \t\r\n"), "x");
}

}  // namespace
}  // namespace dtrain::text_test
