// Loads the Gloo backend, a library of its own (libdtrain_gloo.so beside libdtrain_comm.so), on
// first use. See Note [One Gloo per process].
#include <dlfcn.h>

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
// and the two lay out gloo's classes differently. Linked the usual way, every gloo:: symbol of the
// process resolves to the first library of its global scope that defines it: libtorch's, since a
// training program names libtorch and libgloo only comes in through dtrain_comm. dtrain's backend
// and libgloo itself then called libtorch's Gloo on the other version's objects: every worker
// crashed (SIGSEGV) in its first Gloo collective. So the backend is a library of its own, loaded
// here on first use and reached through two C entry points; when the process already holds another
// Gloo's symbols, with RTLD_DEEPBIND, so that the backend and the libgloo it brings look up their
// own definitions before the global scope's. Deep binding is used only then (a process without
// libtorch -- launch, the comm tests, a sanitizer build -- loads it normally) because it also binds
// the library's direct calls to malloc and free to libc's, past an allocator a program interposes;
// the backend makes none, and memory libgloo allocates it also frees. Tested by
// `GlooOnePerProcess.*` (tests/torch), which runs dtrain's Gloo in a process that ran torch ops.

constexpr const char* kLibrary = "libdtrain_gloo.so";
// A symbol every Gloo defines (gloo::Context::nextSlot(int)): present before the backend is loaded
// only when another Gloo is in the process.
constexpr const char* kAnotherGlooSymbol = "_ZN4gloo7Context8nextSlotEi";

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

Backend load() {
  Backend b;
  const std::string path = libraryPath();
  int flags = RTLD_NOW | RTLD_LOCAL;
  if (::dlsym(RTLD_DEFAULT, kAnotherGlooSymbol) != nullptr) flags |= RTLD_DEEPBIND;
  void* handle = ::dlopen(path.c_str(), flags);
  if (handle == nullptr) {
    const char* why = ::dlerror();
    b.error = fmt::format("cannot load dtrain's Gloo backend {}: {}", path, why ? why : "?");
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
    DTRAIN_THROW(InvalidArgument, "{}. HINT: it is installed beside libdtrain_comm.so; reinstall "
                                  "dtrain, or pick another backend (DTRAIN_BACKEND)",
                 b.error);
  }
  std::shared_ptr<Communicator> out;
  b.create(&options, &out);
  return out;
}

}  // namespace dtrain::comm
