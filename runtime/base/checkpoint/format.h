#pragma once
// The checkpoint file format: its constants, the layout a writer computes, and the reader that
// validates a file before anything of it is trusted. Torch-free, so the `checkpoint` tool's
// verify, the fuzz target and the torch layer share one parser. See Note [Checkpoint format].
//
// Note [Checkpoint format]
// One file per checkpoint and node: `step-<N>` (docs/design.md, "Checkpoints"). Every integer is
// little-endian. Three regions, in this order in the file:
//
//   header    128 bytes at offset 0
//   data      the entries' bytes, each starting at a multiple of 64
//   manifest  one record per entry, after the data
//
// Header:
//   offset size field
//        0    8 magic "DTRAINCK"
//        8    4 format version (1)
//       12    4 header size (128)
//       16    8 step (int64 >= 0)
//       24    8 epoch (int64 >= 0)
//       32    4 world size of the job that wrote it (uint32 >= 1)
//       36    4 flags (0; a reader refuses bits it does not know)
//       40   16 libtorch version of the writer, ASCII, NUL-padded (informational)
//       56    8 data offset (128)
//       64    8 data size
//       72    8 manifest offset (= data offset + data size)
//       80    8 manifest size
//       88    8 entry count
//       96    8 XXH3-64 of the manifest
//      104    8 file size (= manifest offset + manifest size: nothing may follow)
//      112    8 reserved (0)
//      120    8 XXH3-64 of header bytes 0..119
//
// Manifest record (8-byte aligned, one after another):
//   offset    size    field
//        0       2    name length L (1..kMaxNameBytes)
//        2       1    kind: 1 tensor, 2 string (UTF-8), 3 bytes (opaque), 4 number (0-dim
//                     tensor of float64 or int64)
//        3       1    dtype (DType below; uint8 for strings and bytes)
//        4       1    ndim (0..kMaxDims)
//        5       3    reserved (0)
//        8       4    owner: the rank whose own state this is, kReplicated for state every
//                     rank shares
//       12       4    reserved (0)
//       16       8    element offset: the first element of the full tensor this record holds
//       24       8    element count this record holds
//       32       8    data offset (absolute, a multiple of 64, inside the data region)
//       40       8    data size in bytes (element count x element size)
//       48       8    XXH3-64 of the data
//       56  8*ndim    shape of the full tensor (int64 >= 0)
//        .       L    name (no NUL), then zero padding to a multiple of 8
//
// A tensor is normally one record (element offset 0, all its elements). Several records with
// one name are shards of it, each holding a contiguous range of its flattened elements: they
// must agree on kind, dtype and shape. Replicated shards tile the tensor exactly; owned shards
// (a sharded optimizer's ranges, owner = the rank that held them) never overlap, and one file
// holds those of some ranks only (Note [Sharded checkpoint files] in the torch layer).
//
// What a reader checks before it allocates or trusts anything (CheckpointReader::open): the
// header's checksum, magic, version and sizes; that every region lies inside the file and the
// regions follow each other exactly; the manifest's size against a cap and the file, then its
// checksum; every record's lengths, kind, dtype, rank, shape (no overflow), that its data lies
// inside the data region, is aligned and overlaps no other record's, and that names are unique
// (shards aside). The data's own checksums are checked when an entry is read (read()) or by
// verify(), which also checks that the padding between entries is zero, so that no byte of a
// file escapes a check. Nothing in a file is ever executed or deserialised into objects.

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dtrain::checkpoint {

constexpr char kMagic[8] = {'D', 'T', 'R', 'A', 'I', 'N', 'C', 'K'};
constexpr uint32_t kFormatVersion = 1;
constexpr uint64_t kHeaderSize = 128;
constexpr uint64_t kDataAlignment = 64;
constexpr uint64_t kRecordFixedSize = 56;
constexpr uint32_t kMaxNameBytes = 4096;
constexpr uint32_t kMaxDims = 16;
constexpr uint32_t kReplicated = 0xFFFFFFFFu;
// A manifest larger than this is refused before it is read (about 1M small entries).
constexpr uint64_t kMaxManifestBytes = uint64_t{256} << 20;

enum class Kind : uint8_t { Tensor = 1, String = 2, Bytes = 3, Number = 4 };

// Stable codes of the file format (not torch's ScalarType numbering).
enum class DType : uint8_t {
  Float32 = 1,
  Float64 = 2,
  Float16 = 3,
  BFloat16 = 4,
  Int8 = 5,
  UInt8 = 6,
  Int16 = 7,
  Int32 = 8,
  Int64 = 9,
  Bool = 10,
  Complex64 = 11,
  Complex128 = 12,
};

// 0 for an unknown code.
size_t dtypeSize(DType dtype);
const char* dtypeName(DType dtype);
const char* kindName(Kind kind);

struct Header {
  int64_t step = 0;
  int64_t epoch = 0;
  uint32_t worldSize = 1;
  std::string torchVersion;
  uint64_t dataOffset = kHeaderSize;
  uint64_t dataSize = 0;
  uint64_t manifestOffset = 0;
  uint64_t manifestSize = 0;
  uint64_t entryCount = 0;
  uint64_t manifestChecksum = 0;
  uint64_t fileSize = 0;
};

struct Entry {
  std::string name;
  Kind kind = Kind::Tensor;
  DType dtype = DType::Float32;
  std::vector<int64_t> shape;
  uint32_t owner = kReplicated;
  uint64_t elementOffset = 0;
  uint64_t elementCount = 0;
  uint64_t offset = 0;  // in the file
  uint64_t size = 0;    // bytes
  uint64_t checksum = 0;

  // Elements of the full tensor (the product of shape; 1 for a 0-dim tensor).
  uint64_t numel() const;
  bool isShard() const;
  // "tensor model/fc1.weight float32 [16, 8]"
  std::string describe() const;
};

// What a writer declares for one entry; the layout assigns the offsets.
struct EntrySpec {
  std::string name;
  Kind kind = Kind::Tensor;
  DType dtype = DType::Float32;
  std::vector<int64_t> shape;
  uint32_t owner = kReplicated;
  uint64_t elementOffset = 0;
  uint64_t elementCount = 0;  // 0 with shape given: the whole tensor
};

// Offsets of a file about to be written: Entry records with offsets and sizes (checksums 0 until
// the data is written). Throws InvalidArgument for a spec the format cannot hold.
struct Layout {
  Header header;
  std::vector<Entry> entries;
};
Layout planLayout(int64_t step, int64_t epoch, uint32_t worldSize, const std::string& torchVersion,
                  const std::vector<EntrySpec>& specs);

// The manifest and header bytes for `layout` once every entry's checksum is filled in (the
// header's manifest checksum and file size are set here).
std::vector<uint8_t> encodeManifest(const std::vector<Entry>& entries);
std::vector<uint8_t> encodeHeader(Header& header, const std::vector<uint8_t>& manifest);

// XXH3-64, the checksum of every region.
uint64_t checksum(const void* data, size_t size);

// Where a reader gets bytes: a file (pread) or memory (the fuzz target, tests).
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  virtual uint64_t size() const = 0;
  // Reads exactly `size` bytes at `offset`; throws CheckpointError (naming the source) when the
  // source is shorter or the read fails.
  virtual void readAt(uint64_t offset, void* out, size_t size) const = 0;
  virtual const std::string& name() const = 0;
  // A pointer to the bytes when they are in memory already (no copy needed); null for files.
  virtual const uint8_t* memory() const { return nullptr; }
  // A hint that `size` bytes at `offset` are read next: a file asks the kernel to start reading
  // them all at once (Note [Reading ahead], reader.cpp). Never fails.
  virtual void willRead(uint64_t /*offset*/, uint64_t /*size*/) const {}
};

