// The checkpoint file format and its reader, torch-free: round trips, and every way a file can be
// damaged -- truncation at every 1/16, a flip of every single byte, crafted lengths and offsets,
// foreign files -- refused with a message naming file, entry and offset. The fuzz corpus
// (tests/fuzz/corpus/checkpoint) and a few thousand seeded mutations go through the fuzz target's
// own function.
#include <dirent.h>

#include <fstream>
#include <iterator>
#include <random>

#include <gtest/gtest.h>

#include "../../fuzz/checkpoint_fuzz_target.h"
#include "byte_layout.h"
#include "checkpoint/format.h"
#include "checkpoint_file_support.h"
#include "dtrain/base/error.h"
#include "test_support.h"

namespace dtrain::checkpoint::checkpoint_format_test {
namespace {

using testing::sampleCheckpoint;
using testing::sampleFileBytes;

using Bytes = std::vector<uint8_t>;

// The `n`-byte field at `at` of a file's bytes.
uint64_t getU(const Bytes& b, size_t at, int n) { return getLE(b.data() + at, n); }
void setU(Bytes& b, size_t at, uint64_t v, int n) { putLE(b.data() + at, v, n); }

// Recomputes the manifest and header checksums, so that a crafted field reaches the checks
// behind them.
using fuzz::detail::resign;

// Byte offset of manifest record `k` in `b`.
size_t recordAt(const Bytes& b, int k) {
  size_t at = getU(b, 72, 8);
  for (int i = 0; i < k; ++i) {
    uint64_t nameLen = getU(b, at, 2), ndim = b[at + 4];
    at += roundUp(kRecordFixedSize + 8 * ndim + nameLen, 8);
  }
  return at;
}

std::string refusal(const Bytes& b) {
  try {
    CheckpointReader reader(memorySource(b.data(), b.size(), "crafted.ckpt"));
    reader.verify();
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "";
}

TEST(CheckpointFormat, RoundTripsEveryKindOfEntry) {
  testing::TempDir dir;
  FileOps ops(fault::IoFaultInjector({}));
  auto sample = sampleCheckpoint(42, 1000);
  Layout written = testing::writeSample(ops, dir.file("c"), 42, 1000);
  CheckpointReader reader = CheckpointReader::open(dir.file("c"));
  EXPECT_EQ(reader.header().step, 42);
  EXPECT_EQ(reader.header().epoch, 4);
  EXPECT_EQ(reader.header().worldSize, 2u);
  EXPECT_EQ(reader.header().torchVersion, "1.13.0");
  ASSERT_EQ(reader.entries().size(), sample.data.size());
  reader.verify();
  for (size_t i = 0; i < sample.data.size(); ++i) {
    const Entry& e = reader.entries()[i];
    EXPECT_EQ(e.name, written.entries[i].name);
    EXPECT_EQ(e.checksum, written.entries[i].checksum);
    EXPECT_EQ(e.offset % kDataAlignment, 0u);
    Bytes out(e.size);
    reader.read(e, out.data());
    EXPECT_EQ(out, sample.data[i]) << e.name;
  }
  auto shards = reader.find("optimizer/opt/0.0/exp_avg");
  ASSERT_EQ(shards.size(), 2u);
  EXPECT_EQ(shards[0]->elementOffset, 0u);
  EXPECT_EQ(shards[1]->elementOffset, 5u);
  EXPECT_TRUE(shards[1]->isShard());
  EXPECT_EQ(reader.find("rank/1/rng/cpu")[0]->owner, 1u);
  // The same bytes for the same state: nothing uninitialised reaches the file.
  EXPECT_EQ(sampleFileBytes(42), sampleFileBytes(42));
}

TEST(CheckpointFormat, TruncationAtEverySixteenthIsRefusedNamingTheFile) {
  testing::TempDir dir;
  Bytes whole = sampleFileBytes(7, 3000);
  for (int k = 0; k < 16; ++k) {
    size_t size = whole.size() * k / 16;
    std::string path = dir.file("cut-" + std::to_string(k));
    testing::writeFile(path, std::string(whole.begin(), whole.begin() + size));
    std::string error = testing::verifyError(path);
    ASSERT_FALSE(error.empty()) << "accepted a file cut to " << size << " of " << whole.size();
    EXPECT_NE(error.find(path), std::string::npos) << error;
    EXPECT_NE(error.find("truncated"), std::string::npos) << error;
    EXPECT_NE(error.find(std::to_string(size)), std::string::npos) << error;
  }
  // One byte short, and one byte too many, are caught too.
  Bytes shorter(whole.begin(), whole.end() - 1), longer = whole;
  longer.push_back(0);
  EXPECT_NE(refusal(shorter).find("truncated"), std::string::npos);
  EXPECT_NE(refusal(longer).find("bytes follow the manifest"), std::string::npos);
}

TEST(CheckpointFormat, EverySingleByteFlipIsRefused) {
  const Bytes whole = sampleFileBytes(3, 300);
  CheckpointReader intact(memorySource(whole.data(), whole.size(), "intact"));
  for (size_t at = 0; at < whole.size(); ++at) {
    Bytes b = whole;
    b[at] ^= 0x20;
    std::string error = refusal(b);
    ASSERT_FALSE(error.empty()) << "a flip at byte " << at << " of " << whole.size() << " passed";
    EXPECT_NE(error.find("crafted.ckpt"), std::string::npos) << error;
    // A flip in an entry's data names that entry and where its data lies.
    for (const Entry& e : intact.entries()) {
      if (at >= e.offset && at < e.offset + e.size) {
        EXPECT_NE(error.find("\"" + e.name + "\""), std::string::npos) << at << ": " << error;
        EXPECT_NE(error.find("offset " + std::to_string(e.offset)), std::string::npos) << error;
      }
    }
  }
}

// readPart(): any byte range of an entry, from a file (read in chunks of 256 KiB, the wanted
// bytes straight into place) and from memory, equals that range of read()'s; and the checksum
// still covers the whole entry: a flip outside the range is refused, naming the entry.
TEST(CheckpointFormat, APartOfAnEntryIsReadExactlyAndTheWholeEntryChecked) {
  testing::TempDir dir;
  const Bytes whole = sampleFileBytes(3, 700000);  // entries over two chunks and a half
  const std::string path = dir.file("parts.ckpt");
  testing::writeFile(path, std::string(whole.begin(), whole.end()));
  const CheckpointReader fromFile = CheckpointReader::open(path);
  const CheckpointReader fromMemory(memorySource(whole.data(), whole.size(), "parts"));
  constexpr uint64_t kChunk = 256 << 10;
  int checked = 0;
  for (size_t i = 0; i < fromFile.entries().size(); ++i) {
    const Entry& e = fromFile.entries()[i];
    if (e.size < 3 * kChunk / 2) continue;
    Bytes all(e.size);
    fromFile.read(e, all.data());
    const std::pair<uint64_t, uint64_t> parts[] = {
        {0, e.size},      {0, 1},
        {1, e.size - 1},  {kChunk - 3, 10},
        {kChunk, kChunk}, {e.size / 3, 7},
        {e.size - 5, 5},  {e.size, 0},
        {5, 2 * kChunk},  {kChunk + 1, e.size - kChunk - 2}};
    for (const auto& [from, n] : parts) {
      for (const CheckpointReader* reader : {&fromFile, &fromMemory}) {
        Bytes part(n + 1, 0xAB);
        reader->readPart(reader->entries()[i], from, n, part.data());
        EXPECT_TRUE(std::equal(part.begin(), part.begin() + n, all.begin() + from))
            << e.name << " [" << from << ", " << from + n << ")";
        EXPECT_EQ(part[n], 0xAB) << e.name << ": wrote past [" << from << ", " << from + n << ")";
        ++checked;
      }
    }
    // A flip near the entry's end, outside [0, 10): the part is refused.
    Bytes damaged = whole;
    damaged[e.offset + e.size - 2] ^= 0x20;
    const std::string bad = dir.file("damaged.ckpt");
    testing::writeFile(bad, std::string(damaged.begin(), damaged.end()));
    Bytes part(10);
    try {
      CheckpointReader::open(bad).readPart(e, 0, 10, part.data());
      ADD_FAILURE() << e.name << ": a flip outside the part passed";
    } catch (const CheckpointError& error) {
      EXPECT_NE(std::string(error.what()).find("\"" + e.name + "\""), std::string::npos)
          << error.what();
      EXPECT_NE(std::string(error.what()).find("checksum mismatch"), std::string::npos)
          << error.what();
    }
    EXPECT_THROW(fromFile.readPart(e, e.size - 1, 2, part.data()), InvalidArgument);
  }
  EXPECT_GT(checked, 0) << "no entry of the sample spans two chunks";
}

struct Crafted {
  const char* name;
  void (*craft)(Bytes&);
  const char* mentions;
};

const Crafted kCrafted[] = {
    {"manifest size 2^64-1", [](Bytes& b) { setU(b, 80, UINT64_MAX, 8); }, "inconsistent regions"},
    {"data size 2^64-1", [](Bytes& b) { setU(b, 64, UINT64_MAX, 8); }, "inconsistent regions"},
    {"manifest offset past the end", [](Bytes& b) { setU(b, 72, 1ull << 40, 8); },
     "inconsistent regions"},
    {"entry count 2^64-1", [](Bytes& b) { setU(b, 88, UINT64_MAX, 8); }, "cannot fit"},
    {"world size 0", [](Bytes& b) { setU(b, 32, 0, 4); }, "world size 0"},
    {"unknown flags", [](Bytes& b) { setU(b, 36, 4, 4); }, "unknown flags"},
    {"format version 2", [](Bytes& b) { setU(b, 8, 2, 4); }, "format version 2"},
    {"data offset 2^64-1", [](Bytes& b) { setU(b, recordAt(b, 0) + 32, UINT64_MAX, 8); },
     "\"module/model/fc.weight\""},
    {"data size 2^64-1 in a record", [](Bytes& b) { setU(b, recordAt(b, 0) + 40, UINT64_MAX, 8); },
     "\"module/model/fc.weight\""},
    {"element count 2^64-1", [](Bytes& b) { setU(b, recordAt(b, 0) + 24, UINT64_MAX, 8); },
     "lie outside"},
    {"overlapping offsets",
     [](Bytes& b) { setU(b, recordAt(b, 1) + 32, getU(b, recordAt(b, 0) + 32, 8), 8); }, "overlap"},
    {"an empty entry between overlapping ones",
     [](Bytes& b) {
       // fc.weight (record 0, 200 bytes at 128) covers 128..328: "meta/empty" (record 7, no
       // bytes) moves to 192 and bn.num_batches_tracked (record 1) to 256, inside it. Each
       // neighbour pair has an empty side; only the furthest end seen so far shows the overlap.
       const uint64_t a = getU(b, recordAt(b, 0) + 32, 8);
       setU(b, recordAt(b, 7) + 32, a + 64, 8);
       setU(b, recordAt(b, 1) + 32, a + 128, 8);
     },
     "overlap"},
    {"misaligned offset",
     [](Bytes& b) { setU(b, recordAt(b, 1) + 32, getU(b, recordAt(b, 1) + 32, 8) + 8, 8); },
     "aligned"},
    {"shape overflow",
     [](Bytes& b) { setU(b, recordAt(b, 0) + kRecordFixedSize, uint64_t{1} << 62, 8); },
     "overflows"},
    {"negative dimension",
     [](Bytes& b) { setU(b, recordAt(b, 0) + kRecordFixedSize, static_cast<uint64_t>(-4), 8); },
     "overflows"},
    {"too many dimensions", [](Bytes& b) { b[recordAt(b, 0) + 4] = 200; }, "200 dimensions"},
    {"empty name", [](Bytes& b) { setU(b, recordAt(b, 0), 0, 2); }, "name length 0"},
    {"name longer than the manifest", [](Bytes& b) { setU(b, recordAt(b, 0), 4000, 2); },
     "runs past the manifest"},
    {"unknown kind", [](Bytes& b) { b[recordAt(b, 0) + 2] = 9; }, "unknown kind 9"},
    {"unknown dtype", [](Bytes& b) { b[recordAt(b, 0) + 3] = 77; }, "unknown dtype 77"},
    {"owner outside the world", [](Bytes& b) { setU(b, recordAt(b, 6) + 8, 2, 4); },
     "outside the world"},
    {"duplicate names",
     [](Bytes& b) {
       // "rank/1/rng/cpu" becomes a second replicated "scaler/s/scale" (same length).
       size_t r = recordAt(b, 6);
       std::memcpy(b.data() + r + kRecordFixedSize + 8 * b[r + 4], "scaler/s/scale", 14);
       setU(b, r + 8, kReplicated, 4);
     },
     "duplicate name"},
    {"shards that overlap", [](Bytes& b) { setU(b, recordAt(b, 5) + 16, 4, 8); }, "overlap"},
    {"a shard missing", [](Bytes& b) { setU(b, recordAt(b, 5) + 24, 6, 8); }, "exp_avg"},
};

TEST(CheckpointFormat, CraftedLengthsAndOffsetsAreRefusedBeforeAllocation) {
  const Bytes whole = sampleFileBytes(5, 200);
  for (const auto& c : kCrafted) {
    Bytes b = whole;
    c.craft(b);
    resign(b);
    std::string error = refusal(b);
    EXPECT_FALSE(error.empty()) << c.name << " was accepted";
    EXPECT_NE(error.find(c.mentions), std::string::npos) << c.name << ": " << error;
    EXPECT_NE(error.find("crafted.ckpt"), std::string::npos) << c.name << ": " << error;
  }
}

TEST(CheckpointFormat, ForeignFilesAreRefused) {
  auto expectRefused = [](const Bytes& b, const char* mentions) {
    std::string error = refusal(b);
    EXPECT_NE(error.find(mentions), std::string::npos) << error;
  };
  expectRefused({}, "truncated");
  Bytes zip(4096, 0);
  std::memcpy(zip.data(), "PK\x03\x04", 4);  // torch.save's archive
  expectRefused(zip, "not a dtrain checkpoint");
  std::mt19937_64 rng(1);
  Bytes noise(10000);
  for (auto& x : noise) x = static_cast<uint8_t>(rng());
  expectRefused(noise, "not a dtrain checkpoint");
  Bytes header = sampleFileBytes(1);
  header.resize(kHeaderSize);
  expectRefused(header, "truncated");
  // A directory or a missing file: named.
  testing::TempDir dir;
  EXPECT_NE(testing::verifyError(dir.path()).find("not a regular file"), std::string::npos);
  EXPECT_NE(testing::verifyError(dir.file("absent")).find("cannot open"), std::string::npos);
}

// A few random edits of `base`: flips, overwrites with extreme values, cuts and insertions; half
// of the results get their checksums recomputed, so they reach the checks behind them.
Bytes mutate(const Bytes& base, std::mt19937_64& rng) {
  Bytes b = base;
  int edits = 1 + static_cast<int>(rng() % 4);
  for (int k = 0; k < edits && !b.empty(); ++k) {
    size_t at = rng() % b.size();
    switch (rng() % 5) {
      case 0: b[at] ^= static_cast<uint8_t>(1u << (rng() % 8)); break;
      case 1:
        if (at + 8 <= b.size()) setU(b, at, (rng() % 2) ? UINT64_MAX : rng(), 8);
        break;
      case 2: b.resize(at); break;
      case 3:
        b.insert(b.begin() + static_cast<std::ptrdiff_t>(at), static_cast<uint8_t>(rng()));
        break;
      case 4: b[at] = 0; break;
    }
  }
  if (b.size() >= kHeaderSize && rng() % 2) resign(b);
  return b;
}

// Crafted inputs and seeded mutations of valid files, each through the fuzz target's function:
// a clean refusal or a file that keeps every promise, nothing else.
std::vector<std::pair<std::string, Bytes>> corpusCases() {
  std::vector<std::pair<std::string, Bytes>> cases;
  cases.emplace_back("valid-small", sampleFileBytes(1, 64));
  cases.emplace_back("valid-large", sampleFileBytes(9, 5000));
  for (const auto& c : kCrafted) {
    Bytes b = sampleFileBytes(5, 200);
    c.craft(b);
    resign(b);
    std::string name = std::string("crafted-") + c.name;
    for (auto& ch : name) ch = std::isalnum(static_cast<unsigned char>(ch)) ? ch : '-';
    cases.emplace_back(name, b);
  }
  std::mt19937_64 rng(7);
  const Bytes base = sampleFileBytes(3, 500);
  for (int i = 0; i < 12; ++i)
    cases.emplace_back("mutated-" + std::to_string(i), mutate(base, rng));
  return cases;
}

TEST(CheckpointFuzzCorpus, ReplaysTheCorpusAndSeededMutations) {
  // DTRAIN_CHECKPOINT_CORPUS_OUT=dir refreshes the committed seeds for scripts/fuzz.sh.
  if (const char* out = std::getenv("DTRAIN_CHECKPOINT_CORPUS_OUT")) {
    for (const auto& [name, bytes] : corpusCases()) {
      testing::writeFile(std::string(out) + "/" + name, std::string(bytes.begin(), bytes.end()));
    }
  }
  std::string corpus = testing::sourceDir() + "/tests/fuzz/corpus/checkpoint";
  int replayed = 0;
  if (DIR* d = ::opendir(corpus.c_str())) {
    while (struct dirent* ent = ::readdir(d)) {
      if (ent->d_name[0] == '.') continue;
      std::string bytes = testing::readFile(corpus + "/" + ent->d_name);
      fuzz::fuzzCheckpointReader(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
      ++replayed;
    }
    ::closedir(d);
  }
  EXPECT_GE(replayed, 20) << "the committed corpus is missing: " << corpus;
  for (const auto& [name, bytes] : corpusCases())
    fuzz::fuzzCheckpointReader(bytes.data(), bytes.size());
  // Mutations: flips, overwrites with extreme values, cuts and insertions, seeded.
  std::mt19937_64 rng(20240611);
  const Bytes base = sampleFileBytes(2, 300);
  for (int i = 0; i < 3000; ++i) {
    Bytes b = mutate(base, rng);
    fuzz::fuzzCheckpointReader(b.data(), b.size());
  }
}

// Owned shards (a sharded optimizer's ranges, Note [Sharded checkpoint files]): a file may hold
// some ranks' ranges only -- they need not tile the tensor -- but ranges of two ranks never
// overlap, and a name is never both replicated and sharded.
TEST(CheckpointFormat, OwnedShardsMayLeaveGapsButNeverOverlap) {
  testing::TempDir dir;
  FileOps ops(fault::IoFaultInjector({}));
  auto write = [&](const std::string& name, const std::vector<EntrySpec>& specs) {
    std::vector<std::vector<uint8_t>> bytes;
    EntryData data;
    for (const auto& spec : specs) {
      const uint64_t count = spec.elementCount ? spec.elementCount : 12;
      bytes.emplace_back(count * 4, static_cast<uint8_t>(bytes.size() + 1));
    }
    for (const auto& b : bytes) data.push_back(b.data());
    std::vector<uint8_t> scratch;
    Layout layout = planLayout(1, 0, 4, "1.13.0", specs);
    writeCheckpointFile(ops, dir.file(name), layout, data, scratch);
    return testing::verifyError(dir.file(name));
  };
  const std::string w = "optimizer/adam/fc.weight/exp_avg";
  // Ranks 0 and 2 of four: elements 0..3 and 6..9 of 12, a gap between and after.
  EXPECT_EQ(write("gaps", {{w, Kind::Tensor, DType::Float32, {3, 4}, 0, 0, 3},
                           {w, Kind::Tensor, DType::Float32, {3, 4}, 2, 6, 3}}),
            "");
  const std::string overlap = write("overlap",
                                    {{w, Kind::Tensor, DType::Float32, {3, 4}, 0, 0, 4},
                                     {w, Kind::Tensor, DType::Float32, {3, 4}, 1, 3, 4}});
  EXPECT_NE(overlap.find("the shard of rank 1 (elements 3..7) overlaps another rank's, which ends "
                         "at 4"),
            std::string::npos)
      << overlap;
  const std::string both = write("both", {{w, Kind::Tensor, DType::Float32, {3, 4}},
                                          {w, Kind::Tensor, DType::Float32, {3, 4}, 1, 3, 4}});
  EXPECT_NE(both.find("is both replicated and sharded"), std::string::npos) << both;
}

}  // namespace
}  // namespace dtrain::checkpoint::checkpoint_format_test
