#include "launcher/monitor/monitor.h"

#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "dtrain/base/error.h"
#include "dtrain/base/logging.h"
#include "dtrain/base/tcp_store.h"
#include "launcher/config/launch_config.h"
#include "launcher/monitor/cluster_keys.h"

namespace dtrain::launcher::monitor {

namespace {

double steadyNow() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double unixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

constexpr double kNever = std::numeric_limits<double>::infinity();
// Progress is read (and memory checked) at least this often, whatever the sample interval.
constexpr double kMaxTickSeconds = 1.0;
constexpr std::chrono::milliseconds kStoreTimeout{5000};
// How long workers run without any progress report before launch says stall detection has
// nothing to go on (at least the stall timeout).
constexpr double kSilentNoteSeconds = 10.0;

}  // namespace

Monitor::Monitor(MonitorOptions options, MonitorContext context)
    : options_(std::move(options)),
      context_(std::move(context)),
      sampler_(locateOwnMemoryCgroup()),
      nodeFigures_(context_.nodeFigures),
      memory_(context_.memory),
      gpuIdle_(context_.gpuIdle),
      stall_(options_.stallTimeout) {
  if (!options_.metricsFile.empty() && context_.aggregates) {
    metricsFd_ = ::open(options_.metricsFile.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC,
                        0644);
    DTRAIN_CHECK_ARG(metricsFd_ >= 0,
                     "{} {}: cannot open it for appending: {}; HINT: give a "
                     "path in a writable directory",
                     context_.label("metrics-file"), quoteValue(options_.metricsFile),
                     std::strerror(errno));
  }
  if (options_.metricsPort >= 0 && context_.aggregates) {
    metrics::PrometheusOptions server;
    server.host = options_.metricsHost;
    server.port = static_cast<uint16_t>(options_.metricsPort);
    server.option = context_.label("metrics-port");
    endpoint_ = std::make_unique<metrics::PrometheusServer>(
        server, [this] { return view_.prometheus(steadyNow()); });
    say(fmt::format("launch: metrics on http://{}:{}/metrics\n", options_.metricsHost,
                    endpoint_->port()));
  }
  // Last: a busy port leaves no event file behind.
  if (!options_.tensorboardDir.empty() && context_.aggregates) {
    // See Note [TensorBoard steps of launch's samples].
    tensorboard_ = metrics::TensorBoardSink::open(options_.tensorboardDir,
                                                  context_.label("tensorboard-dir"));
    say(fmt::format("launch: TensorBoard events in {}\n", tensorboard_->path()));
  }
  view_.setJob(0, context_.worldSize, context_.maxRestarts);
  view_.setHeartbeatTimeout(context_.heartbeatTimeout);
}

Monitor::~Monitor() {
  stop();
  endpoint_.reset();
  if (metricsFd_ >= 0) ::close(metricsFd_);
}

void Monitor::start(JobControl* control) {
  control_ = control;
  thread_ = std::thread([this] { threadMain(); });
}

void Monitor::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Monitor::attemptStarted(int attempt, int worldSize) {
  std::lock_guard<std::mutex> lock(mutex_);
  attempt_ = attempt;
  worldSize_ = worldSize > 0 ? worldSize : context_.worldSize;
  attemptChanged_ = true;
  tearingDown_ = false;
  workers_.clear();
  workersChanged_ = true;
  ended_.clear();
}

void Monitor::workerStarted(int rank, int localRank, pid_t pid) {
  std::lock_guard<std::mutex> lock(mutex_);
  workers_[rank] = WorkerProcess{rank, localRank, pid};
  workersChanged_ = true;
}

void Monitor::workerEnded(int rank) {
  std::lock_guard<std::mutex> lock(mutex_);
  workers_.erase(rank);
  workersChanged_ = true;
  ended_.push_back(rank);
}

void Monitor::teardownStarted() {
  std::lock_guard<std::mutex> lock(mutex_);
  tearingDown_ = true;
}

void Monitor::attemptEnded(int) {}

void Monitor::say(const std::string& text) {
  // Whole lines, each write at most PIPE_BUF, so worker lines never land inside one of ours.
  size_t at = 0;
  while (at < text.size()) {
    size_t end = at;
    while (end < text.size()) {
      size_t nl = text.find('\n', end);
      size_t next = nl == std::string::npos ? text.size() : nl + 1;
      if (next - at > 4096 && end > at) break;
      end = next;
    }
    size_t off = at;
    while (off < end) {
      ssize_t n = ::write(STDERR_FILENO, text.data() + off, end - off);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;
      off += static_cast<size_t>(n);
    }
    at = end;
  }
}

void Monitor::threadMain() {
  // The master of several nodes only aggregates: its own name, for per-thread CPU figures.
  ::pthread_setname_np(::pthread_self(), context_.samplesNode ? "launch-monitor" : "launch-jobmon");
  const double tickSeconds = std::min(options_.sampleInterval, kMaxTickSeconds);
  const double start = steadyNow();
  nextSample_ = start;
  nextStatus_ = options_.statusInterval > 0 ? start + options_.statusInterval : kNever;
  std::unique_lock<std::mutex> lock(mutex_);
  double nextTick = start;
  while (!stopping_) {
    const double now = steadyNow();
    if (now < nextTick) {
      wake_.wait_for(lock, std::chrono::duration<double>(nextTick - now));
      continue;
    }
    nextTick = std::max(nextTick + tickSeconds, now);
    // Take what the supervisor said, then work without the lock.
    const bool newAttempt = attemptChanged_;
    attemptChanged_ = false;
    currentAttempt_ = attempt_;
    currentWorldSize_ = worldSize_ > 0 ? worldSize_ : context_.worldSize;
    currentTearingDown_ = tearingDown_;
    std::vector<int> ended;
    ended.swap(ended_);
    const bool workersChanged = workersChanged_;
    workersChanged_ = false;
    if (workersChanged) currentWorkers_ = workers_;
    lock.unlock();
    try {
      if (newAttempt) {
        stall_.reset(currentWorldSize_);
        stalledRanks_.clear();
        memory_.resetRanks();
        gpuIdle_.reset();
        reports_.clear();
        recordsWritten_.clear();
        recordsMissed_.clear();
        lastVersion_ = -1;
        if (store_) {
          auto prefixed = std::dynamic_pointer_cast<store::PrefixStore>(store_);
          store_ = std::make_shared<store::PrefixStore>(store::roundPrefix(currentAttempt_),
                                                        prefixed ? prefixed->inner() : store_);
        }
        nodeRecordTimes_.clear();
        view_.setJob(currentAttempt_, currentWorldSize_, context_.maxRestarts);
        view_.newAttempt(currentAttempt_);
      }
      if (workersChanged) {
        std::vector<WorkerProcess> list;
        for (const auto& [rank, w] : currentWorkers_) list.push_back(w);
        sampler_.setWorkers(std::move(list));
      }
      for (int r : ended) stall_.rankEnded(r);
      tick(steadyNow());
    } catch (const std::exception& e) {
      // Monitoring never takes the job down.
      DTRAIN_LOG(Warn, "launch: monitoring: {}", e.what());
    }
    lock.lock();
  }
  lock.unlock();
  if (context_.aggregates) {
    // The ranks' last reports: a trainer flushes its final records as it exits.
    try {
      pollStore(steadyNow(), /*final=*/true);
    } catch (const std::exception& e) {
      DTRAIN_LOG(Warn, "launch: monitoring: {}", e.what());
    }
  }
}

void Monitor::tick(double now) {
  connectStore();  // progress for the aggregator; an agent publishes its samples there
  if (context_.aggregates) pollStore(now);
  if (context_.samplesNode) {
    const bool sampling = now >= nextSample_;
    if (sampling) {
      sample(now);
      nextSample_ = std::max(nextSample_ + options_.sampleInterval, now);
    } else {
      lastNode_ = sampler_.sampleMemory();
    }
    if (auto warning = memory_.check(now, lastNode_, context_.node)) say(*warning);
    // An agent looks for the master's stack requests with each sample it publishes, not every
    // tick: hundreds of agents asking every second would be most of the store's load.
    if (!context_.aggregates && sampling) answerStackRequest();
  }
  if (!context_.aggregates) return;
  if (options_.stallTimeout > 0) checkStall(now);
  if (now >= nextStatus_) {
    nextStatus_ = std::max(nextStatus_ + options_.statusInterval, now);
    say(view_.statusLine(now));
  }
}

bool Monitor::connectStore() {
  if (store_) return true;
  if (!storeUsable_ || context_.storePort <= 0) return false;
  store::TcpStoreOptions o;
  o.host = context_.storeHost;
  o.port = static_cast<uint16_t>(context_.storePort);
  o.token = context_.storeToken;
  o.connectTimeout = kStoreTimeout;
  o.timeout = kStoreTimeout;
  try {
    auto client = std::make_shared<store::TcpStore>(o);
    store_ = std::make_shared<store::PrefixStore>(store::roundPrefix(currentAttempt_), client);
    return true;
  } catch (const std::exception& e) {
    say(fmt::format("launch: monitoring cannot reach the job's store, so it reads no progress "
                    "(no stall detection, no trainer figures{}): {}\n",
                    context_.numNodes > 1 ? ", no other node's samples" : "", e.what()));
    storeUsable_ = false;
    return false;
  }
}

std::optional<std::string> Monitor::nodeOf(int rank, const progress::RankReport& report,
                                           const std::map<int, std::string>& nodeOfRank) const {
  if (auto it = nodeOfRank.find(rank); it != nodeOfRank.end()) return it->second;
  if (context_.numNodes <= 1) return context_.node;
  if (auto it = nodeNames_.find(report.nodeRank); it != nodeNames_.end()) return it->second;
  return std::nullopt;
}

void Monitor::pollStore(double now, bool final) {
  if (!store_) return;
  try {
    const int64_t version = store_->add(progress::kVersionKey, 0);
    if (version == lastVersion_) return;
    lastVersion_ = version;
    readProgress(now);
    if (context_.numNodes > 1) readAgentRecords(now);
    writeTrainerRecords(final);
  } catch (const std::exception& e) {
    // The store is going away (the job is ending) or broken: stop reading it.
    DTRAIN_LOG(Info, "launch: monitoring: reading the store failed: {}", e.what());
    store_.reset();
    storeUsable_ = false;
  }
}

void Monitor::readProgress(double now) {
  std::vector<std::string> ks;
  for (int r = 0; r < currentWorldSize_; ++r) ks.push_back(progress::rankKey(r));
  const auto values = readExisting(*store_, ks);  // every rank's report at once
  for (int r = 0; r < currentWorldSize_; ++r) {
    const auto& value = values[static_cast<size_t>(r)];
    if (!value) continue;
    try {
      progress::RankReport report = progress::decodeReport(store::toString(*value));
      stall_.update(now, report);
      reports_[r] = std::move(report);
    } catch (const InvalidArgument& e) {
      DTRAIN_LOG(Info, "launch: monitoring: rank {}'s progress report is malformed: {}", r,
                 e.what());
    }
  }
}

void Monitor::readAgentRecords(double now) {
  std::vector<std::string> problems;
  const int own = context_.samplesNode ? context_.nodeRank : -1;
  if (own >= 0) nodeNames_[own] = context_.node;
  for (auto& [n, records] : readNodeRecords(*store_, context_.numNodes, own, &problems)) {
    if (records.empty()) continue;
    nodeNames_[n] = records.front().node.empty() ? fmt::format("node{}", n) : records.front().node;
    // Each agent's sample once in the file, however often the version moves.
    if (nodeRecordTimes_[n] == records.front().time) continue;
    nodeRecordTimes_[n] = records.front().time;
    // Agents do not read progress: the master adds each rank's collective count.
    for (auto& r : records) {
      auto p = r.rank && !r.gpu ? reports_.find(*r.rank) : reports_.end();
      if (p == reports_.end()) continue;
      if (const auto* c = primaryCollectives(p->second)) {
        r.fields.emplace_back("collective_seq", static_cast<double>(c->issued));
      }
    }
    writeRecords(records);
    const std::string name = records.front().node;
    view_.ingest(name.empty() ? fmt::format("node{}", n) : name, std::move(records), now);
  }
  for (const auto& p : problems) DTRAIN_LOG(Info, "launch: monitoring: {}", p);
}

void Monitor::writeTrainerRecords(bool final) {
  // The trainers' records, labelled with the node their rank runs on: launch's samples of the
  // rank say which, else the node rank it reported. Each new record goes into the file once its
  // node is known (it stays in the rank's report meanwhile); the endpoint shows the latest
  // figures of each rank.
  std::map<int, std::string> nodeOfRank;
  for (const auto& r : view_.latest()) {
    if (r.rank && !r.gpu && r.source == "launch") nodeOfRank[*r.rank] = r.node;
  }
  std::vector<Record> trainer;
  std::vector<Record> fresh;
  for (const auto& [rank, report] : reports_) {
    const std::optional<std::string> node = nodeOf(rank, report, nodeOfRank);
    const std::string label = node                   ? *node
                              : report.nodeRank >= 0 ? fmt::format("node{}", report.nodeRank)
                                                     : "";
    if (auto t = trainerRecord(report, context_.runId, label)) trainer.push_back(std::move(*t));
    if (!node && !final) continue;
    uint64_t& missed = recordsMissed_[rank];
    const uint64_t missedBefore = missed;
    for (auto& r :
         newTrainerRecords(report, recordsWritten_[rank], context_.runId, label, &missed)) {
      fresh.push_back(std::move(r));
    }
    if (metricsFd_ >= 0 && missedBefore == 0 && missed > 0) {
      DTRAIN_LOG(Info,
                 "launch: monitoring: rank {} records metrics faster than launch reads "
                 "them (more than {} in {:g} s): {} misses some of its records; the trainer's "
                 "own metrics file has them all",
                 rank, progress::kRecentRecords, progress::kRecentRecordSeconds,
                 options_.metricsFile);
    }
  }
  writeRecords(fresh);
  view_.setTrainerRecords(std::move(trainer));
}

// Note [TensorBoard steps of launch's samples]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// --tensorboard-dir gets exactly the records --metrics-file gets: the ranks' trainer records at
// their own step, and launch's samples, which have none (they are taken on a clock, not per
// step). A sample's TensorBoard step is the whole seconds from the moment launch opened the
// event file to the sample's time (TensorBoardSink's rule for a record without a step): the same
// for every node's samples taken at the same moment, growing across restarts, and at a 5 s
// interval 0, 5, 10, ... Its wall_time is the sample's time, so TensorBoard's "relative" axis
// shows the same. Under a multi-node job only the master writes (agents do not aggregate); one
// writer per directory, as TensorBoard's loader needs.

void Monitor::writeRecords(const std::vector<Record>& records) {
  if (records.empty()) return;
  if (tensorboard_) {
    try {
      for (const auto& r : records) tensorboard_->write(r);
    } catch (const Error& e) {
      DTRAIN_LOG(Warn, "launch: {}; no more TensorBoard events are written this run", e.what());
      tensorboard_.reset();
    }
  }
  if (metricsFd_ < 0) return;
  std::string lines;
  for (const auto& r : records) lines += metrics::toJsonLine(r) + "\n";
  if (::write(metricsFd_, lines.data(), lines.size()) < 0) {
    DTRAIN_LOG(Warn, "launch: writing {} failed: {}", options_.metricsFile, std::strerror(errno));
  }
}

void Monitor::sample(double now) {
  std::vector<RankSample> ranks = sampler_.sampleWorkers(now);
  lastNode_ = sampler_.sampleNode();
  if (!gpuOpened_) {
    gpuOpened_ = true;
    std::string why;
    gpu_ = openGpuSource(context_.gpu, &why);
    DTRAIN_LOG(Info, "launch: monitoring: GPUs {}",
               gpu_ ? "from " + gpu_->describe() : "not sampled: " + why);
  }
  std::vector<GpuSample> gpus;
  if (gpu_) {
    gpus = gpu_->sample();
    if (gpus.empty() && !gpu_->lastError().empty()) {
      DTRAIN_LOG(Info, "launch: monitoring: GPU sample failed: {}", gpu_->lastError());
    }
  }
  memory_.addRanks(now, ranks);

  SampleContext ctx;
  ctx.time = unixNow();
  ctx.runId = context_.runId;
  ctx.node = context_.node;
  ctx.attempt = currentAttempt_;
  ctx.workers = context_.localWorldSize;
  ctx.workersAlive = static_cast<int>(currentWorkers_.size());
  std::vector<Record> records = sampleRecords(ctx, lastNode_, ranks, gpus, reports_);
  addNodeFigures(records, ctx, nodeFigures_.sample(now));
  if (context_.aggregates) {
    writeRecords(records);
    view_.ingest(context_.node, std::move(records), now);
  } else if (store_ && context_.nodeRank >= 0) {
    try {
      publishNodeRecords(*store_, context_.nodeRank, records);
    } catch (const std::exception& e) {
      DTRAIN_LOG(Info, "launch: monitoring: publishing this node's samples failed: {}", e.what());
      store_.reset();
      storeUsable_ = false;
    }
  }

  // Idle GPUs: those a worker of this job uses, or all of them when none can be attributed.
  std::vector<GpuSample> used;
  for (const auto& g : gpus) {
    for (const auto& p : g.processes) {
      bool ours = std::any_of(ranks.begin(), ranks.end(), [&](const RankSample& r) {
        return std::find(r.pids.begin(), r.pids.end(), p.pid) != r.pids.end();
      });
      if (ours) {
        used.push_back(g);
        break;
      }
    }
  }
  if (auto warning = gpuIdle_.observe(now, used.empty() ? gpus : used,
                                      !currentWorkers_.empty() && !currentTearingDown_,
                                      context_.node)) {
    say(*warning);
  }
}

std::map<int, std::string> Monitor::stacksOf(const std::vector<int>& ranks) {
  std::map<int, std::string> out;
  for (int r : ranks) {
    auto w = currentWorkers_.find(r);
    if (w != currentWorkers_.end()) out[r] = nativeStack(w->second.pid, context_.stacks);
  }
  return out;
}

void Monitor::answerStackRequest() {
  if (!store_) return;
  try {
    auto request = pendingStackRequest(*store_, stacksAnswered_);
    if (!request) return;
    stacksAnswered_ = request->id;
    answerStacks(*store_, context_.nodeRank, request->id, stacksOf(request->ranks));
  } catch (const std::exception& e) {
    DTRAIN_LOG(Info, "launch: monitoring: answering a stack request failed: {}", e.what());
  }
}

void Monitor::checkStall(double now) {
  if (currentTearingDown_) return;  // workers being stopped stop publishing
  // Workers that never publish (a program without dtrain's runtime) cannot be judged: say so once
  // instead of watching in silence -- once they have run for a while (a program may load its
  // data before it creates its first communicator).
  bool running = !currentWorkers_.empty();
  if (!context_.samplesNode) {  // the master of several nodes: the agents' records say
    for (const auto& r : view_.latest()) {
      running = running || (!r.rank && !r.gpu && r.field("workers_alive").value_or(0) > 0);
    }
  }
  if (!running || !reports_.empty()) {
    workersSince_ = running ? workersSince_ : -1;
  } else if (workersSince_ < 0) {
    workersSince_ = now;
  } else if (!toldSilent_ &&
             now - workersSince_ >= std::max(options_.stallTimeout, kSilentNoteSeconds)) {
    toldSilent_ = true;
    say(fmt::format("launch: {} {:g}: no rank has published progress after {:.0f} s (a program "
                    "without dtrain's runtime, e.g. a torchrun-style Python script): there is "
                    "nothing to detect a stall from\n",
                    context_.label("stall-timeout"), options_.stallTimeout, now - workersSince_));
  }
  std::optional<Stall> stall = stall_.check(now);
  // The ranks the report blames stay on the endpoint (dtrain_rank_stalled) while the stall lasts.
  if (stall) stalledRanks_ = !stall->behind.empty() ? stall->behind : stall->stuck;
  if (!stall_.inStall()) stalledRanks_.clear();
  view_.setStalled(stall_.inStall(), stalledRanks_);
  if (!stall) return;
  StallReportContext ctx;
  ctx.option = context_.label("stall-timeout");
  ctx.timeout = options_.stallTimeout;
  ctx.stopping = options_.stallAction == StallAction::Stop;
  for (const auto& r : view_.latest()) {
    if (r.rank && !r.gpu && r.source == "launch") ctx.nodes[*r.rank] = r.node;
  }
  if (context_.samplesNode) ctx.stacks = stacksOf(stall->stuck);
  std::vector<int> remote;
  for (int r : stall->stuck) {
    if (!ctx.stacks.count(r)) remote.push_back(r);
  }
  if (!remote.empty() && context_.numNodes > 1 && store_) {
    try {
      const int64_t id = requestStacks(*store_, remote);
      const int own = context_.samplesNode ? context_.nodeRank : -1;
      // The agents look with their next sample, then take the stacks.
      const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(
          context_.stacks.timeout + kStoreTimeout +
          std::chrono::duration<double>(options_.sampleInterval));
      for (auto& [rank, text] : collectStacks(*store_, id, context_.numNodes, own, wait)) {
        ctx.stacks[rank] = std::move(text);
      }
    } catch (const std::exception& e) {
      DTRAIN_LOG(Info, "launch: monitoring: asking the nodes for stacks failed: {}", e.what());
    }
  }
  say(formatStallReport(*stall, stall_.ranks(), ctx));
  if (ctx.stopping && control_ != nullptr) {
    control_->stopForDeadline(fmt::format(
        "{} for {:.1f} s ({} {:g}, {} stop); the stall report above says where each rank was",
        stall->kind == Stall::Kind::NoProgress
            ? "no rank made progress"
            : "ranks " + formatRanks(stall->stuck) + " made no progress",
        stall->quietSeconds, ctx.option, options_.stallTimeout, context_.label("stall-action")));
  }
}

}  // namespace dtrain::launcher::monitor
