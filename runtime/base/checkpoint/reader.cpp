// CheckpointReader: opens a checkpoint (a file or bytes in memory), checks its header, manifest and
// records against each other before handing anything out (Note [Checkpoint format] in format.h),
// and reads records with their checksums.
#include "checkpoint/format.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <numeric>
#include <string>

#include <fmt/format.h>
#include <xxhash.h>

#include "byte_layout.h"
#include "dtrain/base/error.h"

namespace dtrain::checkpoint {

namespace {

constexpr uint64_t kMaxElements = uint64_t{1} << 62;

// a + b without wrapping; false when it would.
bool addOk(uint64_t a, uint64_t b, uint64_t* out) {
  if (a > UINT64_MAX - b) return false;
  *out = a + b;
  return true;
}

bool knownDType(uint8_t code) { return code >= 1 && code <= 12; }
bool knownKind(uint8_t code) { return code >= 1 && code <= 4; }

// Note [Reading ahead]
// readPart() reads an entry in 256 KiB chunks, hashing each while it is in the CPU's cache. From
// the page cache that is the fastest way; from the device it is one synchronous request at a
// time, each waiting its latency, the kernel's readahead window (128 KiB by default) too small to
// hide it: a restore at 2 ranks from a file not in the page cache took 0.65 s where DCP's,
// reading each tensor in one call, took 0.32 s (dcp_bench, 705 MB). So the bytes are asked for
// first (posix_fadvise(WILLNEED)): the kernel queues their reads at once, and the chunks then
// find their pages arriving or arrived; a caller about to read many entries (a restoring rank's
// shard records, ShardAssembly::read) asks for all of them together, where the device gets the
// most requests at once (0.43 s against 0.52 s in 5 interleaved pairs against asking for 256 MiB
// at once and 64 MiB ahead of each entry's reads). Bounded by a quarter of MemAvailable at the
// open (readAheadBytes()), so that state larger than memory does not fill the page cache with
// pages evicted before they are read: readPart() asks for at most that much beyond the chunk it
// reads. Pages already cached cost a lookup each.

// A quarter of /proc/meminfo's MemAvailable, at least 64 MiB (256 MiB when it cannot be read).
uint64_t readAheadBudget() {
  constexpr uint64_t kLeast = uint64_t{64} << 20;
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit) {
    if (key == "MemAvailable:") return std::max(kLeast, kib * 1024 / 4);
  }
  return 4 * kLeast;
}

class FileSource : public ByteSource {
 public:
  FileSource(std::string path, int fd, uint64_t size)
      : path_(std::move(path)), fd_(fd), size_(size) {}
  ~FileSource() override { ::close(fd_); }
  uint64_t size() const override { return size_; }
  const std::string& name() const override { return path_; }
  void willRead(uint64_t offset, uint64_t size) const override {
    // See Note [Reading ahead]. Only a hint: an error changes nothing that follows.
    (void)::posix_fadvise(fd_, static_cast<off_t>(offset), static_cast<off_t>(size),
                          POSIX_FADV_WILLNEED);
  }
  void readAt(uint64_t offset, void* out, size_t size) const override {
    auto* p = static_cast<char*>(out);
    size_t done = 0;
    while (done < size) {
      ssize_t n = ::pread(fd_, p + done, size - done, static_cast<off_t>(offset + done));
      if (n < 0 && errno == EINTR) continue;
      DTRAIN_CHECK_T(CheckpointError, n >= 0,
                     "checkpoint {}: read of {} bytes at offset {} failed: {}", path_, size,
                     offset + done, std::strerror(errno));
      DTRAIN_CHECK_T(
          CheckpointError, n > 0,
          "checkpoint {}: truncated: expected {} bytes at offset {}, the file ends at {}", path_,
          size, offset, offset + done);
      done += static_cast<size_t>(n);
    }
  }

 private:
  std::string path_;
  int fd_;
  uint64_t size_;
};

class MemorySource : public ByteSource {
 public:
  MemorySource(const uint8_t* data, size_t size, std::string name)
      : data_(data), size_(size), name_(std::move(name)) {}
  uint64_t size() const override { return size_; }
  const std::string& name() const override { return name_; }
  const uint8_t* memory() const override { return data_; }
  void readAt(uint64_t offset, void* out, size_t size) const override {
    DTRAIN_CHECK_T(CheckpointError, offset <= size_ && size <= size_ - offset,
                   "checkpoint {}: truncated: expected {} bytes at offset {}, it ends at {}", name_,
                   size, offset, size_);
    if (size) std::memcpy(out, data_ + offset, size);
  }

