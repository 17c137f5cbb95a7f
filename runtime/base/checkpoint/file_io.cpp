#include "checkpoint/file_io.h"

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>
#include <thread>

#include <fmt/format.h>

#include "dtrain/base/error.h"
#include "dtrain/base/logging.h"
#include "parse_int.h"

namespace dtrain::checkpoint {

namespace {

constexpr const char* kTmpSuffix = ".tmp";
constexpr const char* kStepPrefix = "step-";
constexpr const char* kLatest = "LATEST";

std::string errnoText(int error) {
  return fmt::format("{} ({})", std::strerror(error), fault::errnoName(error));
}

std::string hintFor(int error) {
  switch (error) {
    case ENOSPC:
    case EDQUOT:
      return " HINT: the disk is full; free space or lower keepLast. Earlier checkpoints are "
             "intact";
    case EIO:
      return " HINT: the device reported an I/O error; check the disk. Earlier checkpoints are "
             "intact";
    case EROFS: return " HINT: the filesystem is read-only";
    case EACCES:
    case EPERM: return " HINT: check the directory's permissions";
    default: return "";
  }
}

bool parseStep(const std::string& digits, int64_t* step) {
  if (digits.empty() || digits.size() > 18) return false;
  for (char c : digits) {
    if (c < '0' || c > '9') return false;
  }
  return parseInt64(digits, step) && *step >= 0;
}

// Whether `path` (a regular file of ours by name) is one of our temporaries by content.
bool ownedTemporary(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid()) {
    return false;
  }
  if (st.st_size < static_cast<off_t>(sizeof(kMagic))) return true;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char head[sizeof(kMagic)];
  ssize_t n = ::pread(fd, head, sizeof(head), 0);
  ::close(fd);
  if (n != static_cast<ssize_t>(sizeof(head))) return false;
  // The header is written last: a crashed save's temporary starts with zeros, or with the magic.
  static const char kZeros[sizeof(kMagic)] = {};
  return std::memcmp(head, kMagic, sizeof(kMagic)) == 0 ||
         std::memcmp(head, kZeros, sizeof(head)) == 0;
}

bool isStepTemporary(const std::string& name) {
  int64_t step = 0;
  size_t p = std::strlen(kStepPrefix), s = std::strlen(kTmpSuffix);
  return name.size() > p + s && name.compare(0, p, kStepPrefix) == 0 &&
         name.compare(name.size() - s, s, kTmpSuffix) == 0 &&
         parseStep(name.substr(p, name.size() - p - s), &step);
}

}  // namespace

int FileOps::fail(fault::IoOp op) { return injector_.before(op); }

int FileOps::open(const std::string& path, int flags, mode_t mode) {
  return openLoop(path, flags, mode, false);
}

int FileOps::openLoop(const std::string& path, int flags, mode_t mode, bool refusable) {
  int injected = fail(fault::IoOp::Open);
  int fd = -1;
  if (injected == 0) {
    do {
      fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
    } while (fd < 0 && errno == EINTR);
  }
  int error = injected ? injected : errno;
  if (fd < 0 && refusable && error == EINVAL) return -1;
  DTRAIN_CHECK_T(CheckpointError, fd >= 0, "checkpoint: cannot open {}: {}.{}", path,
                 errnoText(error), hintFor(error));
  injector_.after();
  return fd;
}

void FileOps::writeAt(int fd, const void* data, size_t size, uint64_t offset,
                      const std::string& path, SaveProgress* progress) {
  writeLoop(fd, data, size, offset, path, progress, false);
}

