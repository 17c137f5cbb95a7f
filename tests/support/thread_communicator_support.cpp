#include "thread_communicator_support.h"

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "collective_faults.h"
#include "dtrain/base/error.h"
#include "half.h"

namespace dtrain::testing {

// ThreadWorld::Impl holds Ops, so they have linkage: a unity build compiles this file as if it
// were a header, where a member of a type from an anonymous namespace is a warning.
namespace thread_world {

enum class Kind { Allreduce, Broadcast, Allgather, ReduceScatter, Barrier };

const char* kindName(Kind k) {
  switch (k) {
    case Kind::Allreduce: return "allreduce";
    case Kind::Broadcast: return "broadcast";
    case Kind::Allgather: return "allgather";
    case Kind::ReduceScatter: return "reduceScatter";
    case Kind::Barrier: return "barrier";
  }
  return "?";
}

struct Op {
  Kind kind = Kind::Barrier;
  const void* send = nullptr;  // allgather, reduceScatter
  void* data = nullptr;        // in place (allreduce, broadcast) or receive buffer
  size_t count = 0;
  comm::DataType dtype = comm::DataType::Float32;
  comm::ReduceOp op = comm::ReduceOp::Sum;
  int root = 0;
  comm::Millis timeout{0};

  std::string describe() const {
    return fmt::format("{} of {} {} (op {}, root {})", kindName(kind), count,
                       comm::dataTypeName(dtype), comm::reduceOpName(op), root);
  }
  bool sameAs(const Op& o) const {
    return kind == o.kind && count == o.count && dtype == o.dtype && op == o.op && root == o.root;
  }
};

}  // namespace thread_world

namespace {

using Clock = std::chrono::steady_clock;
using thread_world::Kind;
using thread_world::kindName;
using thread_world::Op;

// float16 / bfloat16 elements that compute in float and round back after every operation, as
// c10::Half and c10::BFloat16 do (comm/half.h converts with their rounding).
struct Half {
  uint16_t bits;
  Half(float f) : bits(comm::floatToHalf(f)) {}  // NOLINT: converts implicitly, as c10::Half
  operator float() const { return comm::halfToFloat(bits); }
};
struct BFloat16 {
  uint16_t bits;
  BFloat16(float f) : bits(comm::floatToBf16(f)) {}  // NOLINT: converts implicitly
  operator float() const { return comm::bf16ToFloat(bits); }
};
static_assert(sizeof(Half) == 2 && sizeof(BFloat16) == 2, "read in place from the buffers");

template <typename T>
T combine(T a, T b, comm::ReduceOp op) {
  switch (op) {
    case comm::ReduceOp::Sum:
    case comm::ReduceOp::Avg: return static_cast<T>(a + b);
    case comm::ReduceOp::Max: return b > a ? b : a;
    case comm::ReduceOp::Min: return b < a ? b : a;
  }
  return a;
}

// out[i] = op over ranks (in rank order) of inputs[r][i].
template <typename T>
void reduce(const std::vector<const void*>& inputs, void* out, size_t count, comm::ReduceOp op) {
  auto* o = static_cast<T*>(out);
  for (size_t i = 0; i < count; ++i) {
    T acc = static_cast<const T*>(inputs[0])[i];
    for (size_t r = 1; r < inputs.size(); ++r)
      acc = combine(acc, static_cast<const T*>(inputs[r])[i], op);
    if (op == comm::ReduceOp::Avg) acc = static_cast<T>(acc / static_cast<T>(inputs.size()));
    o[i] = acc;
  }
}

void reduceAny(comm::DataType dtype, const std::vector<const void*>& inputs, void* out,
               size_t count, comm::ReduceOp op) {
  switch (dtype) {
    case comm::DataType::Float32: return reduce<float>(inputs, out, count, op);
    case comm::DataType::Float64: return reduce<double>(inputs, out, count, op);
    case comm::DataType::Float16: return reduce<Half>(inputs, out, count, op);
    case comm::DataType::BFloat16: return reduce<BFloat16>(inputs, out, count, op);
    case comm::DataType::Int32: return reduce<int32_t>(inputs, out, count, op);
    case comm::DataType::Int64: return reduce<int64_t>(inputs, out, count, op);
    case comm::DataType::UInt8: return reduce<uint8_t>(inputs, out, count, op);
    case comm::DataType::Int8: return reduce<int8_t>(inputs, out, count, op);
  }
}

class ThreadWork : public comm::Work {
 public:
  // `budget`: the default deadline of wait(0), the collective's timeout and a second more.
  explicit ThreadWork(comm::Millis budget) : budget_(budget) {}
  bool isCompleted() override {
    std::lock_guard<std::mutex> lock(mutex_);
    return done_;
  }
  void wait(comm::Millis timeout) override {
    if (timeout == comm::Millis::zero()) timeout = budget_;
    std::unique_lock<std::mutex> lock(mutex_);
    if (!cv_.wait_for(lock, timeout, [&] { return done_; })) {
      DTRAIN_THROW(TimeoutError, "thread communicator: work not finished after {} ms",
                   timeout.count());
    }
    if (error_) std::rethrow_exception(error_);
  }
  void finish(std::exception_ptr error) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
      error_ = error;
    }
    cv_.notify_all();
  }