 private:
  const uint8_t* data_;
  size_t size_;
  std::string name_;
};

// One record on its own: its elements, data size, place in the data region, owner and kind.
void checkRecord(const std::string& file, const Header& hd, const Entry& e, size_t i) {
  const uint64_t dataEnd = hd.dataOffset + hd.dataSize;
  std::string who = fmt::format("checkpoint {}: entry \"{}\" (record {})", file,
                                e.name.substr(0, 200), i);
  uint64_t numel = e.numel();
  uint64_t end = 0;
  DTRAIN_CHECK_T(CheckpointError, addOk(e.elementOffset, e.elementCount, &end) && end <= numel,
                 "{}: elements {}+{} lie outside its {} elements", who, e.elementOffset,
                 e.elementCount, numel);
  size_t elem = dtypeSize(e.dtype);
  DTRAIN_CHECK_T(CheckpointError,
                 e.elementCount <= kMaxElements / elem && e.size == e.elementCount * elem,
                 "{}: {} bytes of data for {} elements of {}", who, e.size, e.elementCount,
                 dtypeName(e.dtype));
  DTRAIN_CHECK_T(CheckpointError,
                 e.offset >= hd.dataOffset && e.offset % kDataAlignment == 0 &&
                     addOk(e.offset, e.size, &end) && end <= dataEnd,
                 "{}: data at offset {} ({} bytes) lies outside the data region {}..{} or is not "
                 "{}-byte aligned",
                 who, e.offset, e.size, hd.dataOffset, dataEnd, kDataAlignment);
  DTRAIN_CHECK_T(CheckpointError, e.owner == kReplicated || e.owner < hd.worldSize,
                 "{}: owner rank {} is outside the world of {}", who, e.owner, hd.worldSize);
  switch (e.kind) {
    case Kind::String:
    case Kind::Bytes:
      DTRAIN_CHECK_T(CheckpointError, e.dtype == DType::UInt8 && e.shape.size() == 1,
                     "{}: a {} must be a 1-dimensional uint8 entry", who, kindName(e.kind));
      break;
    case Kind::Number:
      DTRAIN_CHECK_T(CheckpointError,
                     (e.dtype == DType::Float64 || e.dtype == DType::Int64) && e.shape.empty(),
                     "{}: a number must be a 0-dim float64 or int64", who);
      break;
    case Kind::Tensor: break;
  }
}

// No two records' data overlap. Sorted by offset, each non-empty record must start at or after
// the furthest end of the non-empty records before it: comparing neighbours alone lets an empty
// record between two overlapping ones hide the overlap.
void checkNoOverlap(const std::string& file, const std::vector<Entry>& entries) {
  std::vector<size_t> order(entries.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return entries[a].offset < entries[b].offset; });
  const Entry* furthest = nullptr;  // the non-empty record that ends last so far
  for (size_t k : order) {
    const Entry& cur = entries[k];
    if (cur.size == 0) continue;
    DTRAIN_CHECK_T(
        CheckpointError, furthest == nullptr || furthest->offset + furthest->size <= cur.offset,
        "checkpoint {}: entries \"{}\" (offset {}, {} bytes) and \"{}\" (offset {}) overlap", file,
        furthest ? furthest->name.substr(0, 200) : "", furthest ? furthest->offset : 0,
        furthest ? furthest->size : 0, cur.name.substr(0, 200), cur.offset);
    if (furthest == nullptr || cur.offset + cur.size > furthest->offset + furthest->size) {
      furthest = &cur;
    }
  }
}