// Note [Direct writes]
// A save in the background competes with training for memory bandwidth and CPU: a buffered write
// copies every byte into the page cache (a kernel memcpy on the save thread), and kernel threads
// write the dirty pages back later, on cores training may need. The region that
// writeCheckpointFileFromRegion() writes is a private snapshot already (every asynchronous save's,
// and a synchronous save's of tensors not in host memory), so its bulk is written with O_DIRECT:
// the device reads it from the region itself, with no second copy and no ~200 MB of page cache
// that nobody reads again. The save thread waits for the device on each call instead, which a
// save can afford: its fsync waited for the device as well.
// O_DIRECT wants the buffer address, the file offset and the length to be multiples of the
// logical block size; kDirectAlignment (4096) is a multiple of the common ones. The data region
// starts at byte 128 of the file (Note [Checkpoint format]; moving it would change the format),
// so the region is placed in its buffer at an address congruent to 128 modulo 4096
// (directRegionStart()): region byte 3968 then lies at file offset 4096, and every whole block
// from there on is written directly. The first 3968 bytes, the tail after the last whole block,
// the manifest and the header go through the ordinary descriptor as before; the two descriptors
// never write the same block. A region placed otherwise, or smaller than kDirectMinBytes (an
// extra open buys nothing there), is written the buffered way only.
// Where O_DIRECT is refused -- EINVAL at the open (ramfs, tmpfs before Linux 6.6, some FUSE and
// network filesystems) or at a write (a device with larger blocks) -- the rest is written the
// buffered way, and this FileOps (one per Checkpointer, living across its saves) does not ask
// that filesystem again: a save never fails because of O_DIRECT. Any other error fails the save
// as a buffered write's would; the open and every write are counted and can be failed by
// DTRAIN_IO_FAULT like any other (an injected EINVAL reads as a refusal). Durability is
// unchanged: the ordinary descriptor's fsync, after everything is written, covers the whole file,
// the blocks written directly included (O_DIRECT makes neither the device's cache nor the file's
// metadata durable).
uint64_t FileOps::writeDirectAt(int fd, const void* data, size_t size, uint64_t offset,
                                const std::string& path, SaveProgress* progress) {
  DTRAIN_CHECK_ARG(reinterpret_cast<uintptr_t>(data) % kDirectAlignment == 0 &&
                       size % kDirectAlignment == 0 && offset % kDirectAlignment == 0,
                   "checkpoint: a direct write to {} must be aligned to {} bytes (address {}, "
                   "{} bytes at offset {})",
                   path, kDirectAlignment, data, size, offset);
  struct stat st {};
  if (size == 0 || ::fstat(fd, &st) != 0) return 0;
  if (std::find(refusedDirect_.begin(), refusedDirect_.end(), st.st_dev) != refusedDirect_.end()) {
    return 0;
  }
  const int direct = openLoop(path, O_WRONLY | O_DIRECT, 0, true);
  size_t written = 0;
  if (direct >= 0) {
    try {
      written = writeLoop(direct, data, size, offset, path, progress, true);
    } catch (...) {
      close(direct);
      throw;
    }
    close(direct);
  }
  direct_.bytes += written;
  if (written < size) {
    refusedDirect_.push_back(st.st_dev);
    ++direct_.refusals;
  }
  return written;
}

size_t FileOps::writeLoop(int fd, const void* data, size_t size, uint64_t offset,
                          const std::string& path, SaveProgress* progress, bool refusable) {
  const auto* p = static_cast<const uint8_t*>(data);
  size_t done = 0;
  while (done < size) {
    size_t chunk = std::min(size - done, kMaxWriteBytes);
    int injected = fail(fault::IoOp::Write);
    ssize_t n = -1;
    if (injected == 0) {
      n = ::pwrite(fd, p + done, chunk, static_cast<off_t>(offset + done));
      if (n < 0 && errno == EINTR) continue;
    }
    int error = injected ? injected : errno;
    if (n < 0 && refusable && error == EINVAL) return done;
    DTRAIN_CHECK_T(CheckpointError, n > 0 || (n == 0 && chunk == 0),
                   "checkpoint: writing {} failed at byte {} ({} of {} bytes of this piece "
                   "written): {}.{}",
                   path, offset + done, done, size, n == 0 ? "no progress" : errnoText(error),
                   hintFor(error));
    injector_.after();
    done += static_cast<size_t>(n);
    if (progress) progress->bytesWritten += static_cast<uint64_t>(n);
  }
  return done;
}

void FileOps::fsync(int fd, const std::string& path) {
  int injected = fail(fault::IoOp::Fsync);
  int rc = injected ? -1 : ::fsync(fd);
  int error = injected ? injected : errno;
  // Never retried: after a failed fsync the kernel may have dropped the dirty pages.
  DTRAIN_CHECK_T(CheckpointError, rc == 0,
                 "checkpoint: fsync of {} failed: {}; the save is lost.{}", path, errnoText(error),
                 hintFor(error));
  injector_.after();
}

