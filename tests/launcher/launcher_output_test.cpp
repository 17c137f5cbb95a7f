// LineSplitter, console chunks and log rotation: the pieces behind whole-line output.
#include <sys/stat.h>

#include <gtest/gtest.h>

#include "dtrain/base/error.h"
#include "launcher/supervisor/output.h"
#include "test_support.h"

namespace dtrain::launcher::launcher_output_test {
namespace {

using Lines = std::vector<std::string>;

struct SplitCase {
  const char* name;
  std::vector<std::string> pieces;  // fed one after another
  size_t maxLine;
  Lines lines;  // everything fed, then finish()
};

class LineSplitterTest : public ::testing::TestWithParam<SplitCase> {};

TEST_P(LineSplitterTest, WholeLinesWhateverThePieces) {
  const SplitCase& c = GetParam();
  LineSplitter s(c.maxLine);
  Lines got;
  for (const auto& p : c.pieces) {
    for (auto& l : s.feed(p.data(), p.size())) got.push_back(l);
  }
  for (auto& l : s.finish()) got.push_back(l);
  EXPECT_EQ(got, c.lines);
}

INSTANTIATE_TEST_SUITE_P(
    Table, LineSplitterTest,
    ::testing::Values(
        SplitCase{"OneLine", {"abc\n"}, 100, {"abc"}},
        SplitCase{"Pieces", {"ab", "c\nde", "f\n"}, 100, {"abc", "def"}},
        SplitCase{"SeveralInOne", {"a\nb\nc\n"}, 100, {"a", "b", "c"}},
        SplitCase{"EmptyLines", {"\n\n"}, 100, {"", ""}},
        SplitCase{"UnterminatedLast", {"a\nb"}, 100, {"a", "b"}},
        SplitCase{"NothingLeft", {"a\n"}, 100, {"a"}},
        SplitCase{"LongLineCut", {"abcdefgh\n"}, 3, {"abc", "def", "gh"}},
        SplitCase{"LongLineAcrossPieces", {"abcd", "efg\n"}, 3, {"abc", "def", "g"}},
        SplitCase{"Binary", {std::string("a\0b\n", 4)}, 100, {std::string("a\0b", 3)}}),
    [](const ::testing::TestParamInfo<SplitCase>& info) { return info.param.name; });

TEST(ConsoleChunks, WholeLinesPackedUpToTheChunkSize) {
  EXPECT_EQ(formatConsoleChunks("[r0]: ", {"a", "b"}, 4096), (Lines{"[r0]: a\n[r0]: b\n"}));
  EXPECT_EQ(formatConsoleChunks("> ", {"aaaa", "bbbb", "cc"}, 14),
            (Lines{"> aaaa\n> bbbb\n", "> cc\n"}));
  EXPECT_EQ(formatConsoleChunks("> ", {std::string(20, 'x')}, 8),
            (Lines{"> " + std::string(20, 'x') + "\n"}))
      << "a line longer than a chunk stays whole";
  EXPECT_TRUE(formatConsoleChunks("> ", {}, 8).empty());
}

TEST(LogFile, RotatesKeepingOneOldCopy) {
  dtrain::testing::TempDir dir;
  const std::string path = dir.file("stdout.log");
  {
    LogFile log(path, 10);
    log.write("0123456", 7);
    log.write("789ab", 5);  // would pass 10: rotate first
    log.write("cdef", 4);
    log.write("ghijklmn", 8);  // rotate again: the first copy is replaced
    EXPECT_EQ(log.rotations(), 2);
  }
  EXPECT_EQ(dtrain::testing::readFile(path), "ghijklmn");
  EXPECT_EQ(dtrain::testing::readFile(path + ".1"), "789abcdef");
}

TEST(LogFile, UnlimitedAndErrors) {
  dtrain::testing::TempDir dir;
  {
    LogFile log(dir.file("a.log"), 0);
    for (int i = 0; i < 100; ++i) log.write("0123456789", 10);
    EXPECT_EQ(log.rotations(), 0);
  }
  struct stat st {};
  ASSERT_EQ(::stat(dir.file("a.log").c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 1000);
  EXPECT_THROW(LogFile(dir.file("missing/dir/a.log"), 0), dtrain::Error);
}

TEST(WorkerStream, TailKeepsTheLastLines) {
  StreamSinks sinks;
  sinks.tailLines = 2;
  WorkerStream s(sinks);
  const std::string text = "one\ntwo\nthree\nfour";
  s.consume(text.data(), text.size());
  EXPECT_EQ(s.tail(), (std::deque<std::string>{"two", "three"}));
  s.finish();
  EXPECT_EQ(s.tail(), (std::deque<std::string>{"three", "four"}));
}

}  // namespace
}  // namespace dtrain::launcher::launcher_output_test