// Names are unique per owner, except shards. Replicated shards (owner kReplicated) must tile their
// tensor exactly. Owned tensors are shards -- one rank's range of a sharded tensor, Note [Sharded
// checkpoint files], which may be the whole tensor -- and need not: a file holds the ranges of
// some ranks only; across owners they must agree
// on kind, dtype and shape and never overlap (whether the ranks' files together cover the tensor
// is the restore's question).
void checkShards(const std::string& file, const std::vector<Entry>& entries) {
  std::map<std::pair<std::string, uint32_t>, std::vector<size_t>> byName;
  std::map<std::string, std::vector<size_t>> owned;
  for (size_t i = 0; i < entries.size(); ++i) {
    if (entries[i].owner != kReplicated && entries[i].kind == Kind::Tensor) {
      owned[entries[i].name].push_back(i);
    } else {
      byName[{entries[i].name, entries[i].owner}].push_back(i);
    }
  }
  auto sameKind = [&](const Entry& e, const Entry& first, const std::string& name, size_t n) {
    DTRAIN_CHECK_T(CheckpointError,
                   e.kind == first.kind && e.dtype == first.dtype && e.shape == first.shape &&
                       e.elementCount > 0,
                   "checkpoint {}: entry \"{}\" appears {} times with different kinds, dtypes or "
                   "shapes (duplicate name)",
                   file, name.substr(0, 200), n);
  };
  auto byOffset = [&](std::vector<size_t>& idx) {
    std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) {
      return entries[a].elementOffset < entries[b].elementOffset;
    });
  };
  for (auto& [key, idx] : byName) {
    const Entry& first = entries[idx.front()];
    if (idx.size() == 1 && !first.isShard()) continue;
    byOffset(idx);
    uint64_t next = 0;
    for (size_t i : idx) {
      const Entry& e = entries[i];
      sameKind(e, first, key.first, idx.size());
      DTRAIN_CHECK_T(CheckpointError, e.elementOffset == next,
                     "checkpoint {}: entry \"{}\": shards {} elements {}, expected the next at {} "
                     "(duplicate name, overlapping or missing shard)",
                     file, key.first.substr(0, 200),
                     e.elementOffset < next ? "overlap at" : "skip to", e.elementOffset, next);
      next += e.elementCount;
    }
    DTRAIN_CHECK_T(CheckpointError, next == first.numel(),
                   "checkpoint {}: entry \"{}\": its shards hold {} of {} elements", file,
                   key.first.substr(0, 200), next, first.numel());
  }
  for (auto& [name, idx] : owned) {
    const Entry& first = entries[idx.front()];
    DTRAIN_CHECK_T(CheckpointError, !byName.count({name, kReplicated}),
                   "checkpoint {}: entry \"{}\" is both replicated and sharded", file,
                   name.substr(0, 200));
    byOffset(idx);
    uint64_t next = 0;
    for (size_t i : idx) {
      const Entry& e = entries[i];
      sameKind(e, first, name, idx.size());
      DTRAIN_CHECK_T(CheckpointError, e.elementOffset >= next,
                     "checkpoint {}: entry \"{}\": the shard of rank {} (elements {}..{}) overlaps "
                     "another rank's, which ends at {}",
                     file, name.substr(0, 200), e.owner, e.elementOffset,
                     e.elementOffset + e.elementCount, next);
      next = e.elementOffset + e.elementCount;
    }
  }
}

}  // namespace

std::unique_ptr<ByteSource> openFileSource(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  DTRAIN_CHECK_T(CheckpointError, fd >= 0, "checkpoint {}: cannot open: {}", path,
                 std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    int err = errno;
    ::close(fd);
    DTRAIN_THROW(CheckpointError, "checkpoint {}: not a regular file{}", path,
                 err ? std::string(": ") + std::strerror(err) : "");
  }
  return std::make_unique<FileSource>(path, fd, static_cast<uint64_t>(st.st_size));
}

std::unique_ptr<ByteSource> memorySource(const uint8_t* data, size_t size, std::string name) {
  return std::make_unique<MemorySource>(data, size, std::move(name));
}

CheckpointReader::CheckpointReader(std::unique_ptr<ByteSource> source)
    : source_(std::move(source)) {
  parseHeader();
  parseManifest();
  checkEntries();
  if (!source_->memory()) readAhead_ = readAheadBudget();
}

CheckpointReader CheckpointReader::open(const std::string& path) {
  return CheckpointReader(openFileSource(path));
}