std::unique_ptr<ByteSource> openFileSource(const std::string& path);
std::unique_ptr<ByteSource> memorySource(const uint8_t* data, size_t size, std::string name);

class CheckpointReader {
 public:
  // Validates the header and the manifest (Note [Checkpoint format]); throws CheckpointError
  // naming the file, the field or entry and its offset.
  explicit CheckpointReader(std::unique_ptr<ByteSource> source);
  static CheckpointReader open(const std::string& path);

  const Header& header() const { return header_; }
  const std::vector<Entry>& entries() const { return entries_; }
  const std::string& name() const { return source_->name(); }
  // The records named `name` (several for a sharded tensor), in element order; empty when none.
  std::vector<const Entry*> find(const std::string& name) const;

  // Reads one record's bytes into `out` (entry.size bytes) and checks its checksum: throws
  // CheckpointError naming file, entry and offset on a mismatch.
  void read(const Entry& entry, void* out) const;
  // Bytes [from, from + n) of one record into `out` (n bytes), its checksum checked over the
  // whole record as read() does -- through a small buffer, so the rest costs no memory.
  void readPart(const Entry& entry, uint64_t from, uint64_t n, void* out) const;
  // A hint that the first `n` bytes of `entry` (at most all of it) are read soon
  // (ByteSource::willRead): a caller that reads many asks for them together, up to
  // readAheadBytes() in all (Note [Reading ahead], reader.cpp).
  void willRead(const Entry& entry, uint64_t n) const {
    source_->willRead(entry.offset, std::min(n, entry.size));
  }
  // The most a reader asks for ahead of what it has read: a quarter of the memory available
  // when the reader was opened (Note [Reading ahead]).
  uint64_t readAheadBytes() const { return readAhead_; }
  // Checks every record's checksum (reading through a bounded buffer); throws naming the first
  // bad entry.
  void verify() const;
  const ByteSource& source() const { return *source_; }

 private:
  void parseHeader();
  void parseManifest();
  void checkEntries();

  std::unique_ptr<ByteSource> source_;
  Header header_;
  std::vector<Entry> entries_;
  uint64_t readAhead_ = 0;
};

}  // namespace dtrain::checkpoint
