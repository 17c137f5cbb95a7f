// ZeRO's sharded state kept alive across a lost node: mirrors on another node, and the restore
// at the survivors' world size. See Note [Shard mirrors].
//
// Note [Shard mirrors]
// ~~~~~~~~~~~~~~~~~~~~
// Under ZeRO a rank's blocks -- its 1/N of the master weights (the parameters' values where they
// are stepped in place) and of the optimizer's state; at stage 3 of the parameters too, frozen
// units' included -- exist nowhere else in memory, so a lost
// node takes them with it. Under `--on-node-loss continue` TrainingState::tryStep keeps them
// alive: every K steps (TrainingState::setMirrorInterval, 10 by default), at the start of a
// step, each rank sends its blocks to its holder -- the rank of the same local index on the next
// node in rank order (a one-node job: the next rank) -- over a two-member subgroup (the
// communicator has no send/recv: a broadcast from the owner), and receives the blocks of the
// ranks it holds into a pending copy. One allreduce then commits the generation: its success on
// any rank means every rank had received what it holds, so the pending copies become the current
// ones and each rank copies its own blocks as of that generation. The replicated rest of the state
// (samplers, schedulers, scalers, buffers, RNG, other optimizers) is copied by TrainingState at
// the same point.
//
// After a loss the survivors re-form (ProcessGroup::reform) and all roll back to one generation:
// the newest of which every old rank's blocks are on some survivor -- its own copy if it
// survived, else the mirror its holder kept -- and every survivor has its own blocks and its
// replicated copy. A loss during a refresh leaves the pending copies incomplete on some holders;
// the previous generation is then the newest complete one (each survivor still has its blocks of
// it: the own copy is replaced only at the commit, and until then the live blocks are the new
// generation, unchanged since the refresh began at the start of the step). Losing a rank and its
// holder (two adjacent nodes) loses that rank's blocks: restoreFromMirrors() names them and the
// job takes the restart path (its last checkpoint). A rank taken into the running round
// (`launch --on-node-join live`) is one more rank of the new world that holds no old block: it
// offers nothing, is handed its blocks like the others, and the first member tells it the old
// world's block lengths and step counts. No block was lost then, so a member whose failed step had
// not begun its optimizer step also offers its live blocks as that step's generation (keepLive):
// restored, they cost only the step in flight.
//
// The restore keeps the layout rule (Note [Shard layout]): the units are built again for the new
// world (ShardedOptimizer::reformUnits) and every piece of every old block moves to the rank that
// owns its elements now, once: from the survivor that provides the old block (its own when its
// old rank survived -- what it keeps moves nowhere --, else the lowest rank holding its mirror) to
// the new owner, over a subgroup of the two made for the restore (a broadcast per piece, from the
// old copy into the new blocks: Note [Memory of a restore]). A contiguous layout moves most
// elements when N changes -- each rank sends about its 1/N of the sharded state, not only the
// lost ranks' -- which is what ft_bench measures; a layout of fixed virtual shards would move
// only the lost ranks' blocks, at the price of a rank's blocks no longer being one range of the
// flat buffer.
// Memory per rank: the own copy and two copies of the blocks it holds (current and pending), so
// 3 x its sharded state, in the shards' own memory (the device's on a GPU: no host placement).
//
// Note [Memory of a restore]
// A restore runs in a new world, whose blocks are larger than the old copies' (N - lost ranks
// share what N held), so their memory is new, and on the CPU new memory costs a page fault per
// page at first touch (Note [Host buffer reuse] in runtime/comm/host_buffer_pool.h) -- ~0.2 s per
// 277 MB rank on ft_bench's model, paid by every survivor at once, on cores they share. So the
// restore touches the new world's blocks once: each piece is broadcast from the old copy it is
// part of straight into the rank's new blocks (no staging buffer on either side), and those
// blocks -- one tensor laid out as a mirror's payload -- become, once loaded into the live state,
// the memory of the own copy the next refresh packs (at once: a restored generation is mirrored
// again before the step that runs it). Only the held copies of the new world then touch fresh
// memory.
#include "shard_mirror.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "../optimizer_state.h"
#include "../torch_compat.h"
#include "dtrain/base/error.h"
#include "dtrain/base/logging.h"
#include "dtrain/torch/zero.h"
#include "shard_group.h"