void CheckpointReader::parseHeader() {
  const std::string& file = source_->name();
  uint64_t size = source_->size();
  DTRAIN_CHECK_T(CheckpointError, size >= kHeaderSize,
                 "checkpoint {}: truncated: {} bytes, shorter than the {}-byte header", file, size,
                 kHeaderSize);
  uint8_t h[kHeaderSize];
  source_->readAt(0, h, kHeaderSize);
  DTRAIN_CHECK_T(CheckpointError, std::memcmp(h, kMagic, sizeof(kMagic)) == 0,
                 "checkpoint {}: not a dtrain checkpoint (bad magic at offset 0)", file);
  uint64_t version = getLE(h + 8, 4);
  DTRAIN_CHECK_T(CheckpointError, version == kFormatVersion,
                 "checkpoint {}: format version {} at offset 8 is not supported (this build reads "
                 "version {}). HINT: read it with the dtrain version that wrote it",
                 file, version, kFormatVersion);
  DTRAIN_CHECK_T(CheckpointError, getLE(h + 120, 8) == checksum(h, 120),
                 "checkpoint {}: header checksum mismatch (offset 120): the header is damaged",
                 file);
  DTRAIN_CHECK_T(CheckpointError, getLE(h + 12, 4) == kHeaderSize,
                 "checkpoint {}: header size {} at offset 12, expected {}", file, getLE(h + 12, 4),
                 kHeaderSize);
  Header& hd = header_;
  hd.step = static_cast<int64_t>(getLE(h + 16, 8));
  hd.epoch = static_cast<int64_t>(getLE(h + 24, 8));
  hd.worldSize = static_cast<uint32_t>(getLE(h + 32, 4));
  uint64_t flags = getLE(h + 36, 4);
  const char* tv = reinterpret_cast<const char*>(h + 40);
  hd.torchVersion.assign(tv, strnlen(tv, 16));
  hd.dataOffset = getLE(h + 56, 8);
  hd.dataSize = getLE(h + 64, 8);
  hd.manifestOffset = getLE(h + 72, 8);
  hd.manifestSize = getLE(h + 80, 8);
  hd.entryCount = getLE(h + 88, 8);
  hd.manifestChecksum = getLE(h + 96, 8);
  hd.fileSize = getLE(h + 104, 8);
  DTRAIN_CHECK_T(CheckpointError, hd.step >= 0 && hd.epoch >= 0,
                 "checkpoint {}: negative step {} or epoch {} (offset 16)", file, hd.step,
                 hd.epoch);
  DTRAIN_CHECK_T(CheckpointError, hd.worldSize >= 1, "checkpoint {}: world size 0 (offset 32)",
                 file);
  DTRAIN_CHECK_T(CheckpointError, flags == 0, "checkpoint {}: unknown flags {:#x} (offset 36)",
                 file, flags);
  DTRAIN_CHECK_T(CheckpointError, getLE(h + 112, 8) == 0,
                 "checkpoint {}: reserved field at offset 112 is not 0", file);
  DTRAIN_CHECK_T(CheckpointError, hd.fileSize == size || hd.fileSize > size,
                 "checkpoint {}: {} bytes, but its header says {}: bytes follow the manifest", file,
                 size, hd.fileSize);
  DTRAIN_CHECK_T(CheckpointError, hd.fileSize == size,
                 "checkpoint {}: truncated: expected {} bytes, got {}", file, hd.fileSize, size);
  uint64_t dataEnd = 0, manifestEnd = 0;
  DTRAIN_CHECK_T(CheckpointError,
                 hd.dataOffset == kHeaderSize && addOk(hd.dataOffset, hd.dataSize, &dataEnd) &&
                     hd.manifestOffset == dataEnd &&
                     addOk(hd.manifestOffset, hd.manifestSize, &manifestEnd) &&
                     manifestEnd == hd.fileSize,
                 "checkpoint {}: inconsistent regions: data {}+{}, manifest {}+{}, file size {} "
                 "(header offsets 56..111)",
                 file, hd.dataOffset, hd.dataSize, hd.manifestOffset, hd.manifestSize, hd.fileSize);
  DTRAIN_CHECK_T(CheckpointError, hd.manifestSize <= kMaxManifestBytes,
                 "checkpoint {}: manifest of {} bytes (offset 80) is over the {}-byte limit", file,
                 hd.manifestSize, kMaxManifestBytes);
  DTRAIN_CHECK_T(CheckpointError, hd.entryCount <= hd.manifestSize / kRecordFixedSize,
                 "checkpoint {}: {} entries (offset 88) cannot fit a {}-byte manifest", file,
                 hd.entryCount, hd.manifestSize);
}

