// Communicator::split / newGroup (dtrain/comm/communicator.h): the ranks agree on the groups
// through the store,
// then each backend builds its own kind of communicator over the members (createGroup).
#include <algorithm>
#include <functional>
#include <mutex>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dtrain/base/error.h"
#include "dtrain/comm/communicator.h"

namespace dtrain::comm {

namespace {

struct Entry {
  int color = -1;
  int key = -1;
  std::string list;  // newGroup's rank list as text, "-" for split
};

std::string encode(const Entry& e) { return fmt::format("{} {} {}", e.color, e.key, e.list); }

Entry decode(const std::string& text) {
  Entry e;
  std::istringstream in(text);
  in >> e.color >> e.key >> e.list;
  return e;
}

// Rank 0 collects every rank's entry and posts one table (or an error); the others read it: 2N
// store operations in all instead of N^2.
std::vector<Entry> agree(store::Store& store, const std::string& prefix, int rank, int size,
                         const Entry& mine, Millis timeout, const char* what) {
  store.setString(fmt::format("{}/in/{}", prefix, rank), encode(mine));
  const std::string tableKey = prefix + "/table";
  if (rank == 0) {
    std::vector<std::string> keys;
    for (int r = 0; r < size; ++r) keys.push_back(fmt::format("{}/in/{}", prefix, r));
    store.wait(keys, timeout);
    std::string table;
    std::string error;
    for (int r = 0; r < size; ++r) {
      const std::string text = store.getString(keys[r]);
      const Entry e = decode(text);
      if (error.empty() && e.list != mine.list) {
        error = fmt::format("ERROR {}: the ranks passed different lists: rank 0 passed [{}], "
                            "rank {} passed [{}]. HINT: every rank calls {} with the same ranks, "
                            "and all ranks create their groups in the same order",
                            what, mine.list, r, e.list, what);
      }
      table += text + "\n";
    }
    store.setString(tableKey, error.empty() ? table : error);
    store.flush();
  } else {
    store.wait({tableKey}, timeout);
  }
  const std::string table = store.getString(tableKey);
  DTRAIN_CHECK_ARG(table.rfind("ERROR ", 0) != 0, "rank {}/{}: {}", rank, size, table.substr(6));
  std::vector<Entry> out;
  std::istringstream in(table);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) out.push_back(decode(line));
  }
  DTRAIN_CHECK(static_cast<int>(out.size()) == size,
               "{}: the group table has {} entries for {} "
               "ranks",
               what, out.size(), size);
  return out;
}

std::shared_ptr<Communicator> formGroup(
    Communicator& self, const std::string& prefix, const std::vector<Entry>& entries, int color,
    const GroupOptions& options, Millis defaultTimeout, Millis connectTimeout,
    const std::function<std::shared_ptr<Communicator>(const std::vector<int>&, int,
                                                      const std::string&, Millis, Millis)>& make) {
  if (color < 0) return nullptr;
  std::vector<int> members;
  for (int r = 0; r < static_cast<int>(entries.size()); ++r) {
    if (entries[r].color == color) members.push_back(r);
  }
  std::stable_sort(members.begin(), members.end(), [&](int a, int b) {
    const int ka = entries[a].key < 0 ? a : entries[a].key;
    const int kb = entries[b].key < 0 ? b : entries[b].key;
    return ka != kb ? ka < kb : a < b;
  });
  const int me = static_cast<int>(std::find(members.begin(), members.end(), self.rank()) -
                                  members.begin());
  const Millis timeout = options.timeout > Millis::zero() ? options.timeout : defaultTimeout;
  return make(members, me, fmt::format("{}/c{}", prefix, color), timeout, connectTimeout);
}

}  // namespace

std::shared_ptr<Communicator> Communicator::keepGroup(std::shared_ptr<Communicator> group) {
  if (!group) return group;
  group->isGroup_ = true;
  std::lock_guard<std::mutex> lock(groupsMutex_);
  // Forget the groups the program let go, so that a program making groups in a loop does not
  // grow the list.
  groups_.erase(std::remove_if(groups_.begin(), groups_.end(),
                               [](const std::weak_ptr<Communicator>& g) { return g.expired(); }),
                groups_.end());
  groups_.push_back(group);
  return group;
}

