// checkpoint: look into, check and export dtrain checkpoints.
//
//   checkpoint list DIR|FILE            the checkpoints of every node directory under DIR (or of
//                                       DIR itself), or the entries of one FILE
//   checkpoint verify DIR|FILE...       every checksum of every checkpoint; names the first bad
//                                       entry; exit 1 when anything is damaged
//   checkpoint export DIR|FILE --to model.pt [--module NAME] [--format pickle|libtorch]
//                                       a module's state_dict for Python's torch.load (pickle,
//                                       the default: what torch.save writes, which loads with
//                                       weights_only=True) or C++ torch::load (libtorch); a
//                                       directory exports its newest checkpoint that verifies
//                                       (ZeRO stage-3 parameters: assembled from that step's
//                                       files on every node)
//
// Exit codes: 0 ok, 1 a checkpoint is damaged or an operation failed, 2 usage error.
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "checkpoint/file_io.h"
#include "checkpoint/format.h"
#include "dtrain/base/error.h"
#include "dtrain/torch/checkpoint.h"

namespace {

using namespace dtrain::checkpoint;

constexpr const char* kUsage =
    "usage: checkpoint list DIR|FILE\n"
    "       checkpoint verify DIR|FILE...\n"
    "       checkpoint export DIR|FILE --to OUT [--module NAME] [--format pickle|libtorch]\n";

int usage(const std::string& why) {
  std::fprintf(stderr, "checkpoint: %s\n%s", why.c_str(), kUsage);
  return 2;
}

bool isDirectory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string shapeText(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// `dir` itself when it holds step files or LATEST, else its subdirectories that do (the node
// directories of a Checkpointer's directory).
std::vector<std::string> nodeDirectories(const std::string& dir) {
  auto holds = [](const std::string& d) {
    auto l = listDirectory(d);
    struct stat st {};
    return !l.steps.empty() || !l.temporaries.empty() || ::stat((d + "/LATEST").c_str(), &st) == 0;
  };
  if (holds(dir)) return {dir};
  std::vector<std::string> out;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (struct dirent* ent = ::readdir(d)) {
      std::string name = ent->d_name;
      if (name == "." || name == "..") continue;
      std::string sub = dir + "/" + name;
      if (isDirectory(sub) && holds(sub)) out.push_back(sub);
    }
    ::closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// ", shards of ranks 0, 1" for a file holding a sharded optimizer's records (owned shard entries:
// its own ranks' and the next node's), else "".
std::string shardsText(const CheckpointReader& reader) {
  std::set<uint32_t> owners;
  for (const auto& e : reader.entries()) {
    if (e.owner != kReplicated && e.kind == Kind::Tensor) owners.insert(e.owner);
  }
  if (owners.empty()) return "";
  return fmt::format(", shards of rank{} {}", owners.size() > 1 ? "s" : "",
                     fmt::join(owners, ", "));
}

int listFile(const std::string& path) {
  CheckpointReader reader = CheckpointReader::open(path);
  const Header& h = reader.header();
  std::printf("%s: step %lld, epoch %lld, world size %u, libtorch %s, %llu entries, %llu bytes\n",
              path.c_str(), static_cast<long long>(h.step), static_cast<long long>(h.epoch),
              h.worldSize, h.torchVersion.c_str(), static_cast<unsigned long long>(h.entryCount),
              static_cast<unsigned long long>(h.fileSize));
  std::printf("  %-8s %-9s %-12s %-10s %12s  %s\n", "kind", "dtype", "shape", "owner", "bytes",
              "name");
  for (const auto& e : reader.entries()) {
    std::string owner = e.owner == kReplicated ? "all" : fmt::format("rank {}", e.owner);
    const bool ranged = e.isShard() || (e.owner != kReplicated && e.kind == Kind::Tensor);
    const std::string range = ranged ? fmt::format(" (elements {}..{})", e.elementOffset,
                                                   e.elementOffset + e.elementCount)
                                     : "";
    std::printf("  %-8s %-9s %-12s %-10s %12llu  %s%s\n", kindName(e.kind), dtypeName(e.dtype),
                shapeText(e.shape).c_str(), owner.c_str(), static_cast<unsigned long long>(e.size),
                e.name.c_str(), range.c_str());
  }
  return 0;
}

int list(const std::string& path) {
  if (!isDirectory(path)) return listFile(path);
  auto dirs = nodeDirectories(path);
  if (dirs.empty()) {
    std::printf("%s: no checkpoints\n", path.c_str());
    return 0;
  }
  for (const auto& dir : dirs) {
    auto listing = listDirectory(dir);
    std::printf("%s: %zu checkpoint(s), LATEST -> %s\n", dir.c_str(), listing.steps.size(),
                listing.latest ? stepFileName(*listing.latest).c_str() : "(none)");
    for (int64_t step : listing.steps) {
      std::string file = dir + "/" + stepFileName(step);
      try {
        CheckpointReader reader = CheckpointReader::open(file);
        const Header& h = reader.header();
        std::printf("  %s  epoch %lld  world %u  %llu entries  %.1f MiB%s\n",
                    stepFileName(step).c_str(), static_cast<long long>(h.epoch), h.worldSize,
                    static_cast<unsigned long long>(h.entryCount), h.fileSize / 1048576.0,
                    shardsText(reader).c_str());
      } catch (const std::exception& e) {
        std::printf("  %s  DAMAGED: %s\n", stepFileName(step).c_str(), e.what());
      }
    }
    for (const auto& t : listing.temporaries) {
      std::printf("  %s  (left by an interrupted save; removed by the next save or restore)\n",
                  t.c_str());
    }
  }
  return 0;
}

// Verifies one file; prints one line. True when it is intact.
bool verifyFile(const std::string& path) {
  try {
    CheckpointReader reader = CheckpointReader::open(path);
    reader.verify();
    std::printf("%s: ok (step %lld, %llu entries%s, every checksum matches)\n", path.c_str(),
                static_cast<long long>(reader.header().step),
                static_cast<unsigned long long>(reader.header().entryCount),
                shardsText(reader).c_str());
    return true;
  } catch (const std::exception& e) {
    std::printf("%s: DAMAGED: %s\n", path.c_str(), e.what());
    return false;
  }
}

int verify(const std::vector<std::string>& paths) {
  bool ok = true;
  for (const auto& path : paths) {
    if (!isDirectory(path)) {
      ok = verifyFile(path) && ok;
      continue;
    }
    auto dirs = nodeDirectories(path);
    if (dirs.empty()) std::printf("%s: no checkpoints\n", path.c_str());
    for (const auto& dir : dirs) {
      for (int64_t step : listDirectory(dir).steps)
        ok = verifyFile(dir + "/" + stepFileName(step)) && ok;
    }
  }
  return ok ? 0 : 1;
}

// The newest checkpoint under `path` that verifies (a file is taken as given).
std::string newestVerified(const std::string& path) {
  if (!isDirectory(path)) return path;
  for (const auto& dir : nodeDirectories(path)) {
    for (int64_t step : listDirectory(dir).steps) {
      std::string file = dir + "/" + stepFileName(step);
      try {
        CheckpointReader::open(file).verify();
        return file;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "checkpoint: skipping %s: %s\n", file.c_str(), e.what());
      }
    }
  }
  DTRAIN_THROW(dtrain::CheckpointError, "no checkpoint under {} verifies", path);
}

// `file` first, then the same step's files in the other node directories under `path` (a
// directory): ZeRO stage-3 parameters are spread over them (each node's file holds its own
// ranks' shards and the next node's).
std::vector<std::string> sameStepOnEveryNode(const std::string& path, const std::string& file) {
  std::vector<std::string> out = {file};
  if (!isDirectory(path)) return out;
  const std::string name = file.substr(file.rfind('/') + 1);
  for (const auto& dir : nodeDirectories(path)) {
    const std::string other = dir + "/" + name;
    struct stat st {};
    if (other != file && ::stat(other.c_str(), &st) == 0) out.push_back(other);
  }
  return out;
}

int run(int argc, char** argv) {
  if (argc < 2) return usage("no command");
  std::string command = argv[1];
  if (command == "--help" || command == "-h" || command == "help") {
    std::printf("%s", kUsage);
    return 0;
  }
  std::vector<std::string> positional;
  std::string to, module, format = "pickle";
  for (int i = 2; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&](std::string& out) {
      if (i + 1 >= argc) return false;
      out = argv[++i];
      return true;
    };
    if (arg == "--to") {
      if (!value(to)) return usage("--to needs a file name");
    } else if (arg == "--module") {
      if (!value(module)) return usage("--module needs a name");
    } else if (arg == "--format") {
      if (!value(format)) return usage("--format needs pickle or libtorch");
    } else if (!arg.empty() && arg[0] == '-') {
      return usage("unknown option " + arg);
    } else {
      positional.push_back(arg);
    }
  }
  if (command == "list") {
    if (positional.size() != 1) return usage("list takes one directory or file");
    return list(positional[0]);
  }
  if (command == "verify") {
    if (positional.empty()) return usage("verify needs a directory or file");
    return verify(positional);
  }
  if (command == "export") {
    if (positional.size() != 1) return usage("export takes one directory or file");
    if (to.empty()) return usage("export needs --to FILE");
    if (format != "pickle" && format != "libtorch") return usage("--format is pickle or libtorch");
    std::string file = newestVerified(positional[0]);
    dtrain::exportStateDict(sameStepOnEveryNode(positional[0], file), to, module, format);
    std::printf("exported %s to %s (%s)\n", file.c_str(), to.c_str(),
                format == "pickle" ? "for Python's torch.load(path, weights_only=True)"
                                   : "for C++ torch::load");
    return 0;
  }
  return usage("unknown command " + command);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const dtrain::InvalidArgument& e) {
    std::fprintf(stderr, "checkpoint: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "checkpoint: %s\n", e.what());
    return 1;
  }
}