 private:
  const comm::Millis budget_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

class HeapBuffer : public comm::Buffer {
 public:
  explicit HeapBuffer(size_t bytes)
      : bytes_(bytes), data_(std::aligned_alloc(64, (bytes + 63) / 64 * 64)) {
    std::memset(data_, 0, (bytes + 63) / 64 * 64);
  }
  ~HeapBuffer() override { std::free(data_); }
  void* data() override { return data_; }
  size_t bytes() const override { return bytes_; }

 private:
  size_t bytes_;
  void* data_;
};

}  // namespace

struct ThreadWorld::Impl {
  struct Slot {
    std::vector<Op> ops;
    int arrived = 0;
    int computed = 0;
    int left = 0;
  };

  int size;
  ThreadWorldOptions options;
  std::mutex mutex;
  std::condition_variable cv;
  std::map<int64_t, Slot> slots;                // by sequence number
  std::string aborted;                          // why, once aborted
  std::vector<std::exception_ptr> rankAborted;  // by rank: Communicator::abort()'s error
  std::vector<std::shared_ptr<comm::Communicator>> comms;

  // Blocks until `pred` holds; throws on abort or deadline.
  template <typename Pred>
  void waitFor(std::unique_lock<std::mutex>& lock, int rank, int64_t seq, const Op& op,
               Clock::time_point deadline, const char* phase, Pred pred) {
    while (!pred()) {
      if (rankAborted[static_cast<size_t>(rank)]) {
        std::rethrow_exception(rankAborted[static_cast<size_t>(rank)]);
      }
      if (!aborted.empty()) {
        DTRAIN_THROW(NetworkError, "rank {}: collective #{} ({}) aborted: {}", rank, seq,
                     op.describe(), aborted);
      }
      if (cv.wait_until(lock, deadline) == std::cv_status::timeout && !pred()) {
        DTRAIN_THROW(TimeoutError, "rank {}: timed out in collective #{} ({}) while {}", rank, seq,
                     op.describe(), phase);
      }
    }
  }

  void execute(int rank, int64_t seq, const Op& op) {
    if (options.failAtCollective == seq) {
      DTRAIN_THROW(NetworkError, "rank {}: injected failure of collective #{} ({})", rank, seq,
                   op.describe());
    }
    auto timeout = op.timeout == comm::Millis::zero() ? options.timeout : op.timeout;
    auto deadline = Clock::now() + timeout;
    std::unique_lock<std::mutex> lock(mutex);
    Slot& slot = slots[seq];
    if (slot.ops.empty()) slot.ops.resize(static_cast<size_t>(size));
    slot.ops[static_cast<size_t>(rank)] = op;
    ++slot.arrived;
    cv.notify_all();
    waitFor(lock, rank, seq, op, deadline, "waiting for the other ranks to join",
            [&] { return slot.arrived == size; });
    for (int r = 0; r < size; ++r) {
      DTRAIN_CHECK(slot.ops[r].sameAs(slot.ops[0]),
                   "rank {}: collective #{} differs across ranks: rank 0 issued {}, rank {} {}",
                   rank, seq, slot.ops[0].describe(), r, slot.ops[r].describe());
    }
    lock.unlock();

    // Every rank's input is readable until all have computed their result.
    std::vector<uint8_t> result = compute(rank, slot.ops);
    lock.lock();
    ++slot.computed;
    cv.notify_all();
    waitFor(lock, rank, seq, op, deadline, "waiting for the other ranks to read",
            [&] { return slot.computed == size; });
    lock.unlock();

    simulateLink(op);
    if (!result.empty()) std::memcpy(op.data, result.data(), result.size());

    lock.lock();
    if (++slot.left == size) slots.erase(seq);
  }

