#include "checkpoint/agreement.h"

#include <algorithm>

#include <fmt/format.h>

#include "dtrain/base/error.h"
#include "parse_int.h"

namespace dtrain::checkpoint {

namespace {

using Clock = std::chrono::steady_clock;

Millis remaining(Clock::time_point start, Millis deadline) {
  auto left = deadline - std::chrono::duration_cast<Millis>(Clock::now() - start);
  return std::max(left, Millis(1));
}

int64_t parseNumber(const std::string& text, const std::string& key) {
  int64_t v = 0;
  DTRAIN_CHECK_T(CheckpointError, parseInt64(text, &v),
                 "checkpoint agreement: key \"{}\" holds \"{}\", not a number", key,
                 text.substr(0, 40));
  return v;
}

}  // namespace

StoreAgreement::StoreAgreement(std::shared_ptr<store::Store> store, std::string prefix, int rank,
                               int world)
    : store_(std::move(store)), prefix_(std::move(prefix)), rank_(rank), world_(world) {
  DTRAIN_CHECK_ARG(store_ != nullptr, "StoreAgreement needs a store");
  DTRAIN_CHECK_ARG(world_ >= 1 && rank_ >= 0 && rank_ < world_, "StoreAgreement: rank {} of {}",
                   rank_, world_);
}

std::string StoreAgreement::key(int64_t round, const std::string& name) const {
  return fmt::format("{}/{}/{}", prefix_, round, name);
}

std::vector<Report> StoreAgreement::exchange(int64_t code, Millis deadline,
                                             const std::string& what) {
  if (world_ == 1) return code ? std::vector<Report>{{rank_, code}} : std::vector<Report>{};
  const auto start = Clock::now();
  const int64_t n = ++round_;
  if (code != 0) {
    // Before arriving: whoever sees the round done finds the report in place (one connection
    // applies its requests in order).
    const int64_t slot = store_->add(key(n, "failed"), 1);
    store_->setString(key(n, fmt::format("failed/{}", slot)), fmt::format("{} {}", rank_, code));
  }
  const std::string in = key(n, fmt::format("in/{}", rank_));
  store_->setString(in, "1");
  const int64_t arrived = store_->add(key(n, "arrived"), 1);
  if (!myStaleIn_.empty()) store_->deleteKey(myStaleIn_);
  myStaleIn_ = in;
  if (arrived == world_) {
    for (const auto& k : stale_) store_->deleteKey(k);
    store_->setString(key(n, "done"), "1");
  }
  try {
    store_->wait({key(n, "done")}, remaining(start, deadline));
  } catch (const TimeoutError& e) {
    timedOut(n, deadline, what, e.what());
  }
  const int64_t failures = store_->add(key(n, "failed"), 0);
  stale_ = {key(n, "arrived"), key(n, "done"), key(n, "failed")};
  std::vector<Report> reports;
  for (int64_t slot = 1; slot <= failures; ++slot) {
    const std::string k = key(n, fmt::format("failed/{}", slot));
    const std::string text = store_->getString(k);
    stale_.push_back(k);
    const size_t space = text.find(' ');
    Report r;
    r.rank = static_cast<int>(parseNumber(text.substr(0, space), k));
    r.code = parseNumber(space == std::string::npos ? "" : text.substr(space + 1), k);
    reports.push_back(r);
  }
  std::sort(reports.begin(), reports.end(),
            [](const Report& a, const Report& b) { return a.rank < b.rank; });
  return reports;
}

int64_t StoreAgreement::share(int root, int64_t value, Millis deadline, const std::string& what) {
  DTRAIN_CHECK_ARG(root >= 0 && root < world_, "StoreAgreement::share: root {} of {}", root,
                   world_);
  if (world_ == 1) return value;
  const int64_t n = ++round_;
  const std::string k = key(n, "value");
  stale_.push_back(k);
  if (rank_ == root) {
    store_->setString(k, std::to_string(value));
    return value;
  }
  try {
    store_->wait({k}, deadline);
  } catch (const TimeoutError&) {
    DTRAIN_THROW(TimeoutError,
                 "rank {}/{}: timed out after {} ms waiting for rank {} to say {} (key \"{}\" on "
                 "store {}). HINT: that rank may be stuck reading or writing its checkpoint "
                 "directory (a hung disk or filesystem), or it died",
                 rank_, world_, deadline.count(), root, what, k, store_->describe());
  }
  return parseNumber(store_->getString(k), k);
}

std::vector<int> StoreAgreement::missing(int64_t round) {
  std::vector<int> out;
  for (int r = 0; r < world_; ++r) {
    try {
      if (!store_->check({key(round, fmt::format("in/{}", r))})) out.push_back(r);
    } catch (const std::exception&) {
      return out;  // the store itself is gone: the caller's message says so already
    }
  }
  return out;
}

void StoreAgreement::timedOut(int64_t round, Millis deadline, const std::string& what,
                              const std::string& waitError) {
  const std::vector<int> absent = missing(round);
  std::vector<std::string> names;
  for (size_t i = 0; i < absent.size() && i < 16; ++i) names.push_back(std::to_string(absent[i]));
  if (absent.size() > names.size()) names.push_back(fmt::format("and {} more", absent.size() - 16));
  DTRAIN_THROW(TimeoutError,
               "rank {}/{}: timed out after {} ms agreeing on {}: {} did not report ({} of {} "
               "did; store {}). HINT: a node's writer may be stuck writing its checkpoint "
               "directory (a hung disk or filesystem: raise CheckpointOptions::timeout only if "
               "the disk is just slow), or a rank died. ({})",
               rank_, world_, deadline.count(), what,
               absent.empty() ? std::string("every rank reported, but the round did not close")
                              : fmt::format("rank(s) {}", fmt::join(names, ", ")),
               world_ - static_cast<int>(absent.size()), world_, store_->describe(), waitError);
}

}  // namespace dtrain::checkpoint