void FileOps::rename(const std::string& from, const std::string& to) {
  int injected = fail(fault::IoOp::Rename);
  int rc = injected ? -1 : ::rename(from.c_str(), to.c_str());
  int error = injected ? injected : errno;
  DTRAIN_CHECK_T(CheckpointError, rc == 0, "checkpoint: rename {} -> {} failed: {}.{}", from, to,
                 errnoText(error), hintFor(error));
  injector_.after();
}

void FileOps::fsyncDirectory(const std::string& dir) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY);
  try {
    fsync(fd, dir);
  } catch (...) {
    close(fd);
    throw;
  }
  close(fd);
}

void FileOps::close(int fd) {
  if (fd >= 0) ::close(fd);
}

namespace {

// Writes the manifest after the data and the header at offset 0, then fsyncs.
void finishFile(FileOps& ops, int fd, const std::string& path, Layout& layout,
                SaveProgress* progress) {
  if (progress) progress->phase = "writing the manifest";
  auto manifest = encodeManifest(layout.entries);
  auto header = encodeHeader(layout.header, manifest);
  ops.writeAt(fd, manifest.data(), manifest.size(), layout.header.manifestOffset, path, progress);
  ops.writeAt(fd, header.data(), header.size(), 0, path, progress);
  // The file ends exactly after the manifest, even when an earlier, longer attempt left more.
  if (::ftruncate(fd, static_cast<off_t>(layout.header.fileSize)) != 0) {
    DTRAIN_THROW(CheckpointError, "checkpoint: truncating {} to {} bytes failed: {}", path,
                 layout.header.fileSize, errnoText(errno));
  }
  if (progress) progress->phase = "fsync of the file";
  ops.fsync(fd, path);
}

// Note [Hashing beside the write]
// Every entry's XXH3 goes into the manifest, which is written after the data. Hashing first and
// writing after is two passes over the state, one after the other, on the save thread; a save is
// memory-bound, and hashing (~6 GB/s) costs about as much as copying into the page cache. So when
// the caller waits for the save (save(), training stopped), a second thread hashes the entries
// while the save thread writes them: both only read the same memory, the wall time is the longer
// of the two, and the manifest waits for both. A save in the background (saveAsync()) hashes
// inline instead: it has time, and a third busy thread would take a core from training. Small
// saves hash inline too, where a thread would cost more than it saves. A region's whole blocks,
// written with O_DIRECT (Note [Direct writes]), are read by the device from the same memory the
// hash reads, which nothing changes during the save: the checksums are those of the bytes written.
constexpr uint64_t kHashThreadBytes = uint64_t{8} << 20;

// Fills every entry's checksum from `dataOf(i)` -- for Hashing::Beside on a second thread while
// `write` runs here -- complete when this returns (or throws: the thread is joined first).
template <typename DataOf, typename Write>
void hashBeside(Hashing hashing, Layout& layout, DataOf dataOf, Write&& write) {
  auto hashAll = [&layout, dataOf] {
    for (size_t i = 0; i < layout.entries.size(); ++i) {
      Entry& e = layout.entries[i];
      e.checksum = checksum(dataOf(i), e.size);
    }
  };
  uint64_t total = 0;
  for (const Entry& e : layout.entries) total += e.size;
  std::thread hasher;
  if (hashing == Hashing::Beside && total >= kHashThreadBytes) {
    try {
      hasher = std::thread(hashAll);
    } catch (const std::system_error&) {
      // No thread to be had: hash here, first.
    }
  }
  if (!hasher.joinable()) {
    hashAll();
    write();
    return;
  }
  try {
    write();
  } catch (...) {
    hasher.join();
    throw;
  }
  hasher.join();
}

template <typename Body>
void withFile(FileOps& ops, const std::string& path, Body&& body) {
  int fd = ops.open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  try {
    body(fd);
  } catch (...) {
    FileOps::close(fd);
    throw;
  }
  FileOps::close(fd);
}

// Points LATEST at `name`: LATEST.tmp is written and fsynced, then renamed over LATEST. The
// caller fsyncs the directory.
void pointLatestAt(FileOps& ops, const std::string& dir, const std::string& name) {
  const std::string latestTmp = dir + "/" + kLatest + kTmpSuffix;
  const std::string text = name + "\n";
  withFile(ops, latestTmp, [&](int fd) {
    ops.writeAt(fd, text.data(), text.size(), 0, latestTmp);
    ops.fsync(fd, latestTmp);
  });
  ops.rename(latestTmp, dir + "/" + kLatest);
}

// The data region (`size` bytes at file offset `offset`), its whole blocks with O_DIRECT where
// they can be (Note [Direct writes]).
void writeRegion(FileOps& ops, int fd, const std::string& path, const uint8_t* region,
                 uint64_t offset, uint64_t size, SaveProgress* progress) {
  const uint64_t head = (kDirectAlignment - offset % kDirectAlignment) % kDirectAlignment;
  const bool placed = (reinterpret_cast<uintptr_t>(region) + head) % kDirectAlignment == 0;
  const uint64_t blocks = placed && size > head
                              ? (size - head) / kDirectAlignment * kDirectAlignment
                              : 0;
  const uint64_t direct = blocks >= kDirectMinBytes
                              ? ops.writeDirectAt(fd, region + head, blocks, offset + head, path,
                                                  progress)
                              : 0;
  if (direct == 0) {
    ops.writeAt(fd, region, size, offset, path, progress);
    return;
  }
  ops.writeAt(fd, region, head, offset, path, progress);
  const uint64_t rest = head + direct;
  ops.writeAt(fd, region + rest, size - rest, offset + rest, path, progress);
}

// Note [Staged direct writes]
// A save straight from the state's memory (writeCheckpointFile: a synchronous save of host
// tensors) has no region placed for O_DIRECT: its entries lie wherever the allocator put them.
// Written buffered, every byte goes through the page cache, and on the VMs this project runs on
// that is the save's largest cost: the kernel fills fresh page-cache pages (0.6 GB/s measured
// for a 705 MB file, then 0.25 s more of fsync), where O_DIRECT from an aligned buffer writes
// 704 MiB in 0.28-0.41 s. So a large save streams its data region through a staging window
// (`scratch`, kStagedBytes reused between saves, pre-faulted once): entries and padding are
// copied in file order (user-space copies of a window that stays in the CPU's cache, ~20 GB/s),
// and each full window is written as a placed region (writeRegion: its whole blocks with
// O_DIRECT, the rest buffered), its end on a block boundary so that the next window starts on
// one. A filesystem that refuses O_DIRECT gets the windows written buffered (Note [Direct
// writes]). None of the file stays in the page cache: a checkpoint is seldom read again soon,
// and a restore reads it from the device (Note [Reading ahead], reader.cpp). Saves smaller than
// kStagedMinBytes are written as before: small entries gathered into `scratch`, large ones from
// their own memory, all buffered.
constexpr size_t kStagedBytes = size_t{8} << 20;
constexpr uint64_t kStagedMinBytes = uint64_t{16} << 20;

// The data region from one pointer per entry, through the staging window (Note [Staged direct
// writes]).
void writeEntriesStaged(FileOps& ops, int fd, const std::string& path, const Layout& layout,
                        const EntryData& data, std::vector<uint8_t>& scratch,
                        SaveProgress* progress) {
  if (scratch.size() < kStagedBytes + kDirectAlignment)
    scratch.assign(kStagedBytes + kDirectAlignment, 0);
  uint64_t windowStart = layout.header.dataOffset;  // file offset of the window's first byte
  uint8_t* window = directRegionStart(scratch.data(), windowStart);
  // The first window ends on a block boundary; the later ones start on one.
  uint64_t capacity = kStagedBytes - windowStart % kDirectAlignment;
  uint64_t filled = 0;
  auto flush = [&] {
    if (filled) writeRegion(ops, fd, path, window, windowStart, filled, progress);
    windowStart += filled;
    filled = 0;
    window = directRegionStart(scratch.data(), windowStart);
    capacity = kStagedBytes;
  };
  // Appends `size` bytes at `bytes` (zeros when null) to the stream, flushing full windows.
  auto append = [&](const uint8_t* bytes, uint64_t size) {
    while (size) {
      const uint64_t n = std::min(size, capacity - filled);
      if (bytes) {
        std::memcpy(window + filled, bytes, n);
        bytes += n;
      } else {
        std::memset(window + filled, 0, n);
      }
      filled += n;
      size -= n;
      if (filled == capacity) flush();
    }
  };
  for (size_t i = 0; i < layout.entries.size(); ++i) {
    const Entry& e = layout.entries[i];
    const uint64_t padEnd = i + 1 < layout.entries.size() ? layout.entries[i + 1].offset
                                                          : layout.header.manifestOffset;
    if (e.size) append(static_cast<const uint8_t*>(data[i]), e.size);
    append(nullptr, padEnd - e.offset - e.size);
  }
  flush();
}

// The data region of the file from one pointer per entry: small entries gathered into `scratch`,
// large ones written straight from their memory, padding as zeros. Reads only the entries'
// offsets and sizes (a second thread fills their checksums meanwhile).
void writeEntriesBuffered(FileOps& ops, int fd, const std::string& path, const Layout& layout,
                          const EntryData& data, std::vector<uint8_t>& scratch,
                          SaveProgress* progress) {
  constexpr size_t kGather = size_t{8} << 20;  // entries below 1 MiB are gathered into this
  if (scratch.size() < kGather) scratch.assign(kGather, 0);
  uint64_t pendingStart = layout.header.dataOffset;  // file offset of scratch[0]
  size_t pending = 0;
  auto flush = [&] {
    if (pending) ops.writeAt(fd, scratch.data(), pending, pendingStart, path, progress);
    pendingStart += pending;
    pending = 0;
  };
  for (size_t i = 0; i < layout.entries.size(); ++i) {
    const Entry& e = layout.entries[i];
    uint64_t padEnd = i + 1 < layout.entries.size() ? layout.entries[i + 1].offset
                                                    : layout.header.manifestOffset;
    uint64_t span = padEnd - e.offset;  // entry + alignment padding
    if (span <= kGather / 8) {
      if (pending + span > scratch.size()) flush();
      if (e.size) std::memcpy(scratch.data() + pending, data[i], e.size);
      std::memset(scratch.data() + pending + e.size, 0, span - e.size);
      pending += span;
      continue;
    }
    flush();
    ops.writeAt(fd, data[i], e.size, e.offset, path, progress);
    static const uint8_t kZeros[kDataAlignment] = {};
    if (span > e.size) ops.writeAt(fd, kZeros, span - e.size, e.offset + e.size, path, progress);
    pendingStart = padEnd;
  }
  flush();
}

void writeEntries(FileOps& ops, int fd, const std::string& path, const Layout& layout,
                  const EntryData& data, std::vector<uint8_t>& scratch, SaveProgress* progress) {
  if (layout.header.dataSize >= kStagedMinBytes) {
    writeEntriesStaged(ops, fd, path, layout, data, scratch, progress);
  } else {
    writeEntriesBuffered(ops, fd, path, layout, data, scratch, progress);
  }
}

}  // namespace