  std::vector<uint8_t> compute(int rank, const std::vector<Op>& ops) {
    const Op& op = ops[static_cast<size_t>(rank)];
    size_t elem = comm::elementSize(op.dtype);
    std::vector<uint8_t> out;
    std::vector<const void*> inputs;
    switch (op.kind) {
      case Kind::Allreduce:
        out.resize(op.count * elem);
        for (const auto& o : ops) inputs.push_back(o.data);
        reduceAny(op.dtype, inputs, out.data(), op.count, op.op);
        break;
      case Kind::Broadcast:
        if (rank != op.root) {
          out.resize(op.count * elem);
          std::memcpy(out.data(), ops[static_cast<size_t>(op.root)].data, out.size());
        }
        break;
      case Kind::Allgather:
        out.resize(op.count * elem * ops.size());
        for (size_t r = 0; r < ops.size(); ++r) {
          std::memcpy(out.data() + r * op.count * elem, ops[r].send, op.count * elem);
        }
        break;
      case Kind::ReduceScatter:
        out.resize(op.count * elem);
        for (const auto& o : ops) {
          inputs.push_back(static_cast<const uint8_t*>(o.send) +
                           static_cast<size_t>(rank) * op.count * elem);
        }
        reduceAny(op.dtype, inputs, out.data(), op.count, op.op);
        break;
      case Kind::Barrier: break;
    }
    return out;
  }

  void simulateLink(const Op& op) {
    auto delay = std::chrono::duration<double>(options.latency);
    if (options.bytesPerSecond > 0) {
      delay += std::chrono::duration<double>(op.count * comm::elementSize(op.dtype) /
                                             options.bytesPerSecond);
    }
    if (delay.count() > 0) std::this_thread::sleep_for(delay);
  }
};

namespace {

// One rank's communicator: a worker thread that runs the rank's collectives in issue order.
class ThreadCommunicator : public comm::Communicator {
 public:
  ThreadCommunicator(std::shared_ptr<ThreadWorld::Impl> world, int rank)
      : world_(std::move(world)), rank_(rank), worker_([this] { loop(); }) {}
  ~ThreadCommunicator() override { shutdown(); }

  int rank() const override { return rank_; }
  int size() const override { return world_->size; }
  const char* backendName() const override { return "threads"; }