void CheckpointReader::parseManifest() {
  const std::string& file = source_->name();
  const Header& hd = header_;
  std::vector<uint8_t> m(hd.manifestSize);
  source_->readAt(hd.manifestOffset, m.data(), m.size());
  DTRAIN_CHECK_T(CheckpointError, checksum(m.data(), m.size()) == hd.manifestChecksum,
                 "checkpoint {}: manifest checksum mismatch (manifest at offset {}, {} bytes): the "
                 "manifest is damaged",
                 file, hd.manifestOffset, hd.manifestSize);
  size_t at = 0;
  entries_.reserve(hd.entryCount);
  for (uint64_t i = 0; i < hd.entryCount; ++i) {
    uint64_t where = hd.manifestOffset + at;
    DTRAIN_CHECK_T(CheckpointError, m.size() - at >= kRecordFixedSize,
                   "checkpoint {}: manifest record {} at offset {} runs past the manifest's end",
                   file, i, where);
    const uint8_t* r = m.data() + at;
    Entry e;
    uint64_t nameLen = getLE(r, 2);
    uint8_t kind = r[2], dtype = r[3], ndim = r[4];
    DTRAIN_CHECK_T(CheckpointError, nameLen >= 1 && nameLen <= kMaxNameBytes,
                   "checkpoint {}: manifest record {} at offset {}: name length {} (1..{})", file,
                   i, where, nameLen, kMaxNameBytes);
    DTRAIN_CHECK_T(CheckpointError, ndim <= kMaxDims,
                   "checkpoint {}: manifest record {} at offset {}: {} dimensions (at most {})",
                   file, i, where, ndim, kMaxDims);
    uint64_t recordSize = roundUp(kRecordFixedSize + 8 * uint64_t{ndim} + nameLen, 8);
    DTRAIN_CHECK_T(CheckpointError, recordSize <= m.size() - at,
                   "checkpoint {}: manifest record {} at offset {} ({} bytes) runs past the "
                   "manifest's end",
                   file, i, where, recordSize);
    const char* name = reinterpret_cast<const char*>(r + kRecordFixedSize + 8 * ndim);
    e.name.assign(name, nameLen);
    std::string who = fmt::format("checkpoint {}: entry \"{}\" (manifest record {} at offset {})",
                                  file, e.name.substr(0, 200), i, where);
    DTRAIN_CHECK_T(CheckpointError, e.name.find('\0') == std::string::npos, "{}: NUL in the name",
                   who);
    DTRAIN_CHECK_T(CheckpointError, knownKind(kind), "{}: unknown kind {}", who, kind);
    DTRAIN_CHECK_T(CheckpointError, knownDType(dtype), "{}: unknown dtype {}", who, dtype);
    DTRAIN_CHECK_T(CheckpointError, r[5] == 0 && r[6] == 0 && r[7] == 0 && getLE(r + 12, 4) == 0,
                   "{}: reserved bytes are not 0", who);
    e.kind = static_cast<Kind>(kind);
    e.dtype = static_cast<DType>(dtype);
    e.owner = static_cast<uint32_t>(getLE(r + 8, 4));
    e.elementOffset = getLE(r + 16, 8);
    e.elementCount = getLE(r + 24, 8);
    e.offset = getLE(r + 32, 8);
    e.size = getLE(r + 40, 8);
    e.checksum = getLE(r + 48, 8);
    uint64_t numel = 1;
    for (uint8_t d = 0; d < ndim; ++d) {
      uint64_t dim = getLE(r + kRecordFixedSize + 8 * d, 8);
      DTRAIN_CHECK_T(CheckpointError,
                     dim < kMaxElements && (dim == 0 || numel <= kMaxElements / dim),
                     "{}: shape dimension {} = {} overflows", who, d, static_cast<int64_t>(dim));
      numel *= dim;
      e.shape.push_back(static_cast<int64_t>(dim));
    }
    // Padding after the name must be zero: one encoding per manifest.
    for (uint64_t p = kRecordFixedSize + 8 * ndim + nameLen; p < recordSize; ++p) {
      DTRAIN_CHECK_T(CheckpointError, r[p] == 0, "{}: padding byte at offset {} is not 0", who,
                     where + p);
    }
    entries_.push_back(std::move(e));
    at += recordSize;
  }
  DTRAIN_CHECK_T(CheckpointError, at == m.size(),
                 "checkpoint {}: {} bytes follow the last of {} manifest records", file,
                 m.size() - at, hd.entryCount);
}

void CheckpointReader::checkEntries() {
  const std::string& file = source_->name();
  for (size_t i = 0; i < entries_.size(); ++i) checkRecord(file, header_, entries_[i], i);
  checkNoOverlap(file, entries_);
  checkShards(file, entries_);
}