void writeCheckpointFile(FileOps& ops, const std::string& path, Layout& layout,
                         const EntryData& data, std::vector<uint8_t>& scratch,
                         SaveProgress* progress, Hashing hashing) {
  DTRAIN_CHECK_ARG(data.size() == layout.entries.size(),
                   "checkpoint: {} data pointers for {} entries", data.size(),
                   layout.entries.size());
  if (progress) {
    progress->bytesTotal = layout.header.manifestOffset;
    progress->phase = "writing data";
  }
  withFile(ops, path, [&](int fd) {
    // See Note [Hashing beside the write].
    hashBeside(
        hashing, layout, [&data](size_t i) { return data[i]; },
        [&] { writeEntries(ops, fd, path, layout, data, scratch, progress); });
    finishFile(ops, fd, path, layout, progress);
  });
}

uint8_t* directRegionStart(uint8_t* buffer, uint64_t dataOffset) {
  const uint64_t at = reinterpret_cast<uintptr_t>(buffer) % kDirectAlignment;
  return buffer + (dataOffset % kDirectAlignment + kDirectAlignment - at) % kDirectAlignment;
}

void writeCheckpointFileFromRegion(FileOps& ops, const std::string& path, Layout& layout,
                                   const uint8_t* region, SaveProgress* progress, Hashing hashing) {
  if (progress) {
    progress->bytesTotal = layout.header.manifestOffset;
    progress->phase = "writing data";
  }
  withFile(ops, path, [&](int fd) {
    // See Note [Hashing beside the write].
    const uint64_t base = layout.header.dataOffset;
    hashBeside(
        hashing, layout,
        [&layout, region, base](size_t i) { return region + (layout.entries[i].offset - base); },
        [&] { writeRegion(ops, fd, path, region, base, layout.header.dataSize, progress); });
    finishFile(ops, fd, path, layout, progress);
  });
}

