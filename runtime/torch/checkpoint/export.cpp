// exportStateDict(): a module's tensors out of a dtrain checkpoint, into the files PyTorch reads,
// so that a model trained with dtrain is not locked into dtrain's format.
#include <fstream>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>
#include <fmt/format.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/serialize.h>
#include <torch/serialize/output-archive.h>

#include "dtrain/base/error.h"
#include "dtrain/torch/checkpoint.h"
#include "shard_entries.h"
#include "state.h"

namespace dtrain {

namespace {

// The nested archives torch::load(module, path) walks: "fc1.weight" is "weight" in archive "fc1".
struct ArchiveNode {
  std::map<std::string, at::Tensor> tensors;
  std::map<std::string, ArchiveNode> children;

  void add(const std::string& dotted, const at::Tensor& t) {
    size_t dot = dotted.find('.');
    if (dot == std::string::npos) {
      tensors[dotted] = t;
    } else {
      children[dotted.substr(0, dot)].add(dotted.substr(dot + 1), t);
    }
  }
  void writeTo(torch::serialize::OutputArchive& archive) const {
    for (const auto& [key, t] : tensors) archive.write(key, t);
    for (const auto& [key, child] : children) {
      torch::serialize::OutputArchive nested;
      child.writeTo(nested);
      archive.write(key, nested);
    }
  }
};

// Note [Exported pickles]
// What Python's torch.save of a module's state dict writes: a zip archive whose data.pkl is a plain
// dict of name -> tensor, each tensor rebuilt by torch._utils._rebuild_tensor_v2 from a storage in
// data/<key>. torch::pickle_save writes the same archive, but tags typed containers with
// torch.jit._pickle.restore_type_tag, which torch.load(weights_only=True) -- PyTorch 2.6's
// default -- refuses as an unsafe global. The pickler without aggregate tags writes only what the
// weights-only unpickler allows.
std::vector<char> stateDictPickle(const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& [name, t] : tensors) dict.insert(name, t);
  std::vector<char> pickle;
  torch::jit::Pickler pickler(
      [&](const char* p, size_t n) { pickle.insert(pickle.end(), p, p + n); },
      /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
      /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(c10::IValue(dict));
  pickler.stop();
  std::vector<char> archive;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* p, size_t n) {
    const auto* bytes = static_cast<const char*>(p);
    archive.insert(archive.end(), bytes, bytes + n);
    return n;
  });
  torch::jit::writeArchiveAndTensors("data", pickle.data(), pickle.size(), pickler.tensorData(),
                                     writer);
  writer.writeEndOfFile();
  return archive;
}

// The ranks whose owned entries `readers` hold between them.
std::set<uint32_t> ownersIn(const std::vector<checkpoint::CheckpointReader>& readers) {
  std::set<uint32_t> owners;
  for (const auto& r : readers) {
    for (uint32_t o : checkpoint::shardOwners(r)) owners.insert(o);
  }
  return owners;
}

// Reads tensor `name`, saved as owned ranges, into `t`: each owner's range from the first of
// `readers` that holds it. Throws CheckpointError when the ranges do not cover the tensor.
void readShards(const std::vector<checkpoint::CheckpointReader>& readers, const std::string& name,
                at::Tensor& t) {
  using Source = std::pair<const checkpoint::CheckpointReader*, const checkpoint::Entry*>;
  std::map<uint32_t, Source> ranges;  // owner -> where its range is read
  for (const auto& r : readers) {
    for (const checkpoint::Entry* e : r.find(name)) {
      if (e->owner == checkpoint::kReplicated) continue;
      DTRAIN_CHECK_T(CheckpointError,
                     checkpoint::toScalarType(e->dtype) == t.scalar_type() &&
                         e->shape == t.sizes().vec(),
                     "export: entry \"{}\" of rank {} in {} has another dtype or shape than in {}",
                     name, e->owner, r.name(), readers.front().name());
      ranges.emplace(e->owner, std::make_pair(&r, e));
    }
  }
  uint64_t covered = 0;
  for (const auto& [owner, source] : ranges) covered += source.second->elementCount;
  DTRAIN_CHECK_T(CheckpointError, covered == static_cast<uint64_t>(t.numel()),
                 "export: the shards of parameter \"{}\" in {} cover {} of its {} elements", name,
                 readers.front().name(), covered, t.numel());
  at::Tensor flat = t.view(-1);
  for (const auto& [owner, source] : ranges) {
    at::Tensor part = flat.narrow(0, static_cast<int64_t>(source.second->elementOffset),
                                  static_cast<int64_t>(source.second->elementCount));
    source.first->read(*source.second, part.data_ptr());
  }
}