namespace dtrain::zero {

at::Tensor masterBlock(ShardUnit& u) { return u.frozen() ? u.ownedParams() : u.optimized(); }

namespace {

torch::optim::OptimizerParamState* mirroredStateOf(ShardUnit& u) {
  auto& optimizer = u.optimizer();
  auto it = optimizer.state().find(compat::optimizerStateKey(u.optimized()));
  return it == optimizer.state().end() ? nullptr : it->second.get();
}

// The tensors of unit `u`'s block in payload order (master, then the fields present) and the
// header entries (step, mask).
std::vector<at::Tensor> liveBlocks(ShardUnit& u, int64_t& step, int64_t& mask) {
  std::vector<at::Tensor> out{masterBlock(u)};
  step = -1;
  mask = 0;
  if (u.frozen()) return out;
  if (auto* state = mirroredStateOf(u)) {
    optim_state::StateFields fields = optim_state::fieldsOf(*state);
    for (size_t i = 0; i < fields.tensors.size(); ++i) {
      if (!fields.tensors[i].second->defined()) continue;
      mask |= int64_t{1} << i;
      out.push_back(*fields.tensors[i].second);
    }
    if (fields.step) step = *fields.step;
  }
  return out;
}

// Per unit: where its master block and each present field start in a payload of `units`.
std::vector<std::vector<int64_t>> payloadOffsets(const std::vector<int64_t>& header,
                                                 const std::vector<UnitLayout>& units) {
  std::vector<std::vector<int64_t>> out(units.size());
  int64_t at = 0;
  for (size_t k = 0; k < units.size(); ++k) {
    const int64_t fields = 1 +
                           __builtin_popcountll(static_cast<unsigned long long>(header[3 + 2 * k]));
    for (int64_t f = 0; f < fields; ++f) {
      out[k].push_back(at);
      at += units[k].shardNumel;
    }
  }
  out.push_back({at});  // the payload's length
  return out;
}

int64_t headerLength(size_t units) { return 2 + 2 * static_cast<int64_t>(units); }

// Empty when `shards` can be mirrored, else why not.
std::string whyNotMirrorable(ShardGroup& shards) {
  const at::Tensor first = masterBlock(shards.unit(0));
  for (size_t k = 0; k < shards.unitCount(); ++k) {
    const at::Tensor t = masterBlock(shards.unit(k));
    if (t.scalar_type() != first.scalar_type()) {
      return fmt::format(
          "{} keeps {} blocks, the first unit {}: mirrors take one dtype (ZeroOptions::"
          "masterWeights gives every 16-bit unit float32 masters)",
          shards.unit(k).describe(), c10::toString(t.scalar_type()),
          c10::toString(first.scalar_type()));
    }
    if (t.device() != shards.group().device()) {
      return fmt::format("{} is offloaded to the host: offloaded shards are not mirrored",
                         shards.unit(k).describe());
    }
  }
  return {};
}

void checkMirrorable(ShardGroup& shards) {
  const std::string why = whyNotMirrorable(shards);
  DTRAIN_CHECK_ARG(why.empty(), "shard mirrors: {}", why);
}

// Pair subgroups aborted because the group's membership changed: one may still wait in a receive
// from a lost rank (Gloo's broadcast is not cut short: Note [Interrupting Gloo]), and destroying
// it would wait for the collective timeout. They are let go without waiting: kept, unreferenced
// by the mirror, until the process ends.
void abandon(const std::vector<std::shared_ptr<ProcessGroup>>& pairs) {
  static std::mutex mutex;
  static auto* abandoned = new std::vector<std::shared_ptr<ProcessGroup>>();
  std::lock_guard<std::mutex> lock(mutex);
  for (const auto& p : pairs) {
    if (p) abandoned->push_back(p);
  }
}

}  // namespace

std::vector<UnitLayout> unitsOf(ShardGroup& shards) {
  std::vector<UnitLayout> out = shards.layout().units;
  const auto& frozen = shards.frozenLayout().units;
  out.insert(out.end(), frozen.begin(), frozen.end());
  return out;
}

// The pairs are subgroups: the membership watcher aborts them with the world at a new epoch
// (abortWithGroups), but an abort does not end a Gloo broadcast's receive in flight, so a pair
// with a lost rank could still wait its whole timeout. So the waits watch the group's
// communicator, and abort (and abandon) the pairs once it failed, rethrowing its failure.
void waitWatching(ProcessGroup& group, std::vector<std::shared_ptr<comm::Work>>& works,
                  const std::vector<std::shared_ptr<ProcessGroup>>& pairs, const char* during) {
  for (auto& w : works) {
    while (!w->isCompleted()) {
      if (std::exception_ptr failed = group.communicator().error()) {
        for (const auto& p : pairs) {
          if (p) p->communicator().abort(fmt::format("the group's membership changed {}", during));
        }
        abandon(pairs);
        std::rethrow_exception(failed);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    w->wait();  // its error, if it failed
  }
  works.clear();
}

void packBlocks(ShardGroup& shards, int64_t generation, PackedBlocks& into) {
  checkMirrorable(shards);
  std::vector<int64_t> header{generation, static_cast<int64_t>(shards.unitCount())};
  std::vector<std::vector<at::Tensor>> blocks;
  int64_t total = 0;
  for (size_t k = 0; k < shards.unitCount(); ++k) {
    int64_t step = -1, mask = 0;
    blocks.push_back(liveBlocks(shards.unit(k), step, mask));
    header.push_back(step);
    header.push_back(mask);
    for (const auto& b : blocks.back()) total += b.numel();
  }
  const at::Tensor first = masterBlock(shards.unit(0));
  if (!into.payload.defined() || into.payload.numel() != total ||
      into.payload.scalar_type() != first.scalar_type()) {
    into.payload = at::empty({total}, first.options());
  }
  int64_t at = 0;
  for (const auto& unit : blocks) {
    for (const auto& b : unit) {
      into.payload.narrow(0, at, b.numel()).copy_(b);
      at += b.numel();
    }
  }
  into.header = std::move(header);
}

void ShardMirror::buildPairs(ProcessGroup& group) {
  const int n = group.size();
  const auto locals = group.allgatherHost(at::tensor({static_cast<int64_t>(group.localRank())}));
  // Nodes: runs of ranks from local rank 0 (launch numbers ranks node by node).
  std::vector<std::pair<int, int>> nodes;  // (first rank, ranks)
  for (int r = 0; r < n; ++r) {
    if (nodes.empty() || locals[static_cast<size_t>(r)].item<int64_t>() == 0) {
      nodes.emplace_back(r, 0);
    }
    ++nodes.back().second;
  }
  holderOf_.assign(static_cast<size_t>(n), -1);
  for (size_t i = 0; i < nodes.size(); ++i) {
    const auto [first, count] = nodes[i];
    const auto [nextFirst, nextCount] = nodes[(i + 1) % nodes.size()];
    for (int l = 0; l < count; ++l) {
      holderOf_[static_cast<size_t>(first + l)] = nodes.size() == 1 ? (first + l + 1) % n
                                                                    : nextFirst + l % nextCount;
    }
  }
  pairs_.assign(static_cast<size_t>(n), nullptr);
  for (int r = 0; r < n; ++r) {  // in rank order on every rank: newGroup is collective
    const int h = holderOf_[static_cast<size_t>(r)];
    if (h == r) continue;
    try {
      pairs_[static_cast<size_t>(r)] = group.newGroup({r, h});
    } catch (const InvalidArgument& e) {
      DTRAIN_THROW(InvalidArgument,
                   "shard mirrors: the {} backend makes no subgroups, and a mirror goes to its "
                   "holder over one ({}). HINT: --on-node-loss restart",
                   group.backend(), e.what());
    }
  }
  held_.clear();
  for (int r = 0; r < n; ++r) {
    if (holderOf_[static_cast<size_t>(r)] == group.rank() && r != group.rank()) {
      held_.push_back(Held{r, {}, {}, false});
    }
  }
  DTRAIN_CHECK(static_cast<int>(held_.size()) <= kMaxHeld,
               "shard mirrors: rank {} would hold the blocks of {} ranks (at most {})",
               group.rank(), held_.size(), kMaxHeld);
  epoch_ = group.epoch();
}

void ShardMirror::refresh(ShardGroup& shards, int64_t generation) {
  ProcessGroup& group = shards.group();
  if (group.size() < 2) return;
  checkMirrorable(shards);
  if (epoch_ != group.epoch() || pairs_.size() != static_cast<size_t>(group.size())) {
    buildPairs(group);
  }
  const int me = group.rank();
  refreshing_ = generation;
  oldRank_ = me;
  oldUnits_ = unitsOf(shards);
  for (auto& h : held_) h.pendingDone = false;

  // The headers, then the blocks: this rank's from its live tensors (nothing copied to send),
  // the held ranks' into their pending copies.
  std::vector<int64_t> header{generation, static_cast<int64_t>(shards.unitCount())};
  std::vector<at::Tensor> mine;
  for (size_t k = 0; k < shards.unitCount(); ++k) {
    int64_t step = -1, mask = 0;
    for (auto& b : liveBlocks(shards.unit(k), step, mask)) mine.push_back(b);
    header.push_back(step);
    header.push_back(mask);
  }
  const int64_t hlen = headerLength(shards.unitCount());
  std::vector<std::shared_ptr<comm::Work>> works;
  std::vector<at::Tensor> headers(static_cast<size_t>(group.size()));
  for (int r = 0; r < group.size(); ++r) {
    auto& pair = pairs_[static_cast<size_t>(r)];
    if (!pair) continue;
    const int root = r < holderOf_[static_cast<size_t>(r)] ? 0 : 1;  // members are sorted
    at::Tensor& h = headers[static_cast<size_t>(r)];
    h = r == me ? at::tensor(header, at::kLong).to(group.device())
                : at::empty({hlen}, at::TensorOptions(at::kLong).device(group.device()));
    works.push_back(pair->broadcastAsync(h, root));
  }
  waitWatching(group, works, pairs_, "during a mirror refresh");
  std::vector<at::Tensor> keep;  // what the broadcasts read or write, alive until they end
  for (int r = 0; r < group.size(); ++r) {
    auto& pair = pairs_[static_cast<size_t>(r)];
    if (!pair) continue;
    const int root = r < holderOf_[static_cast<size_t>(r)] ? 0 : 1;
    if (r == me) {
      for (auto& b : mine) {
        keep.push_back(b);
        works.push_back(pair->broadcastAsync(keep.back(), root));
      }
      continue;
    }
    auto it = std::find_if(held_.begin(), held_.end(), [&](const Held& h) { return h.owner == r; });
    DTRAIN_CHECK(it != held_.end(), "shard mirrors: rank {} is in rank {}'s pair but holds none",
                 me, r);
    const at::Tensor h = headers[static_cast<size_t>(r)].cpu();
    it->pending.header.assign(h.data_ptr<int64_t>(), h.data_ptr<int64_t>() + hlen);
    DTRAIN_CHECK(it->pending.header[1] == static_cast<int64_t>(shards.unitCount()) &&
                     it->pending.header[0] == generation,
                 "shard mirrors: rank {} sent {} units of generation {}, rank {} has {} units "
                 "at generation {}",
                 r, it->pending.header[1], it->pending.header[0], me, shards.unitCount(),
                 generation);
    const auto offsets = payloadOffsets(it->pending.header, oldUnits_);
    const int64_t total = offsets.back().front();
    if (!it->pending.payload.defined() || it->pending.payload.numel() != total) {
      it->pending.payload = at::empty({total}, masterBlock(shards.unit(0)).options());
    }
    for (size_t k = 0; k < shards.unitCount(); ++k) {
      for (int64_t off : offsets[k]) {
        keep.push_back(it->pending.payload.narrow(0, off, oldUnits_[k].shardNumel));
        works.push_back(pair->broadcastAsync(keep.back(), root));
      }
    }
  }
  waitWatching(group, works, pairs_, "during a mirror refresh");
  for (auto& h : held_) h.pendingDone = true;

  // The commit: its success here means every rank received what it holds.
  at::Tensor done = at::ones({1}, at::TensorOptions().device(group.device()));
  group.allreduce(done);
  for (auto& h : held_) {
    std::swap(h.current, h.pending);
    h.pendingDone = false;
  }
  packBlocks(shards, generation, own_);
  refreshing_ = -1;
}

size_t ShardMirror::bytes() const {
  size_t total = 0;
  auto add = [&](const PackedBlocks& b) {
    if (b.payload.defined()) total += b.payload.numel() * b.payload.element_size();
  };
  add(own_);
  for (const auto& h : held_) {
    add(h.current);
    add(h.pending);
  }
  return total;
}

at::Tensor ShardMirror::offer() const {
  at::Tensor t = at::full({kOfferLength}, int64_t{-1}, at::kLong);
  auto a = t.accessor<int64_t, 1>();
  a[0] = oldRank_;
  a[1] = static_cast<int64_t>(holderOf_.size());
  a[2] = own_.generation();
  a[3] = refreshing_;
  a[4] = live_.generation();
  int64_t at = 5;
  a[at++] = 0;  // count of held entries, below
  const int64_t countAt = at - 1;
  for (const auto& h : held_) {
    if (h.current.generation() >= 0) {
      a[at++] = h.owner;
      a[at++] = h.current.generation();
    }
    if (h.pendingDone && h.pending.generation() >= 0) {
      a[at++] = h.owner;
      a[at++] = h.pending.generation();
    }
  }
  a[countAt] = (at - countAt - 1) / 2;
  return t;
}

ShardMirror::Offer ShardMirror::parse(const at::Tensor& offer) {
  auto a = offer.accessor<int64_t, 1>();
  Offer o;
  o.oldRank = static_cast<int>(a[0]);
  o.oldWorld = static_cast<int>(a[1]);
  for (int i = 2; i < 5; ++i) {
    if (a[i] >= 0) o.own.push_back(a[i]);
  }
  const int64_t count = a[5];
  for (int64_t i = 0; i < count; ++i) {
    o.held.emplace_back(static_cast<int>(a[6 + 2 * i]), a[7 + 2 * i]);
  }
  return o;
}

void ShardMirror::prepareRestore(ShardGroup& shards, int64_t generation) {
  if (refreshing_ == generation && own_.generation() != generation) {
    packBlocks(shards, generation, own_);
  }
  refreshing_ = -1;
}

void ShardMirror::keepLive(ShardGroup& shards, int64_t generation) {
  if (oldRank_ < 0 || generation < 0) return;  // no world the mirrors were made in
  packBlocks(shards, generation, live_);
}

const PackedBlocks* ShardMirror::blocksOf(int owner, int64_t generation) const {
  if (owner == oldRank_ && own_.generation() == generation) return &own_;
  if (owner == oldRank_ && live_.generation() == generation) return &live_;
  for (const auto& h : held_) {
    if (h.owner != owner) continue;
    if (h.current.generation() == generation) return &h.current;
    if (h.pending.generation() == generation) return &h.pending;
  }
  return nullptr;
}

void ShardMirror::reset(at::Tensor spare) {
  epoch_ = -1;
  holderOf_.clear();
  pairs_.clear();
  oldRank_ = -1;
  oldUnits_.clear();
  own_ = {};
  own_.payload = std::move(spare);  // no generation: memory for packBlocks, nothing to offer
  live_ = {};
  refreshing_ = -1;
  held_.clear();
}

}  // namespace dtrain::zero

namespace dtrain {

zero::ShardMirror& ShardedOptimizer::mirror() {
  if (!mirror_) mirror_ = std::make_unique<zero::ShardMirror>();
  return *mirror_;
}

void ShardedOptimizer::refreshMirror(int64_t generation) {
  DTRAIN_CHECK_ARG(reformable(),
                   "ShardedOptimizer: shard mirrors are for an optimizer built through a "
                   "DistributedDataParallel wrapper");
  at::NoGradGuard noGrad;
  shards_->settleGathers();
  mirror().refresh(*shards_, generation);
}

void ShardedOptimizer::keepLiveBlocks(int64_t generation) {
  at::NoGradGuard noGrad;
  mirror().keepLive(*shards_, generation);
}

std::string ShardedOptimizer::whyNotMirrored() {
  if (!reformable()) {
    return "it was built over a DdpCore, not through the DistributedDataParallel wrapper";
  }
  return zero::whyNotMirrorable(*shards_);
}

size_t ShardedOptimizer::mirrorBytes() const { return mirror_ ? mirror_->bytes() : 0; }

namespace {

using zero::PackedBlocks;
using zero::ShardMirror;

// The old world's size: every member's offer names it; a newcomer's (oldRank -1) names none.
int oldWorldOf(const std::vector<ShardMirror::Offer>& perRank) {
  int n = 0;
  for (const auto& o : perRank) n = std::max(n, o.oldWorld);
  return n;
}

// The newest generation every old rank's blocks are somewhere of, for every optimizer; -1 with
// `why` otherwise. A rank that joined the running round (oldRank -1) holds nothing and needs
// nothing of its own: it is handed its blocks and the replicated state.
int64_t chooseGeneration(const std::vector<std::vector<ShardMirror::Offer>>& offers,
                         const std::vector<std::vector<int64_t>>& replicated, std::string& why) {
  std::set<int64_t, std::greater<>> candidates;
  for (const auto& o : offers.front()) candidates.insert(o.own.begin(), o.own.end());
  std::string firstWhy;
  for (int64_t g : candidates) {
    std::set<int> missing;
    bool everySurvivor = true;
    for (size_t s = 0; s < replicated.size(); ++s) {
      if (offers.front()[s].oldRank < 0) continue;
      if (std::find(replicated[s].begin(), replicated[s].end(), g) == replicated[s].end()) {
        everySurvivor = false;
      }
    }
    for (const auto& perRank : offers) {
      const int oldWorld = oldWorldOf(perRank);
      for (const auto& o : perRank) {
        if (o.oldRank < 0) continue;
        if (std::find(o.own.begin(), o.own.end(), g) == o.own.end()) everySurvivor = false;
      }
      for (int old = 0; old < oldWorld; ++old) {
        bool found = false;
        for (const auto& o : perRank) {
          if (o.oldRank == old && std::find(o.own.begin(), o.own.end(), g) != o.own.end()) {
            found = true;
          }
          for (const auto& [owner, gen] : o.held) found = found || (owner == old && gen == g);
        }
        if (!found) missing.insert(old);
      }
    }
    if (everySurvivor && missing.empty()) return g;
    // Why is told of the newest generation some rank mirrored: one kept live after a failure
    // (ShardMirror::keepLive) has no copy on another node by design.
    bool mirrored = false;
    for (const auto& perRank : offers) {
      for (const auto& o : perRank) {
        for (const auto& [owner, gen] : o.held) mirrored = mirrored || gen == g;
      }
    }
    if (firstWhy.empty() && mirrored) {
      firstWhy = missing.empty()
                     ? fmt::format("a survivor lacks its own state of generation {}", g)
                     : fmt::format("the blocks of rank(s) {} of the old world at the start of "
                                   "step {} are on no survivor (each rank and the rank keeping "
                                   "its mirror were lost)",
                                   fmt::join(missing, ", "), g);
    }
  }
  why = firstWhy.empty() ? "no survivor holds a mirrored generation yet" : firstWhy;
  return -1;
}

// One piece of a unit's field that moves from one new rank to another: flat positions
// [begin, begin + len) of unit `unit`, field `field`, held as old rank `old`'s block.
struct Piece {
  size_t unit;
  size_t field;
  int old;
  int64_t begin;
  int64_t len;
};

// Every old block to the new rank that owns its elements now (Note [Shard mirrors]): each piece
// goes once, from the new rank that provides its old block to the one that owns it now, over a
// subgroup of the two (the communicator has no send/recv), made only for the restore: a
// broadcast per piece, from the old block it is part of straight into the new block, so that no
// staging memory is touched (Note [Memory of a restore]). Fills `packed`, this rank's new blocks
// of every unit and field in a mirror payload's order (zero where no element is), and
// `blocks[k][f]`, its views per unit k and field f; returns the bytes this rank sent.
uint64_t redistribute(ProcessGroup& group, const zero::ShardMirror& mirror, int64_t generation,
                      const std::vector<UnitLayout>& oldUnits, const std::vector<UnitLayout>& units,
                      const std::vector<size_t>& fieldCount, const std::vector<int>& provider,
                      const at::TensorOptions& options, at::Tensor& packed,
                      std::vector<std::vector<at::Tensor>>& blocks) {
  const int n = group.size();
  const int me = group.rank();
  int64_t total = 0;
  for (size_t k = 0; k < units.size(); ++k) {
    total += units[k].shardNumel * static_cast<int64_t>(fieldCount[k]);
  }
  packed = at::zeros({total}, options);
  blocks.assign(units.size(), {});
  int64_t at = 0;
  for (size_t k = 0; k < units.size(); ++k) {
    for (size_t f = 0; f < fieldCount[k]; ++f) {
      blocks[k].push_back(packed.narrow(0, at, units[k].shardNumel));
      at += units[k].shardNumel;
    }
  }
  // from -> to -> pieces, the same lists on every rank.
  std::vector<std::vector<std::vector<Piece>>> moves(
      static_cast<size_t>(n), std::vector<std::vector<Piece>>(static_cast<size_t>(n)));
  // The old blocks this rank provides, and where each unit's field starts in their payload.
  std::vector<const zero::PackedBlocks*> provided(provider.size(), nullptr);
  std::vector<std::vector<std::vector<int64_t>>> offsets(provider.size());
  for (size_t old = 0; old < provider.size(); ++old) {
    if (provider[old] != me) continue;
    provided[old] = mirror.blocksOf(static_cast<int>(old), generation);
    DTRAIN_CHECK(provided[old] != nullptr,
                 "restoreFromMirrors: rank {} has no blocks of old rank {} at {}", me, old,
                 generation);
    offsets[old] = zero::payloadOffsets(provided[old]->header, oldUnits);
  }
  auto payloadOf = [&](int old, size_t k, size_t f, int64_t flatBegin, int64_t len) {
    const auto o = static_cast<size_t>(old);
    return provided[o]->payload.narrow(
        0, offsets[o][k][f] + flatBegin - oldUnits[k].shardNumel * old, len);
  };
  for (size_t k = 0; k < units.size(); ++k) {
    const int64_t was = oldUnits[k].shardNumel;
    const int64_t now = units[k].shardNumel;
    const int64_t numel = units[k].numel;
    for (int old = 0; old < static_cast<int>(provider.size()); ++old) {
      const int64_t oldBegin = was * old;
      const int64_t oldEnd = std::min(oldBegin + was, numel);
      const int from = provider[static_cast<size_t>(old)];
      for (int to = 0; to < n && oldBegin < oldEnd; ++to) {
        const int64_t begin = std::max(oldBegin, now * to);
        const int64_t end = std::min(oldEnd, now * (to + 1));
        if (begin >= end) continue;
        for (size_t f = 0; f < fieldCount[k]; ++f) {
          if (from == to) {
            if (from == me) {
              blocks[k][f]
                  .narrow(0, begin - now * me, end - begin)
                  .copy_(payloadOf(old, k, f, begin, end - begin));
            }
            continue;
          }
          moves[static_cast<size_t>(from)][static_cast<size_t>(to)].push_back(
              {k, f, old, begin, end - begin});
        }
      }
    }
  }
  // The pairs that exchange anything, in one order everywhere (newGroup is collective).
  std::vector<std::shared_ptr<ProcessGroup>> pairs;
  std::vector<std::pair<int, int>> members;
  for (int a = 0; a < n; ++a) {
    for (int b = a + 1; b < n; ++b) {
      const auto& ab = moves[static_cast<size_t>(a)][static_cast<size_t>(b)];
      const auto& ba = moves[static_cast<size_t>(b)][static_cast<size_t>(a)];
      if (ab.empty() && ba.empty()) continue;
      pairs.push_back(group.newGroup({a, b}));
      members.emplace_back(a, b);
    }
  }
  uint64_t sent = 0;
  std::vector<std::shared_ptr<comm::Work>> works;
  std::vector<at::Tensor> keep;  // what the broadcasts read or write, alive until they end
  for (size_t i = 0; i < pairs.size(); ++i) {
    const auto [a, b] = members[i];
    if (me != a && me != b) continue;
    // a -> b first (root 0: members are sorted), then b -> a, piece by piece on both members.
    for (const auto& [from, to, root] : {std::tuple{a, b, 0}, std::tuple{b, a, 1}}) {
      for (const auto& p : moves[static_cast<size_t>(from)][static_cast<size_t>(to)]) {
        if (me == from) {
          keep.push_back(payloadOf(p.old, p.unit, p.field, p.begin, p.len));
          sent += static_cast<uint64_t>(p.len) * keep.back().element_size();
        } else {
          keep.push_back(
              blocks[p.unit][p.field].narrow(0, p.begin - units[p.unit].shardNumel * me, p.len));
        }
        works.push_back(pairs[i]->broadcastAsync(keep.back(), root));
      }
    }
  }
  zero::waitWatching(group, works, pairs, "during a restore");
  return sent;
}

}  // namespace

int64_t restoreFromMirrors(const std::vector<ShardedOptimizer*>& optimizers, ProcessGroup& group,
                           const std::vector<int64_t>& replicated, std::string& why,
                           uint64_t* bytesSent, int* joined) {
  DTRAIN_CHECK_ARG(!optimizers.empty(), "restoreFromMirrors: no optimizers");
  if (bytesSent) *bytesSent = 0;
  if (joined) *joined = 0;
  at::NoGradGuard noGrad;
  std::vector<std::vector<ShardMirror::Offer>> offers;
  for (auto* opt : optimizers) {
    std::vector<ShardMirror::Offer> perRank;
    for (const auto& t : group.allgatherHost(opt->mirror().offer())) {
      perRank.push_back(ShardMirror::parse(t));
    }
    offers.push_back(std::move(perRank));
  }
  at::Tensor mine = at::full({3}, int64_t{-1}, at::kLong);
  for (size_t i = 0; i < std::min<size_t>(3, replicated.size()); ++i) {
    mine[static_cast<int64_t>(i)] = replicated[i];
  }
  std::vector<std::vector<int64_t>> replicatedOf;
  for (const auto& t : group.allgatherHost(mine)) {
    replicatedOf.push_back({t[0].item<int64_t>(), t[1].item<int64_t>(), t[2].item<int64_t>()});
  }
  const int64_t g = chooseGeneration(offers, replicatedOf, why);
  if (g < 0) return -1;
  // Ranks taken into the running round (Note [Joining a running round]) have no old blocks: the
  // first member says what the old world's were.
  int newcomers = 0;
  int firstMember = -1;
  for (int s = 0; s < group.size(); ++s) {
    if (offers.front()[static_cast<size_t>(s)].oldRank < 0) {
      ++newcomers;
    } else if (firstMember < 0) {
      firstMember = s;
    }
  }
  DTRAIN_CHECK(firstMember >= 0, "restoreFromMirrors: no rank of the old world");
  if (joined) *joined = newcomers;

  for (size_t j = 0; j < optimizers.size(); ++j) {
    ShardedOptimizer& opt = *optimizers[j];
    ShardMirror& mirror = opt.mirror();
    const bool newcomer = offers[j][static_cast<size_t>(group.rank())].oldRank < 0;
    std::vector<UnitLayout> oldUnits;
    std::vector<int64_t> header;
    if (!newcomer) {
      mirror.prepareRestore(opt.shards(), g);
      oldUnits = mirror.oldUnits();
      const PackedBlocks* ownBlocks = mirror.blocksOf(mirror.oldRank(), g);
      DTRAIN_CHECK(ownBlocks != nullptr, "restoreFromMirrors: rank {} lost its own generation {}",
                   group.rank(), g);
      header = ownBlocks->header;
    }
    // Who provides each old rank's blocks: that rank itself when it survived with them (what
    // it keeps moves nowhere), else the lowest new rank that holds them.
    std::vector<int> provider(static_cast<size_t>(oldWorldOf(offers[j])), -1);
    for (int s = static_cast<int>(offers[j].size()) - 1; s >= 0; --s) {
      for (const auto& [owner, gen] : offers[j][static_cast<size_t>(s)].held) {
        if (gen == g) provider[static_cast<size_t>(owner)] = s;
      }
    }
    for (int s = 0; s < static_cast<int>(offers[j].size()); ++s) {
      const auto& o = offers[j][static_cast<size_t>(s)];
      if (o.oldRank >= 0 && std::find(o.own.begin(), o.own.end(), g) != o.own.end()) {
        provider[static_cast<size_t>(o.oldRank)] = s;
      }
    }
    opt.reformUnits();
    zero::ShardGroup& shards = opt.shards();
    const std::vector<UnitLayout> units = zero::unitsOf(shards);
    if (newcomers > 0) {
      // The header (step counts, fields present) and the old blocks' lengths, from the first
      // member: all a newcomer needs to place every piece it receives.
      const auto u = static_cast<int64_t>(units.size());
      at::Tensor shared = at::empty({zero::headerLength(units.size()) + u}, at::kLong);
      if (group.rank() == firstMember) {
        DTRAIN_CHECK(static_cast<int64_t>(header.size()) == zero::headerLength(units.size()) &&
                         oldUnits.size() == units.size(),
                     "restoreFromMirrors: {} units now, {} before", units.size(), oldUnits.size());
        std::copy(header.begin(), header.end(), shared.data_ptr<int64_t>());
        for (int64_t k = 0; k < u; ++k) {
          shared.data_ptr<int64_t>()[static_cast<int64_t>(header.size()) + k] =
              oldUnits[static_cast<size_t>(k)].shardNumel;
        }
      }
      group.broadcastHost(shared, firstMember);
      if (newcomer) {
        const int64_t* a = shared.data_ptr<int64_t>();
        header.assign(a, a + zero::headerLength(units.size()));
        oldUnits = units;  // their elements and offsets; the block length was the old world's
        for (int64_t k = 0; k < u; ++k) {
          oldUnits[static_cast<size_t>(k)].shardNumel = a[static_cast<int64_t>(header.size()) + k];
        }
      }
    }
    DTRAIN_CHECK(units.size() == oldUnits.size(),
                 "restoreFromMirrors: {} units now, {} before the loss", units.size(),
                 oldUnits.size());
    const int me = group.rank();
    // Per unit: its fields ("master" first, then the optimizer's present), its step count.
    std::vector<std::vector<std::string>> names(units.size());
    std::vector<size_t> fieldCount(units.size());
    std::vector<int64_t> steps(units.size(), -1);
    for (size_t k = 0; k < units.size(); ++k) {
      DTRAIN_CHECK(oldUnits[k].numel == units[k].numel,
                   "restoreFromMirrors: unit {} has {} elements, {} before", k, units[k].numel,
                   oldUnits[k].numel);
      names[k].emplace_back("master");
      const int64_t mask = header[3 + 2 * k];
      if (k < shards.size()) {  // a trained unit: its optimizer's fields
        const char* type = optim_state::optimizerType(shards.unit(k).optimizer());
        DTRAIN_CHECK_ARG(type != nullptr,
                         "restoreFromMirrors: the real optimizer's type is not one whose state "
                         "can be loaded (SGD, Adam, AdamW, Adagrad, RMSprop)");
        auto probe = optim_state::newParamState(type);
        const optim_state::StateFields fields = optim_state::fieldsOf(*probe);
        for (size_t i = 0; i < fields.tensors.size(); ++i) {
          if (mask & (int64_t{1} << i)) names[k].emplace_back(fields.tensors[i].first);
        }
      }
      fieldCount[k] = names[k].size();
      steps[k] = header[2 + 2 * k];
    }
    at::Tensor packed;
    std::vector<std::vector<at::Tensor>> blocks;
    const uint64_t sent = redistribute(group, mirror, g, oldUnits, units, fieldCount, provider,
                                       zero::masterBlock(shards.unit(0)).options(), packed, blocks);
    if (bytesSent) *bytesSent += sent;
    // The reader loadShardState() asks, by parameter name and element range.
    std::unordered_map<std::string, std::pair<size_t, int64_t>> where;  // unit, flat offset
    for (size_t k = 0; k < units.size(); ++k) {
      const auto& params = shards.unit(k).params();
      for (size_t j2 = 0; j2 < params.size(); ++j2) {
        where[params[j2].name] = {k, units[k].offsets[j2]};
      }
    }
    opt.loadShardState([&](const ShardField& what, at::Tensor& out) {
      auto it = where.find(what.param);
      DTRAIN_CHECK(it != where.end(), "restoreFromMirrors: no unit has {}", what.param);
      const auto [k, offset] = it->second;
      if (what.field == "step") {
        if (steps[k] < 0) return false;
        out.fill_(steps[k]);
        return true;
      }
      auto f = std::find(names[k].begin(), names[k].end(), what.field);
      if (f == names[k].end()) return false;
      const int64_t at = offset + what.begin - units[k].shardNumel * me;
      out.copy_(blocks[k][static_cast<size_t>(f - names[k].begin())].narrow(0, at,
                                                                            what.end - what.begin));
      return true;
    });
    mirror.reset(std::move(packed));  // the next refresh's own copy (Note [Memory of a restore])
  }
  return g;
}

}  // namespace dtrain