std::string stepFileName(int64_t step) { return fmt::format("{}{:08d}", kStepPrefix, step); }

DirectoryListing listDirectory(const std::string& dir) {
  DirectoryListing out;
  DIR* d = ::opendir(dir.c_str());
  if (!d) {
    DTRAIN_CHECK_T(CheckpointError, errno == ENOENT, "checkpoint: cannot read directory {}: {}",
                   dir, errnoText(errno));
    return out;
  }
  while (struct dirent* ent = ::readdir(d)) {
    std::string name = ent->d_name;
    int64_t step = 0;
    size_t p = std::strlen(kStepPrefix);
    if (name.compare(0, p, kStepPrefix) == 0 && parseStep(name.substr(p), &step)) {
      struct stat st {};
      if (::stat((dir + "/" + name).c_str(), &st) == 0 && S_ISREG(st.st_mode))
        out.steps.push_back(step);
    } else if (isStepTemporary(name) || name == std::string(kLatest) + kTmpSuffix) {
      if (ownedTemporary(dir + "/" + name)) {
        out.temporaries.push_back(name);
      } else {
        out.foreign.push_back(name);
      }
    }
  }
  ::closedir(d);
  std::sort(out.steps.rbegin(), out.steps.rend());
  std::string latest;
  int fd = ::open((dir + "/" + kLatest).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    char buf[64];
    ssize_t n = ::read(fd, buf, sizeof(buf));
    ::close(fd);
    if (n > 0) latest.assign(buf, static_cast<size_t>(n));
    while (!latest.empty() && (latest.back() == '\n' || latest.back() == ' ')) latest.pop_back();
    int64_t step = 0;
    size_t p = std::strlen(kStepPrefix);
    if (latest.compare(0, p, kStepPrefix) == 0 && parseStep(latest.substr(p), &step))
      out.latest = step;
  }
  return out;
}