  std::shared_ptr<comm::Work> allreduceAsync(void* data, size_t count, comm::DataType dtype,
                                             comm::ReduceOp op,
                                             const comm::CallOptions& options) override {
    Op o = makeOp(Kind::Allreduce, nullptr, data, count, dtype, options);
    o.op = op;
    return enqueue(o);
  }
  std::shared_ptr<comm::Work> broadcastAsync(void* data, size_t count, comm::DataType dtype,
                                             int root, const comm::CallOptions& options) override {
    Op o = makeOp(Kind::Broadcast, nullptr, data, count, dtype, options);
    o.root = root;
    return enqueue(o);
  }
  std::shared_ptr<comm::Work> allgatherAsync(const void* send, void* recv, size_t count,
                                             comm::DataType dtype,
                                             const comm::CallOptions& options) override {
    return enqueue(makeOp(Kind::Allgather, send, recv, count, dtype, options));
  }
  std::shared_ptr<comm::Work> reduceScatterAsync(const void* send, void* recv, size_t count,
                                                 comm::DataType dtype, comm::ReduceOp op,
                                                 const comm::CallOptions& options) override {
    Op o = makeOp(Kind::ReduceScatter, send, recv, count, dtype, options);
    o.op = op;
    return enqueue(o);
  }
  std::shared_ptr<comm::Work> barrierAsync(const comm::CallOptions& options) override {
    return enqueue(makeOp(Kind::Barrier, nullptr, nullptr, 0, comm::DataType::Float32, options));
  }
  std::shared_ptr<comm::Buffer> allocate(size_t bytes) override {
    return std::make_shared<HeapBuffer>(bytes);
  }
  void shutdown() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_) return;
      stopping_ = true;
    }
    cv_.notify_all();
    if (worker_.joinable()) worker_.join();
  }
  // This rank only: its collective in flight fails at once, every later one too. Other ranks
  // waiting for it wait on until their own abort (or timeout), as with a real backend.
  void abort(const std::string& reason) override {
    const auto error = std::make_exception_ptr(
        MembershipChanged(fmt::format("{}: membership changed: {}", describe(), reason)));
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (aborted_) return;
      aborted_ = error;
    }
    {
      std::lock_guard<std::mutex> lock(world_->mutex);
      world_->rankAborted[static_cast<size_t>(rank_)] = error;
    }
    world_->cv.notify_all();
    cv_.notify_all();
  }
  std::exception_ptr error() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return aborted_;
  }
  int64_t issued() {
    std::lock_guard<std::mutex> lock(mutex_);
    return nextSeq_;
  }
  // As Note [Payload bytes] in runtime/comm/collective.cpp counts them, when issued.
  uint64_t payloadBytes() const override { return payload_.load(); }

 private:
  // An op with the call's buffers, count and timeout; the caller adds the reduction or root.
  static Op makeOp(Kind kind, const void* send, void* data, size_t count, comm::DataType dtype,
                   const comm::CallOptions& options) {
    Op o;
    o.kind = kind;
    o.send = send;
    o.data = data;
    o.count = count;
    o.dtype = dtype;
    o.timeout = options.timeout;
    return o;
  }

  struct Task {
    int64_t seq;
    Op op;
    std::shared_ptr<ThreadWork> work;
  };

  std::shared_ptr<comm::Work> enqueue(const Op& op) {
    const uint64_t n = static_cast<uint64_t>(world_->size);
    const uint64_t bytes = op.count * comm::elementSize(op.dtype);
    if (n > 1) {
      switch (op.kind) {
        case Kind::Allreduce: payload_ += 2 * (n - 1) * bytes / n; break;
        case Kind::Allgather:
        case Kind::ReduceScatter: payload_ += (n - 1) * bytes; break;
        case Kind::Broadcast: payload_ += bytes; break;
        default: break;
      }
    }
    const auto timeout = op.timeout == comm::Millis::zero() ? world_->options.timeout : op.timeout;
    auto work = std::make_shared<ThreadWork>(timeout + comm::Millis(1000));
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (aborted_) std::rethrow_exception(aborted_);
      DTRAIN_CHECK(!stopping_, "rank {}: {} after shutdown()", rank_, op.describe());
      queue_.push_back({nextSeq_++, op, work});
    }
    cv_.notify_all();
    return work;
  }

  void loop() {
    for (;;) {
      Task task;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      std::exception_ptr error = failure_;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (aborted_) error = aborted_;
      }
      if (!error) {
        try {
          world_->execute(rank_, task.seq, task.op);
        } catch (...) {
          error = std::current_exception();
          std::lock_guard<std::mutex> lock(mutex_);
          if (aborted_) error = aborted_;  // released by abort(): its error, whatever ended it
        }
        failure_ = error;
      }
      task.work->finish(error);
    }
  }

  std::shared_ptr<ThreadWorld::Impl> world_;
  int rank_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Task> queue_;      // guarded by mutex_
  std::exception_ptr aborted_;  // guarded by mutex_: abort()'s error
  int64_t nextSeq_ = 0;         // guarded by mutex_
  std::atomic<uint64_t> payload_{0};
  bool stopping_ = false;       // guarded by mutex_
  std::exception_ptr failure_;  // worker thread only: the first error, rethrown by every later call
  std::thread worker_;
};

}  // namespace

ThreadWorld::ThreadWorld(int size, ThreadWorldOptions options)
    : size_(size), options_(options), impl_(std::make_shared<Impl>()) {
  impl_->size = size;
  impl_->options = options;
  impl_->comms.resize(static_cast<size_t>(size));
  impl_->rankAborted.resize(static_cast<size_t>(size));
}

std::shared_ptr<ThreadWorld> ThreadWorld::create(int size, ThreadWorldOptions options) {
  DTRAIN_CHECK_ARG(size >= 1, "ThreadWorld needs at least one rank");
  return std::shared_ptr<ThreadWorld>(new ThreadWorld(size, options));
}

std::shared_ptr<comm::Communicator> ThreadWorld::communicator(int rank) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  auto& slot = impl_->comms.at(static_cast<size_t>(rank));
  if (!slot) slot = std::make_shared<ThreadCommunicator>(impl_, rank);
  return slot;
}

int64_t ThreadWorld::issued(int rank) {
  return static_cast<ThreadCommunicator&>(*communicator(rank)).issued();
}

void ThreadWorld::abort(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    if (impl_->aborted.empty()) impl_->aborted = why;
  }
  impl_->cv.notify_all();
}

