#include "model_sync.h"

#include <map>
#include <sstream>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "dtrain/base/error.h"

namespace dtrain::ddp {

namespace {

// "parameter fc.weight float32 [10, 20]": what every rank must agree on, one line per entry.
std::vector<std::string> describe(const std::vector<NamedTensor>& params,
                                  const std::vector<NamedTensor>& buffers) {
  std::vector<std::string> lines;
  auto add = [&](const char* kind, const NamedTensor& t) {
    lines.push_back(fmt::format("{} {} {} [{}]", kind, t.name,
                                c10::toString(t.tensor.scalar_type()),
                                fmt::join(t.tensor.sizes(), ", ")));
  };
  for (const auto& p : params) add("parameter", p);
  for (const auto& b : buffers) add("buffer", b);
  return lines;
}

// FNV-1a: a fingerprint to compare ranks cheaply, not a security measure.
int64_t fingerprint(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return static_cast<int64_t>(h);
}

std::string rankList(const std::vector<int>& ranks) {
  return fmt::format("{} {}", ranks.size() == 1 ? "rank" : "ranks", fmt::join(ranks, ", "));
}

}  // namespace

void verifySameModel(ProcessGroup& group, const std::vector<NamedTensor>& params,
                     const std::vector<NamedTensor>& buffers) {
  auto lines = describe(params, buffers);
  std::string text = fmt::format("{}", fmt::join(lines, "\n"));
  auto hashes = group.allgatherHost(at::tensor({fingerprint(text)}, at::kLong));
  bool same = true;
  for (const auto& h : hashes) same = same && h.item<int64_t>() == hashes[0].item<int64_t>();
  if (same) return;

  // They differ: exchange the descriptions to say where.
  auto lengths = group.allgatherHost(at::tensor({static_cast<int64_t>(text.size())}, at::kLong));
  int64_t longest = 0;
  for (const auto& l : lengths) longest = std::max(longest, l.item<int64_t>());
  auto mine = at::zeros({longest}, at::kByte);
  std::memcpy(mine.data_ptr(), text.data(), text.size());
  auto texts = group.allgatherHost(mine);
  std::vector<std::vector<std::string>> perRank;
  for (size_t r = 0; r < texts.size(); ++r) {
    std::string s(static_cast<const char*>(texts[r].data_ptr()),
                  static_cast<size_t>(lengths[r].item<int64_t>()));
    std::vector<std::string> entries;
    std::istringstream in(s);
    for (std::string line; std::getline(in, line);) entries.push_back(line);
    perRank.push_back(std::move(entries));
  }
  size_t longestList = 0;
  for (const auto& e : perRank) longestList = std::max(longestList, e.size());
  for (size_t i = 0; i < longestList; ++i) {
    std::map<std::string, std::vector<int>> variants;
    for (size_t r = 0; r < perRank.size(); ++r) {
      variants[i < perRank[r].size() ? perRank[r][i]
                                     : fmt::format("nothing (only {} entries)", perRank[r].size())]
          .push_back(static_cast<int>(r));
    }
    if (variants.size() < 2) continue;
    std::vector<std::string> parts;
    for (const auto& [entry, ranks] : variants) {
      parts.push_back(
          fmt::format("{} {} {}", rankList(ranks), ranks.size() == 1 ? "has" : "have", entry));
    }
    // Rank 0's view first: it is the one every other rank is compared with.
    std::stable_partition(parts.begin(), parts.end(), [&](const std::string& p) {
      return p.rfind("rank 0 ", 0) == 0 || p.rfind("ranks 0,", 0) == 0;
    });
    DTRAIN_THROW(Error,
                 "rank {}: DistributedDataParallel: the model differs across ranks at entry {}: "
                 "{}. HINT: build the same model on every rank (the same modules in the same "
                 "order, with the same sizes and dtypes) before wrapping it",
                 group.rank(), i, fmt::join(parts, "; "));
  }
  DTRAIN_THROW(Error,
               "rank {}: DistributedDataParallel: the ranks' model fingerprints differ but their "
               "descriptions agree. HINT: this is a bug in dtrain; please report it",
               group.rank());
}

CoalescedBroadcast::CoalescedBroadcast(ProcessGroup& group, const std::vector<at::Tensor>& tensors,
                                       size_t bucketBytes)
    : group_(group), kept_(bucketBytes == 0) {
  std::map<at::ScalarType, std::vector<at::Tensor>> byType;
  for (const auto& t : tensors) {
    if (t.numel() > 0) byType[t.scalar_type()].push_back(t);
  }
  for (auto& [type, list] : byType) {
    Group g;
    for (auto& t : list) {
      const size_t bytes = static_cast<size_t>(t.numel()) * t.element_size();
      const size_t open = static_cast<size_t>(g.numel) * t.element_size();
      if (!kept_ && !g.tensors.empty() && open + bytes > bucketBytes) {
        groups_.push_back(std::move(g));
        g = Group();
      }
      g.numel += t.numel();
      g.tensors.push_back(std::move(t));
    }
    if (kept_)
      g.flat = at::empty({g.numel}, at::TensorOptions().dtype(type).device(group_.device()));
    groups_.push_back(std::move(g));
  }
}

namespace {

void pack(const std::vector<at::Tensor>& tensors, at::Tensor& flat) {
  int64_t offset = 0;
  for (const auto& t : tensors) {
    flat.narrow(0, offset, t.numel()).copy_(t.reshape({-1}));
    offset += t.numel();
  }
}

void unpack(const at::Tensor& flat, std::vector<at::Tensor>& tensors) {
  int64_t offset = 0;
  for (auto& t : tensors) {
    t.copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
    offset += t.numel();
  }
}

}  // namespace

void CoalescedBroadcast::run(int root, comm::Millis timeout) {
  at::NoGradGuard noGrad;
  if (!kept_) {
    runBucketed(root, timeout);
    return;
  }
  const bool isRoot = group_.rank() == root;
  std::vector<std::shared_ptr<comm::Work>> works;
  for (auto& g : groups_) {
    if (isRoot) pack(g.tensors, g.flat);
    works.push_back(group_.broadcastAsync(g.flat, root));
  }
  for (size_t k = 0; k < groups_.size(); ++k) {
    works[k]->wait(timeout);
    if (!isRoot) unpack(groups_[k].flat, groups_[k].tensors);
  }
}

void CoalescedBroadcast::runBucketed(int root, comm::Millis timeout) {
  const bool isRoot = group_.rank() == root;
  for (auto& g : groups_) {
    at::Tensor& first = g.tensors.front();
    if (g.tensors.size() == 1 && first.is_contiguous() && first.device() == group_.device()) {
      at::Tensor flat = first.view({-1});  // in place: no copy of the largest tensors
      group_.broadcastAsync(flat, root)->wait(timeout);
      continue;
    }
    at::Tensor flat = at::empty(
        {g.numel}, at::TensorOptions().dtype(first.scalar_type()).device(group_.device()));
    if (isRoot) pack(g.tensors, flat);
    group_.broadcastAsync(flat, root)->wait(timeout);
    if (!isRoot) unpack(flat, g.tensors);
  }
}

}  // namespace dtrain::ddp