void makeDirectories(FileOps& ops, const std::string& dir) {
  DTRAIN_CHECK_ARG(!dir.empty(), "checkpoint: empty directory name");
  std::string path;
  size_t pos = 0;
  while (pos != std::string::npos) {
    size_t next = dir.find('/', pos + 1);
    path = dir.substr(0, next);
    pos = next;
    if (path.empty() || path == "/" || path.back() == '/') continue;
    if (::mkdir(path.c_str(), 0755) == 0) {
      // The new entry lives in its parent: durable only once the parent is fsynced.
      const size_t slash = path.find_last_of('/');
      ops.fsyncDirectory(slash == std::string::npos ? "."
                         : slash == 0               ? "/"
                                                    : path.substr(0, slash));
    } else if (errno != EEXIST) {
      int error = errno;
      DTRAIN_THROW(CheckpointError, "checkpoint: cannot create directory {}: {}.{}", path,
                   errnoText(error), hintFor(error));
    }
  }
  struct stat st {};
  DTRAIN_CHECK_T(CheckpointError, ::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode),
                 "checkpoint: {} is not a directory. HINT: pass a directory path", dir);
}

void commitStep(FileOps& ops, const std::string& dir, int64_t step) {
  std::string name = stepFileName(step);
  ops.rename(dir + "/" + name + kTmpSuffix, dir + "/" + name);
  ops.fsyncDirectory(dir);
  pointLatestAt(ops, dir, name);
  ops.fsyncDirectory(dir);
}