void ThreadWorld::run(const std::function<void(int rank)>& fn) {
  std::mutex mutex;
  std::exception_ptr first;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size_; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        fn(rank);
      } catch (const std::exception& e) {
        {
          std::lock_guard<std::mutex> lock(mutex);
          if (!first) first = std::current_exception();
        }
        abort(fmt::format("rank {} failed: {}", rank, e.what()));
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

struct WaitCounts {
  std::atomic<int> wait{0};
  std::atomic<int> waitOnStream{0};
};

namespace {

class RecordedWork : public comm::Work {
 public:
  RecordedWork(std::shared_ptr<comm::Work> inner, std::shared_ptr<WaitCounts> counts)
      : inner_(std::move(inner)), counts_(std::move(counts)) {}
  bool isCompleted() override { return inner_->isCompleted(); }
  void wait(comm::Millis timeout) override {
    counts_->wait++;
    inner_->wait(timeout);
  }
  void waitOnStream(void* stream, comm::Millis timeout) override {
    counts_->waitOnStream++;
    inner_->waitOnStream(stream, timeout);
  }

 private:
  std::shared_ptr<comm::Work> inner_;
  std::shared_ptr<WaitCounts> counts_;
};

}  // namespace

WaitRecordingCommunicator::WaitRecordingCommunicator(std::shared_ptr<comm::Communicator> inner)
    : inner_(std::move(inner)), counts_(std::make_shared<WaitCounts>()) {}

std::shared_ptr<comm::Work> WaitRecordingCommunicator::record(std::shared_ptr<comm::Work> work) {
  return std::make_shared<RecordedWork>(std::move(work), counts_);
}

std::shared_ptr<comm::Work> WaitRecordingCommunicator::allreduceAsync(
    void* data, size_t count, comm::DataType dtype, comm::ReduceOp op,
    const comm::CallOptions& options) {
  return record(inner_->allreduceAsync(data, count, dtype, op, options));
}

std::shared_ptr<comm::Work> WaitRecordingCommunicator::broadcastAsync(
    void* data, size_t count, comm::DataType dtype, int root, const comm::CallOptions& options) {
  return record(inner_->broadcastAsync(data, count, dtype, root, options));
}

std::shared_ptr<comm::Work> WaitRecordingCommunicator::allgatherAsync(
    const void* send, void* recv, size_t count, comm::DataType dtype,
    const comm::CallOptions& options) {
  return record(inner_->allgatherAsync(send, recv, count, dtype, options));
}

std::shared_ptr<comm::Work> WaitRecordingCommunicator::reduceScatterAsync(
    const void* send, void* recv, size_t count, comm::DataType dtype, comm::ReduceOp op,
    const comm::CallOptions& options) {
  return record(inner_->reduceScatterAsync(send, recv, count, dtype, op, options));
}

std::shared_ptr<comm::Work> WaitRecordingCommunicator::barrierAsync(
    const comm::CallOptions& options) {
  return record(inner_->barrierAsync(options));
}

WaitRecordingCommunicator::Counts WaitRecordingCommunicator::counts() const {
  return Counts{counts_->wait.load(), counts_->waitOnStream.load()};
}

void runRanks(int size, const std::function<void(int rank)>& fn) {
  std::vector<std::thread> threads;
  std::mutex mutex;
  std::vector<std::string> failures;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        const comm::ScopedCollectiveFaults none({});
        fn(r);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mutex);
        failures.push_back("rank " + std::to_string(r) + ": " + e.what());
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& f : failures) ADD_FAILURE() << f;
}

comm::GlooOptions glooTestOptions(int rank, int size, std::shared_ptr<store::Store> store,
                                  std::chrono::milliseconds timeout) {
  comm::GlooOptions o;
  o.rank = rank;
  o.size = size;
  o.store = std::move(store);
  o.timeout = timeout;
  o.connectTimeout = std::chrono::milliseconds(10000);
  o.checkCollectivesFromEnv = false;
  return o;
}

std::vector<std::shared_ptr<comm::Communicator>> makeGlooWorld(
    int size, const std::function<void(comm::GlooOptions&)>& tweak,
    const std::vector<fault::Fault>& faults) {
  auto store = std::make_shared<store::HashStore>();
  std::vector<std::shared_ptr<comm::Communicator>> world(size);
  runRanks(size, [&](int r) {
    auto o = glooTestOptions(r, size, store);
    if (tweak) tweak(o);
    const comm::ScopedCollectiveFaults injected(faults);
    world[r] = comm::createGlooCommunicator(o);
  });
  return world;
}

}  // namespace dtrain::testing
