// The one integer rule (parse_int.h) that flags, environment variables, fault specs and store
// counters share.
#include <gtest/gtest.h>

#include "parse_int.h"

namespace dtrain::parse_int_test {
namespace {

TEST(ParseInt64, AcceptsDecimalIntegersOverTheWholeInt64Range) {
  const std::pair<const char*, int64_t> cases[] = {
      {"0", 0},
      {"7", 7},
      {"-7", -7},
      {"0042", 42},
      {"-0", 0},
      {"9223372036854775807", INT64_MAX},
      {"-9223372036854775808", INT64_MIN},
  };
  for (const auto& [text, expected] : cases) {
    int64_t v = 123;
    EXPECT_TRUE(parseInt64(text, &v)) << text;
    EXPECT_EQ(v, expected) << text;
  }
}

TEST(ParseInt64, RejectsWhatStrtollWouldQuietlyAccept) {
  for (const char* text : {"", " 1", "1 ", "+1", "0x10", "1e3", "12abc", "-", "--1", "1.0",
                           "9223372036854775808", "-9223372036854775809", "\t3", "3\n"}) {
    int64_t v = 123;
    EXPECT_FALSE(parseInt64(text, &v)) << '"' << text << '"';
    EXPECT_EQ(v, 123) << "the output is untouched on failure: \"" << text << '"';
  }
}

TEST(ParseInt64, ReadsOnlyTheViewNotTheBytesAfterIt) {
  const std::string text = "12345";
  int64_t v = 0;
  ASSERT_TRUE(parseInt64(std::string_view(text).substr(0, 2), &v));
  EXPECT_EQ(v, 12);
}

}  // namespace
}  // namespace dtrain::parse_int_test