void pointLatest(FileOps& ops, const std::string& dir, int64_t step) {
  pointLatestAt(ops, dir, stepFileName(step));
  ops.fsyncDirectory(dir);
}

void writeAndCommit(FileOps& ops, const std::string& dir, int64_t step,
                    const std::function<void(const std::string& tmpPath)>& write,
                    SaveProgress* progress, bool latest) {
  removeTemporaries(dir);
  const std::string name = stepFileName(step);
  const std::string tmp = dir + "/" + name + kTmpSuffix;
  const std::string final = dir + "/" + name;
  bool created = false;  // the rename made `final` appear (it replaced no earlier file)
  try {
    write(tmp);
    // See Note [Abandoned saves].
    DTRAIN_CHECK_T(CheckpointError, !progress || progress->beginCommit(),
                   "checkpoint: not committing {}: its wait timed out before the file was "
                   "written, and the save was reported failed (abandoned); removed it",
                   tmp);
    if (progress) progress->phase = "committing";
    struct stat st {};
    const bool replacing = ::lstat(final.c_str(), &st) == 0;
    ops.rename(tmp, final);
    created = !replacing;
    ops.fsyncDirectory(dir);
    if (latest) pointLatestAt(ops, dir, name);
  } catch (...) {
    // Nothing of a failed save stays behind; LATEST still names the previous checkpoint. A file
    // the rename put in place of an earlier `step-N` is complete and fsynced: removing it would
    // lose that step (and LATEST may name it), so it stays.
    ::unlink(tmp.c_str());
    ::unlink((dir + "/" + kLatest + kTmpSuffix).c_str());
    if (created) ::unlink(final.c_str());
    throw;
  }
  // LATEST names the new file now; a failure of this last fsync fails the save, but the file it
  // names is complete and durable (fsynced before the rename), so it stays.
  if (latest) ops.fsyncDirectory(dir);
}

void saveStep(FileOps& ops, const std::string& dir, int64_t step, int keepLast,
              const std::function<void(const std::string& tmpPath)>& write,
              SaveProgress* progress) {
  writeAndCommit(ops, dir, step, write, progress);
  if (progress) progress->phase = "pruning old checkpoints";
  pruneCheckpoints(dir, keepLast, step);
}

void removeTemporaries(const std::string& dir) {
  DirectoryListing listing;
  try {
    listing = listDirectory(dir);
  } catch (const std::exception& e) {
    DTRAIN_LOG(Warn, "checkpoint: not cleaning {}: {}", dir, e.what());
    return;
  }
  for (const auto& name : listing.temporaries) {
    std::string path = dir + "/" + name;
    if (::unlink(path.c_str()) == 0) {
      DTRAIN_LOG(Info, "checkpoint: removed {}, left by an interrupted save", path);
    } else {
      DTRAIN_LOG(Warn, "checkpoint: could not remove {}: {}", path, errnoText(errno));
    }
  }
  for (const auto& name : listing.foreign) {
    DTRAIN_LOG(Info, "checkpoint: leaving {}/{} alone: named like a temporary but not ours", dir,
               name);
  }
}

void pruneCheckpoints(const std::string& dir, int keepLast, int64_t protect) {
  keepLast = std::max(keepLast, 2);
  DirectoryListing listing;
  try {
    listing = listDirectory(dir);
  } catch (const std::exception& e) {
    DTRAIN_LOG(Warn, "checkpoint: not pruning {}: {}", dir, e.what());
    return;
  }
  for (size_t i = static_cast<size_t>(keepLast); i < listing.steps.size(); ++i) {
    int64_t step = listing.steps[i];
    if (step == protect || (listing.latest && step == *listing.latest)) continue;
    std::string path = dir + "/" + stepFileName(step);
    if (::unlink(path.c_str()) != 0) {
      DTRAIN_LOG(Warn, "checkpoint: could not delete old checkpoint {}: {} (kept)", path,
                 errnoText(errno));
    }
  }
}

}  // namespace dtrain::checkpoint
