#pragma once
// Helpers for dtrain's tests: where the built binaries are, scratch directories, and process
// checks. Torch-free.

#include <sys/types.h>

#include <string>
#include <vector>

namespace dtrain::testing {

// Directory of the CMake build tree / source tree of this test build.
std::string binaryDir();
std::string sourceDir();
// A built executable of this tree, e.g. binaryPath("launch"); fails the test if absent.
std::string binaryPath(const std::string& name);

// The Python of this build (CMake's DTRAIN_PYTHON: the project's .venv unless configured
// otherwise), for the tests that check dtrain against PyTorch.
std::string python();
// Empty when python() imports `modules` (one import statement: "torch, torchvision"); else what
// failed, with a HINT. scripts/setup.sh always makes the environment, so a test that needs a
// module fails with this rather than skipping.
std::string pythonImportError(const std::string& modules);

// A fresh directory under $TMPDIR, removed with everything in it when the object dies.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

std::string readFile(const std::string& path);
void writeFile(const std::string& path, const std::string& text);

// True while a process with this pid exists (zombies included).
bool processExists(pid_t pid);

// A TCP port on 127.0.0.1 that was free a moment ago (bound to port 0, then released).
int freeLoopbackPort();

}  // namespace dtrain::testing