// The tensors of module `chosen` in `first`, in manifest order (the module's own: parameters,
// then buffers). Parameters saved as their owners' shards (Note [Stage-3 checkpoints]) are
// assembled from every rank's range, in `first` or in the files `others` (the same step's files
// on the other nodes): between them they must hold every rank's.
std::vector<std::pair<std::string, at::Tensor>> moduleTensorsOf(
    checkpoint::CheckpointReader first, const std::vector<std::string>& others,
    const std::string& chosen) {
  const std::string prefix = "module/" + chosen + "/";
  std::vector<checkpoint::CheckpointReader> readers;
  readers.push_back(std::move(first));
  bool sharded = false;
  for (const auto& e : readers.front().entries()) {
    sharded = sharded || (e.owner != checkpoint::kReplicated && e.name.rfind(prefix, 0) == 0);
  }
  if (sharded) {
    const checkpoint::Header h = readers.front().header();  // readers grows below
    for (const auto& path : others) {
      readers.push_back(checkpoint::CheckpointReader::open(path));
      const checkpoint::Header& o = readers.back().header();
      DTRAIN_CHECK_T(CheckpointError, o.step == h.step && o.worldSize == h.worldSize,
                     "export: {} is step {} of a world of {}, {} step {} of a world of {}: the "
                     "shards of one step are in that step's files",
                     path, o.step, o.worldSize, readers.front().name(), h.step, h.worldSize);
    }
    const uint32_t world = h.worldSize;
    const std::set<uint32_t> owners = ownersIn(readers);
    DTRAIN_CHECK_T(CheckpointError, owners.size() == world,
                   "export: module \"{}\" was saved as the shards of the ranks that held it (ZeRO "
                   "stage 3), and {} hold{} those of rank(s) {} of {} only. HINT: export the "
                   "checkpoint's directory, which holds every node's directory (each node's file "
                   "holds its own ranks' shards and the next node's)",
                   chosen, others.empty() ? readers.front().name() : "the files of this step",
                   others.empty() ? "s" : "", fmt::join(owners, ", "), world);
  }
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  std::set<std::string> done;
  for (const auto& r : readers) {
    for (const auto& e : r.entries()) {
      if (e.name.rfind(prefix, 0) != 0 || !done.insert(e.name).second) continue;
      at::Tensor t = at::empty(e.shape, at::dtype(checkpoint::toScalarType(e.dtype)));
      if (e.owner == checkpoint::kReplicated) {
        checkpoint::readTensor(r, r.find(e.name), t);
      } else {
        readShards(readers, e.name, t);
      }
      tensors.emplace_back(e.name.substr(prefix.size()), t);
    }
  }
  return tensors;
}

}  // namespace

void exportStateDict(const std::string& path, const std::string& to, const std::string& module,
                     const std::string& format) {
  exportStateDict(std::vector<std::string>{path}, to, module, format);
}

void exportStateDict(const std::vector<std::string>& paths, const std::string& to,
                     const std::string& module, const std::string& format) {
  DTRAIN_CHECK_ARG(format == "pickle" || format == "libtorch",
                   "export: unknown format \"{}\". HINT: pickle (Python's torch.load) or libtorch "
                   "(C++ torch::load)",
                   format);
  DTRAIN_CHECK_ARG(!paths.empty(), "export: no checkpoint file given");
  const std::string& path = paths.front();
  auto reader = checkpoint::CheckpointReader::open(path);
  std::set<std::string> modules;
  for (const auto& e : reader.entries()) {
    if (e.name.rfind("module/", 0) != 0) continue;
    size_t slash = e.name.find('/', 7);
    if (slash != std::string::npos) modules.insert(e.name.substr(7, slash - 7));
  }
  DTRAIN_CHECK_T(CheckpointError, !modules.empty(), "export: {} holds no module", path);
  std::string chosen = module;
  if (chosen.empty()) {
    DTRAIN_CHECK_ARG(modules.size() == 1,
                     "export: {} holds several modules ({}). HINT: name one with --module", path,
                     fmt::join(modules, ", "));
    chosen = *modules.begin();
  }
  DTRAIN_CHECK_ARG(modules.count(chosen), "export: {} holds no module \"{}\" (it holds: {})", path,
                   chosen, fmt::join(modules, ", "));
  const auto tensors = moduleTensorsOf(
      std::move(reader), std::vector<std::string>(paths.begin() + 1, paths.end()), chosen);
  if (format == "pickle") {
    std::vector<char> bytes = stateDictPickle(tensors);
    std::ofstream out(to, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.close();
    DTRAIN_CHECK_T(CheckpointError, out.good(), "export: writing {} failed", to);
    return;
  }
  ArchiveNode root;
  for (const auto& [name, t] : tensors) root.add(name, t);
  torch::serialize::OutputArchive archive;
  root.writeTo(archive);
  archive.save_to(to);
}

}  // namespace dtrain
