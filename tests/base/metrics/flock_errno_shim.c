/* An LD_PRELOAD library for the tests of directories whose filesystem has no file locks (Lustre
 * mounted without -o flock, NFS without lockd): flock() fails, as it does there, with the errno
 * that DTRAIN_TEST_FLOCK_ERRNO names -- ENOSYS, ENOLCK or EOPNOTSUPP. Unset (or any other value):
 * the real flock(), so a process started with the library but without the variable locks as
 * usual. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>

int flock(int fd, int operation) {
  const char* name = getenv("DTRAIN_TEST_FLOCK_ERRNO");
  int error = 0;
  if (name != NULL && strcmp(name, "ENOSYS") == 0) error = ENOSYS;
  if (name != NULL && strcmp(name, "ENOLCK") == 0) error = ENOLCK;
  if (name != NULL && strcmp(name, "EOPNOTSUPP") == 0) error = EOPNOTSUPP;
  if (error != 0) {
    errno = error;
    return -1;
  }
  int (*real)(int, int) = (int (*)(int, int))dlsym(RTLD_NEXT, "flock");
  return real(fd, operation);
}