std::vector<std::shared_ptr<Communicator>> Communicator::liveGroups() const {
  std::vector<std::shared_ptr<Communicator>> out;
  std::lock_guard<std::mutex> lock(groupsMutex_);
  for (const auto& g : groups_) {
    if (auto group = g.lock()) out.push_back(std::move(group));
  }
  return out;
}

void Communicator::abortWithGroups(const std::string& reason) {
  // This communicator first: a rank whose subgroup fails from this abort finds the world failed
  // too (TrainingState tells a stale subgroup from a lost node by that).
  abort(reason);
  for (const auto& g : liveGroups()) g->abortWithGroups(reason);
}

std::exception_ptr Communicator::errorWithGroups() const {
  if (std::exception_ptr e = error()) return e;
  for (const auto& g : liveGroups()) {
    if (std::exception_ptr e = g->errorWithGroups()) return e;
  }
  return nullptr;
}

std::shared_ptr<Communicator> Communicator::createGroup(const GroupSpec&) {
  DTRAIN_THROW(InvalidArgument, "{}: the {} backend does not create subgroups", describe(),
               backendName());
}

std::shared_ptr<Communicator> Communicator::split(int color, int key, const GroupOptions& options) {
  const auto ctx = groupContext();
  DTRAIN_CHECK_ARG(ctx.has_value(), "{}: split(): the {} backend does not create subgroups",
                   describe(), backendName());
  DTRAIN_CHECK_ARG(key >= -1, "{}: split(): key {} must be >= 0 (or -1: by rank)", describe(), key);
  const std::string prefix = fmt::format("{}/group{}", ctx->prefix, groupsCreated_++);
  Entry mine{color < 0 ? -1 : color, key, "-"};
  const auto entries = agree(*ctx->store, prefix, rank(), size(), mine, ctx->connectTimeout,
                             "split");
  return keepGroup(
      formGroup(*this, prefix, entries, mine.color, options, ctx->timeout, ctx->connectTimeout,
                [&](const std::vector<int>& members, int me, const std::string& name,
                    Millis timeout, Millis connectTimeout) {
                  return createGroup(GroupSpec{members, me, name, timeout, connectTimeout});
                }));
}

std::shared_ptr<Communicator> Communicator::newGroup(std::vector<int> ranks,
                                                     const GroupOptions& options) {
  const auto ctx = groupContext();
  DTRAIN_CHECK_ARG(ctx.has_value(), "{}: newGroup(): the {} backend does not create subgroups",
                   describe(), backendName());
  std::sort(ranks.begin(), ranks.end());
  DTRAIN_CHECK_ARG(!ranks.empty() &&
                       std::adjacent_find(ranks.begin(), ranks.end()) == ranks.end() &&
                       ranks.front() >= 0 && ranks.back() < size(),
                   "{}: newGroup([{}]): the ranks must be distinct and in 0..{}", describe(),
                   fmt::join(ranks, ", "), size() - 1);
  const bool member = std::binary_search(ranks.begin(), ranks.end(), rank());
  const std::string prefix = fmt::format("{}/group{}", ctx->prefix, groupsCreated_++);
  Entry mine{member ? 0 : -1, -1, fmt::format("{}", fmt::join(ranks, ","))};
  const auto entries = agree(*ctx->store, prefix, rank(), size(), mine, ctx->connectTimeout,
                             "newGroup");
  return keepGroup(
      formGroup(*this, prefix, entries, mine.color, options, ctx->timeout, ctx->connectTimeout,
                [&](const std::vector<int>& members, int me, const std::string& name,
                    Millis timeout, Millis connectTimeout) {
                  return createGroup(GroupSpec{members, me, name, timeout, connectTimeout});
                }));
}

}  // namespace dtrain::comm
