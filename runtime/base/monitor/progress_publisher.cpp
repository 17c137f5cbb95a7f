#include "monitor/progress_publisher.h"

#include <pthread.h>

#include <algorithm>
#include <cstdlib>

#include "dtrain/base/error.h"
#include "dtrain/base/job_store.h"
#include "dtrain/base/logging.h"
#include "env_contract.h"
#include "parse_int.h"
#include "store/auth.h"

namespace dtrain::progress {

namespace {

double unixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

ProgressPublisher::ProgressPublisher(PublisherOptions options) : options_(std::move(options)) {
  thread_ = std::thread([this] { threadMain(); });
}

ProgressPublisher::~ProgressPublisher() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void ProgressPublisher::setStep(int64_t step) {
  std::lock_guard<std::mutex> lock(mutex_);
  step_ = step;
}

void ProgressPublisher::addRecord(metrics::Record record) {
  if (record.time == 0) record.time = unixNow();
  // A bad name is dropped here rather than failing the report (and publishing) later.
  std::vector<metrics::Field> fields;
  fields.reserve(record.fields.size());
  for (auto& field : record.fields) {
    const bool repeated = std::any_of(fields.begin(), fields.end(), [&](const metrics::Field& f) {
      return f.first == field.first;
    });
    if (metrics::validFieldName(field.first) && !repeated) fields.push_back(std::move(field));
  }
  record.fields = std::move(fields);
  std::lock_guard<std::mutex> lock(mutex_);
  // The newest step: a record made later for an earlier step (a checkpoint's background write,
  // recorded under the step it saved) does not move the rank's step back.
  if (record.step) {
    if (!step_ || *record.step > *step_) step_ = record.step;
    if (!figuresStep_ || *record.step > *figuresStep_) figuresStep_ = record.step;
  }
  figuresTime_ = record.time;
  for (const auto& [name, value] : record.fields) {
    auto it = std::find_if(figures_.begin(), figures_.end(),
                           [&](const auto& f) { return f.first == name; });
    if (it == figures_.end()) {
      figures_.emplace_back(name, value);
    } else {
      it->second = value;
    }
  }
  recent_.push_back(std::move(record));
  ++recorded_;
  while (recent_.size() > options_.recentRecords) recent_.pop_front();
}

void ProgressPublisher::setFigures(int64_t step,
                                   std::vector<std::pair<std::string, double>> fields) {
  metrics::Record record;
  record.step = step;
  record.fields = std::move(fields);
  addRecord(std::move(record));
}

uint64_t ProgressPublisher::addSource(std::function<CollectiveState()> source) {
  std::lock_guard<std::mutex> lock(sourcesMutex_);
  const uint64_t id = nextSourceId_++;
  sources_.emplace(id, std::move(source));
  return id;
}

void ProgressPublisher::removeSource(uint64_t id) {
  std::lock_guard<std::mutex> lock(sourcesMutex_);
  sources_.erase(id);
}

RankReport ProgressPublisher::gather() {
  RankReport r;
  r.rank = options_.rank;
  r.nodeRank = options_.nodeRank;
  r.pid = ::getpid();
  r.time = unixNow();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    r.step = step_;
    r.figures = figures_;
    r.figuresStep = figuresStep_;
    r.figuresTime = figuresTime_;
    // Records launch has had time to read are not sent again.
    while (!recent_.empty() && recent_.front().time < r.time - options_.recentRecordSeconds) {
      recent_.pop_front();
    }
    r.records.assign(recent_.begin(), recent_.end());
    r.lastRecord = recorded_;
  }
  std::lock_guard<std::mutex> lock(sourcesMutex_);
  for (const auto& [id, source] : sources_) {
    try {
      CollectiveState state = source();
      if (state.tail.size() > options_.tailEntries) {
        state.tail.erase(state.tail.begin(),
                         state.tail.end() - static_cast<std::ptrdiff_t>(options_.tailEntries));
      }
      r.collectives.push_back(std::move(state));
    } catch (const std::exception& e) {
      DTRAIN_LOG(Debug, "progress: a collective source failed: {}", e.what());
    }
  }
  return r;
}

bool ProgressPublisher::flush(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (finished_) return false;
  const uint64_t target = rounds_ + 1;
  ++flushRequests_;
  wake_.notify_all();
  return ticked_.wait_for(lock, timeout, [&] { return rounds_ >= target || finished_; }) &&
         !finished_;
}

bool ProgressPublisher::stop(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  stopping_ = true;
  wake_.notify_all();
  if (!ticked_.wait_for(lock, timeout, [&] { return finished_; })) return false;
  lock.unlock();
  // Finished: only the thread's own exit is left (Note [Progress publisher]); wait for it, so
  // that nothing of it runs beside the process's exit handlers.
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
  return true;
}

void ProgressPublisher::threadMain() {
  ::pthread_setname_np(::pthread_self(), "dtrain-progress");
  std::shared_ptr<store::Store> store;
  // The connection and this thread's OpenSSL state go first, then finished_ is set: what the
  // thread does after that is only its return.
  auto finish = [this, &store] {
    store.reset();
    store::auth::releaseThreadState();
    std::lock_guard<std::mutex> lock(mutex_);
    finished_ = true;
    ticked_.notify_all();
  };
  try {
    store = options_.connect();
  } catch (const std::exception& e) {
    DTRAIN_LOG(Warn,
               "progress: cannot reach the job's store, so launch sees no progress from "
               "this rank (no stall detection, no trainer figures on its endpoint): {}",
               e.what());
    finish();
    return;
  }
  RankReport last;
  bool published = false;
  uint64_t flushesSeen = 0;
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    wake_.wait_for(lock, options_.interval,
                   [&] { return stopping_ || flushRequests_ != flushesSeen; });
    if (stopping_) break;
    flushesSeen = flushRequests_;
    lock.unlock();
    RankReport now = gather();
    const bool something = now.step || !now.collectives.empty() || now.figuresStep ||
                           now.lastRecord > 0;
    if (something && (!published || advanced(last, now))) {
      try {
        store->set(rankKey(options_.rank), store::toBytes(encodeReport(now)));
        store->add(kVersionKey, 1);  // also proves the set was applied
        last = std::move(now);
        published = true;
      } catch (const std::exception& e) {
        DTRAIN_LOG(Warn,
                   "progress: publishing to the job's store failed; stopping (launch sees "
                   "no more progress from this rank): {}",
                   e.what());
        finish();
        return;
      }
    }
    lock.lock();
    ++rounds_;
    ticked_.notify_all();
  }
  lock.unlock();
  finish();
}

