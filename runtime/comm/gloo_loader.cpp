// Loads the Gloo backend, a library of its own (libdtrain_gloo.so beside libdtrain_comm.so), on
// first use. See Note [One Gloo per process].
#include <dlfcn.h>
#include <sys/stat.h>

#include <cstring>
#include <filesystem>
#include <string>

#include <fmt/format.h>

#include "dtrain/base/error.h"
#include "dtrain/comm/gloo_communicator.h"
#include "dtrain/config.h"

namespace dtrain::comm {
namespace {

// Note [One Gloo per process]
// pip's libtorch carries a Gloo of its own, a newer one whose symbols libtorch_cpu.so and
// libtorch_cuda.so export; dtrain's backend is compiled against the system's libgloo (Debian's),
// and the two lay out gloo's classes differently. A process resolves each gloo:: symbol
// to the first
// library of its global lookup order that defines it, for dtrain's backend and for libgloo's own
// calls alike. With libtorch first (a program names it; libgloo came in only through dtrain_comm),
// dtrain's backend ran libtorch's Gloo on the other version's objects: every worker crashed
// (SIGSEGV) in its first Gloo collective. So:
// - every program that links dtrain_comm gets the system's libgloo as its first needed library (a
//   link option of dtrain_comm's interface, exported with the CMake package),
//   ahead of any libtorch.
//   libtorch's own Gloo code (c10d's ProcessGroupGloo, which a dtrain program does not run) is then
//   the one bound to the other version; libtorch loads and runs its ops as before;
// - the backend is a library of its own, loaded here on first use once gloo:: symbols are seen to
//   resolve to that libgloo: where another Gloo comes first (dtrain opened with dlopen after
//   libtorch, a link line without the option) the backend is refused, naming both libraries.
// Deep binding (RTLD_DEEPBIND) was tried and left: it also binds the backend's references to
// libstdc++'s data (locale facet ids, std::cout) to libstdc++'s own copies, while programs use the
// ones copy-relocated into their executable; std::regex in the backend then threw std::bad_cast.
// Tested by `ProcessGroupCollectives.GlooRunsBesideTheGlooInsideLibtorch` (tests/torch).

constexpr const char* kLibrary = "libdtrain_gloo.so";
// A symbol every Gloo defines (gloo::Context::nextSlot(int)).
constexpr const char* kGlooSymbol = "_ZN4gloo7Context8nextSlotEi";

using VersionFn = const char* (*)();
using CreateFn = void (*)(const GlooOptions*, std::shared_ptr<Communicator>*);

struct Backend {
  CreateFn create = nullptr;
  std::string error;  // why create is null
};

std::string libraryPath() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&glooAvailable), &info) == 0 || info.dli_fname == nullptr) {
    return kLibrary;  // the dynamic linker's search path
  }
  return (std::filesystem::path(info.dli_fname).parent_path() / kLibrary).string();
}

bool sameFile(const char* a, const char* b) {
  struct stat sa {
  }, sb{};
  return ::stat(a, &sa) == 0 && ::stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

// Empty when gloo:: symbols resolve to the system's libgloo (or to none yet), else why not.
std::string anotherGlooFirst() {
#ifdef DTRAIN_GLOO_LIBRARY
  void* first = ::dlsym(RTLD_DEFAULT, kGlooSymbol);
  Dl_info info{};
  if (first != nullptr && ::dladdr(first, &info) != 0 && info.dli_fname != nullptr &&
      !sameFile(info.dli_fname, DTRAIN_GLOO_LIBRARY)) {
    return fmt::format(
        "gloo:: symbols of this process resolve to {} (another Gloo, such as the one pip's "
        "libtorch carries) ahead of {}, the Gloo dtrain's backend is built against; see Note [One "
        "Gloo per process] in runtime/comm/gloo_loader.cpp. HINT: link the program with "
        "dtrain::dtrain_comm (or dtrain::dtrain) through CMake, which puts {} first, or start it "
        "with LD_PRELOAD={}",
        info.dli_fname, DTRAIN_GLOO_LIBRARY, DTRAIN_GLOO_LIBRARY, DTRAIN_GLOO_LIBRARY);
  }
#endif
  return "";
}

Backend load() {
  Backend b;
  b.error = anotherGlooFirst();
  if (!b.error.empty()) return b;
  const std::string path = libraryPath();
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = ::dlerror();
    b.error = fmt::format("cannot load dtrain's Gloo backend {}: {}. HINT: it is installed beside "
                          "libdtrain_comm.so; reinstall dtrain",
                          path, why ? why : "?");
    return b;
  }
  auto version = reinterpret_cast<VersionFn>(::dlsym(handle, "dtrain_gloo_version"));
  auto create = reinterpret_cast<CreateFn>(::dlsym(handle, "dtrain_gloo_create"));
  if (version == nullptr || create == nullptr) {
    b.error = fmt::format("{} is not dtrain's Gloo backend (no dtrain_gloo_create)", path);
  } else if (std::strcmp(version(), DTRAIN_VERSION) != 0) {
    b.error = fmt::format("{} is dtrain {}'s Gloo backend, this is dtrain {}", path, version(),
                          DTRAIN_VERSION);
  } else {
    b.create = create;
  }
  return b;
}

const Backend& backend() {
  static const Backend b = load();
  return b;
}

}  // namespace

// Built with Gloo: a backend that then fails to load is an installation to repair, said loudly by
// createGlooCommunicator, not a backend to skip quietly.
bool glooAvailable() { return true; }

std::shared_ptr<Communicator> createGlooCommunicator(const GlooOptions& options) {
  const Backend& b = backend();
  if (b.create == nullptr) {
    DTRAIN_THROW(InvalidArgument,
                 "the Gloo backend is unavailable: {} (or pick another backend: "
                 "DTRAIN_BACKEND)",
                 b.error);
  }
  std::shared_ptr<Communicator> out;
  b.create(&options, &out);
  return out;
}

}  // namespace dtrain::comm
