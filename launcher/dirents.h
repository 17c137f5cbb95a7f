#pragma once
// Reading a directory with getdents64 into the caller's buffer: no allocation, system calls only,
// so both a forked guardian (async-signal-safe code, Note [Guardians]) and the monitor's sampler
// (no allocation once warm, Note [Sampling cost]) use it.

#include <sys/syscall.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>

namespace dtrain::launcher {

// Reads the next entries of the directory open as `fd` into `buf` and calls f(name) for each,
// "." and ".." included. Returns what getdents64 returned: 0 at the end, -1 on an error.
template <typename F>
long readDirents(int fd, char* buf, size_t size, F&& f) {
  const long n = ::syscall(SYS_getdents64, fd, buf, size);
  for (long off = 0; off < n;) {
    // struct linux_dirent64: ino (8), off (8), reclen (2), type (1), name.
    unsigned short reclen = 0;
    std::memcpy(&reclen, buf + off + 16, sizeof reclen);
    f(static_cast<const char*>(buf + off + 19));
    off += reclen;
  }
  return n;
}

}  // namespace dtrain::launcher