std::vector<const Entry*> CheckpointReader::find(const std::string& name) const {
  std::vector<const Entry*> out;
  for (const auto& e : entries_) {
    if (e.name == name) out.push_back(&e);
  }
  std::sort(out.begin(), out.end(),
            [](const Entry* a, const Entry* b) { return a->elementOffset < b->elementOffset; });
  return out;
}

void CheckpointReader::read(const Entry& e, void* out) const { readPart(e, 0, e.size, out); }

void CheckpointReader::readPart(const Entry& e, uint64_t from, uint64_t n, void* out) const {
  DTRAIN_CHECK_ARG(from <= e.size && n <= e.size - from && (out || n == 0),
                   "CheckpointReader::readPart: bytes [{}, {}) of entry \"{}\" ({} bytes)", from,
                   from + n, e.name, e.size);
  uint64_t sum = 0;
  if (const uint8_t* mem = source_->memory()) {
    sum = checksum(mem + e.offset, e.size);
    if (n) std::memcpy(out, mem + e.offset + from, n);
  } else {
    // In chunks, each hashed while it is still in the CPU's cache: the wanted bytes read into
    // place, the others through a buffer of kChunk bytes; the bytes ahead asked for as it goes
    // (Note [Reading ahead]).
    constexpr uint64_t kChunk = 256 << 10;
    std::vector<uint8_t> buffer;
    auto* into = static_cast<uint8_t*>(out);
    std::unique_ptr<XXH3_state_t, XXH_errorcode (*)(XXH3_state_t*)> state(XXH3_createState(),
                                                                          XXH3_freeState);
    XXH3_64bits_reset(state.get());
    uint64_t asked = 0;  // bytes of the entry asked for ahead (Note [Reading ahead])
    for (uint64_t done = 0; done < e.size;) {
      if (asked < e.size && done + readAhead_ / 2 >= asked) {
        const uint64_t ask = std::min(readAhead_, e.size - asked);
        source_->willRead(e.offset + asked, ask);
        asked += ask;
      }
      uint64_t len = std::min(kChunk, e.size - done);
      uint8_t* at = nullptr;
      if (done >= from && done < from + n) {
        len = std::min(len, from + n - done);
        at = into + (done - from);
      } else {
        if (done < from) len = std::min(len, from - done);
        buffer.resize(static_cast<size_t>(std::min(kChunk, e.size)));
        at = buffer.data();
      }
      source_->readAt(e.offset + done, at, static_cast<size_t>(len));
      XXH3_64bits_update(state.get(), at, static_cast<size_t>(len));
      done += len;
    }
    sum = XXH3_64bits_digest(state.get());
  }
  DTRAIN_CHECK_T(
      CheckpointError, sum == e.checksum,
      "checkpoint {}: entry \"{}\" (data at offset {}, {} bytes): checksum mismatch: the "
      "data is damaged",
      source_->name(), e.name, e.offset, e.size);
}

void CheckpointReader::verify() const {
  for (const auto& e : entries_) readPart(e, 0, 0, nullptr);  // each byte hashed, none kept
  // The bytes between entries (alignment padding) are no entry's: they must be zero, so that
  // no byte of the file escapes a check.
  std::vector<const Entry*> order;
  for (const auto& e : entries_) order.push_back(&e);
  std::sort(order.begin(), order.end(),
            [](const Entry* a, const Entry* b) { return a->offset < b->offset; });
  uint64_t pos = header_.dataOffset;
  const uint64_t end = header_.dataOffset + header_.dataSize;
  constexpr uint64_t kChunk = 8 << 20;
  std::vector<uint8_t> buffer;
  auto checkZero = [&](uint64_t from, uint64_t to, const Entry* after) {
    while (from < to) {
      size_t n = static_cast<size_t>(std::min<uint64_t>(to - from, kChunk));
      buffer.resize(std::max(buffer.size(), n));
      source_->readAt(from, buffer.data(), n);
      for (size_t i = 0; i < n; ++i) {
        DTRAIN_CHECK_T(CheckpointError, buffer[i] == 0,
                       "checkpoint {}: byte {} (padding {}) is not zero: the file is damaged",
                       source_->name(), from + i,
                       after ? fmt::format("after entry \"{}\"", after->name)
                             : "before the first entry");
      }
      from += n;
    }
  };
  const Entry* previous = nullptr;
  for (const Entry* e : order) {
    if (e->offset > pos) checkZero(pos, e->offset, previous);
    pos = std::max(pos, e->offset + e->size);
    previous = e;
  }
  checkZero(pos, end, previous);
}

}  // namespace dtrain::checkpoint