// --- The process's publisher --------------------------------------------------------------------

namespace {

// The process that built the publisher: a forked child has no publisher thread (and possibly a
// copy of a mutex the thread held at the fork), so it publishes nothing.
pid_t gOwner = 0;

// Built once, never destroyed: see Note [Progress publisher] for the exit.
ProgressPublisher* makeProcessPublisher() {
  const char* addr = std::getenv(env::kStoreAddr);
  const char* rankText = std::getenv(env::kRank);
  int64_t rank = 0;
  if (addr == nullptr || *addr == '\0' || rankText == nullptr || !parseInt64(rankText, &rank) ||
      rank < 0) {
    return nullptr;
  }
  PublisherOptions options;
  options.rank = static_cast<int>(rank);
  int64_t nodeRank = -1;
  if (const char* text = std::getenv(env::kGroupRank); text && parseInt64(text, &nodeRank)) {
    options.nodeRank = nodeRank >= 0 && nodeRank <= (1 << 30) ? static_cast<int>(nodeRank) : -1;
  }
  options.connect = [] {
    store::JobStoreOptions o;
    o.connectTimeout = std::chrono::milliseconds(10000);
    o.timeout = std::chrono::milliseconds(10000);
    return std::static_pointer_cast<store::Store>(store::connectToJobStore(o));
  };
  gOwner = ::getpid();
  auto* p = new ProgressPublisher(std::move(options));
  std::atexit([] {
    if (::getpid() != gOwner) return;
    // The last figures and records (a final evaluation) reach launch before the process ends;
    // a thread still inside a store call after this is left behind.
    (void)publisher()->flush(std::chrono::milliseconds(500));
    (void)publisher()->stop(std::chrono::milliseconds(500));
  });
  return p;
}

}  // namespace

ProgressPublisher* publisher() {
  static ProgressPublisher* const instance = makeProcessPublisher();
  return instance != nullptr && ::getpid() == gOwner ? instance : nullptr;
}

Registration::~Registration() {
  if (id_ != 0 && publisher() != nullptr) publisher()->removeSource(id_);
}

Registration& Registration::operator=(Registration&& other) noexcept {
  if (this != &other) {
    if (id_ != 0 && publisher() != nullptr) publisher()->removeSource(id_);
    id_ = other.id_;
    other.id_ = 0;
  }
  return *this;
}

void setStep(int64_t step) {
  if (ProgressPublisher* p = publisher()) p->setStep(step);
}

void publishFigures(int64_t step, std::vector<std::pair<std::string, double>> fields) {
  if (ProgressPublisher* p = publisher()) p->setFigures(step, std::move(fields));
}

void publishRecord(const metrics::Record& record) {
  if (ProgressPublisher* p = publisher()) p->addRecord(record);
}

bool publishing() { return publisher() != nullptr; }

Registration watchCollectives(std::function<CollectiveState()> source) {
  ProgressPublisher* p = publisher();
  if (p == nullptr) return Registration();
  return Registration(p->addSource(std::move(source)));
}

bool flushProgress(int timeoutMs) {
  ProgressPublisher* p = publisher();
  return p != nullptr && p->flush(std::chrono::milliseconds(timeoutMs));
}

}  // namespace dtrain::progress
