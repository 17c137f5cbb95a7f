// The NCCL backend on one GPU (world size 1: NCCL refuses two ranks on one device). Skipped
// without a GPU. Covers init, every collective and dtype, ordering with the caller's stream both
// ways, the watchdog's timeout-abort through an injected hang (DTRAIN_FAULT kinds), an abort
// from another thread (Communicator::abort), and init's deadline.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "collective_faults.h"
#include "dtrain/base/error.h"
#include "dtrain/comm/nccl_communicator.h"
#include "half.h"

namespace dtrain::comm::nccl_gpu_test {
namespace {

using std::chrono::milliseconds;

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

class NcclGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device: the gpu tests need one";
  }

  std::shared_ptr<Communicator> make(milliseconds timeout = milliseconds(10000),
                                     std::vector<fault::Fault> faults = {}, bool blocking = false) {
    NcclOptions o;
    o.rank = 0;
    o.size = 1;
    o.store = std::make_shared<store::HashStore>();
    o.device = 0;
    o.timeout = timeout;
    o.blockingWait = blocking;
    const ScopedCollectiveFaults injected(std::move(faults));
    return createNcclCommunicator(o);
  }
};

// Host bytes of `count` elements holding i % 5 (every dtype represents those exactly).
std::vector<uint8_t> pattern(DataType dtype, size_t count) {
  std::vector<uint8_t> out(count * elementSize(dtype));
  for (size_t i = 0; i < count; ++i) {
    const double v = static_cast<double>(i % 5);
    uint8_t* p = out.data() + i * elementSize(dtype);
    switch (dtype) {
      case DataType::Float32: {
        float f = static_cast<float>(v);
        std::memcpy(p, &f, 4);
        break;
      }
      case DataType::Float64: std::memcpy(p, &v, 8); break;
      case DataType::Float16: {
        uint16_t h = floatToHalf(static_cast<float>(v));
        std::memcpy(p, &h, 2);
        break;
      }
      case DataType::BFloat16: {
        uint16_t h = floatToBf16(static_cast<float>(v));
        std::memcpy(p, &h, 2);
        break;
      }
      case DataType::Int32: {
        int32_t x = static_cast<int32_t>(v);
        std::memcpy(p, &x, 4);
        break;
      }
      case DataType::Int64: {
        int64_t x = static_cast<int64_t>(v);
        std::memcpy(p, &x, 8);
        break;
      }
      default: break;
    }
  }
  return out;
}

TEST_F(NcclGpu, InitDescribesTheDevice) {
  auto c = make();
  EXPECT_STREQ(c->backendName(), "nccl");
  EXPECT_EQ(c->describe(), "nccl rank 0/1 (cuda:0)");
  EXPECT_NE(c->deviceStream(), nullptr);
  c->barrier();
  c->shutdown();
  EXPECT_THROW(c->barrier(), Error);
}

// Note [Non-blocking communicators]: a communicator of two ranks of which only rank 0 ever comes
// (the other's process died before init) ends in a TimeoutError at connectTimeout, aborted,
// instead of waiting in NCCL for good.
TEST_F(NcclGpu, InitWithARankThatNeverComesTimesOut) {
  NcclOptions o;
  o.rank = 0;
  o.size = 2;
  o.store = std::make_shared<store::HashStore>();
  o.device = 0;
  o.connectTimeout = milliseconds(2000);
  const auto start = std::chrono::steady_clock::now();
  std::string message;
  try {
    createNcclCommunicator(o);
    ADD_FAILURE() << "init of two ranks returned with one";
  } catch (const TimeoutError& e) {
    message = e.what();
  }
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_GE(took, milliseconds(1900));
  EXPECT_LT(took, milliseconds(7000)) << "ncclCommAbort of the init took long";
  EXPECT_NE(message.find("ncclCommInitRank on cuda:0 did not complete within 2000 ms"),
            std::string::npos)
      << message;
  // The device is usable after the abort.
  auto c = make();
  c->barrier();
  c->shutdown();
}

TEST_F(NcclGpu, EveryCollectiveAndDtypeAtWorldSizeOne) {
  auto c = make();
  for (DataType dtype : {DataType::Float32, DataType::Float64, DataType::Float16,
                         DataType::BFloat16, DataType::Int32, DataType::Int64}) {
    for (size_t count : {size_t(0), size_t(1), size_t(1001), size_t(1) << 20}) {
      const auto host = pattern(dtype, count);
      const size_t bytes = host.size();
      auto a = c->allocate(bytes);
      auto b = c->allocate(bytes);
      std::vector<uint8_t> back(bytes);
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) {
        CUDA_OK(cudaMemcpy(a->data(), host.data(), bytes, cudaMemcpyHostToDevice));
        c->allreduce(a->data(), count, dtype, op);
        CUDA_OK(cudaDeviceSynchronize());
        CUDA_OK(cudaMemcpy(back.data(), a->data(), bytes, cudaMemcpyDeviceToHost));
        ASSERT_EQ(back, host) << dataTypeName(dtype) << " " << reduceOpName(op) << " " << count;
      }
      c->broadcast(a->data(), count, dtype, 0);
      CUDA_OK(cudaMemset(b->data(), 0xff, bytes));
      c->allgather(a->data(), b->data(), count, dtype);
      CUDA_OK(cudaDeviceSynchronize());
      CUDA_OK(cudaMemcpy(back.data(), b->data(), bytes, cudaMemcpyDeviceToHost));
      ASSERT_EQ(back, host) << "allgather " << dataTypeName(dtype);
      CUDA_OK(cudaMemset(b->data(), 0xff, bytes));
      c->reduceScatter(a->data(), b->data(), count, dtype, ReduceOp::Sum);
      CUDA_OK(cudaDeviceSynchronize());
      CUDA_OK(cudaMemcpy(back.data(), b->data(), bytes, cudaMemcpyDeviceToHost));
      ASSERT_EQ(back, host) << "reduceScatter " << dataTypeName(dtype);
    }
  }
  c->barrier();
  EXPECT_EQ(c->error(), nullptr);
}

void CUDART_CB sleepHostFunc(void* ms) {
  std::this_thread::sleep_for(milliseconds(reinterpret_cast<intptr_t>(ms)));
}

TEST_F(NcclGpu, CollectivesAreOrderedWithTheCallersStreamBothWays) {
  // Before: the caller's stream sleeps 300 ms, then fills `send`; the collective (on the
  // communicator's own stream) must see the filled data. After: the communicator's stream sleeps
  // 300 ms before the collective (DTRAIN_FAULT slow); a copy queued on the caller's stream after
  // wait() must see the result.
  fault::Fault slow;
  slow.kind = fault::Kind::Slow;
  slow.arg = 300;
  slow.step = 1;
  auto c = make(milliseconds(10000), {slow});
  const size_t count = 1 << 20;
  auto send = c->allocate(count * 4);
  auto recv = c->allocate(count * 4);
  cudaStream_t caller;
  CUDA_OK(cudaStreamCreateWithFlags(&caller, cudaStreamNonBlocking));
  std::vector<int32_t> host(count);
  CallOptions o;
  o.stream = caller;

  CUDA_OK(cudaMemset(send->data(), 0, count * 4));
  CUDA_OK(cudaMemset(recv->data(), 0, count * 4));
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(cudaLaunchHostFunc(caller, sleepHostFunc, reinterpret_cast<void*>(intptr_t{300})));
  CUDA_OK(cudaMemsetAsync(send->data(), 0x01, count * 4, caller));
  c->allgatherAsync(send->data(), recv->data(), count, DataType::Int32, o)->wait();  // seq 0
  CUDA_OK(cudaMemcpyAsync(host.data(), recv->data(), count * 4, cudaMemcpyDeviceToHost, caller));
  CUDA_OK(cudaStreamSynchronize(caller));
  EXPECT_EQ(host.front(), 0x01010101) << "the collective ran before the caller's stream filled it";
  EXPECT_EQ(host.back(), 0x01010101);

  CUDA_OK(cudaMemsetAsync(send->data(), 0x02, count * 4, caller));
  auto work = c->allgatherAsync(send->data(), recv->data(), count, DataType::Int32,
                                o);  // seq 1: slow
  work->wait();
  CUDA_OK(cudaMemcpyAsync(host.data(), recv->data(), count * 4, cudaMemcpyDeviceToHost, caller));
  CUDA_OK(cudaStreamSynchronize(caller));
  EXPECT_EQ(host.front(), 0x02020202) << "the caller's stream did not wait for the collective";
  EXPECT_TRUE(work->isCompleted());
  CUDA_OK(cudaStreamDestroy(caller));
}

TEST_F(NcclGpu, TheWatchdogAbortsAHungCollectiveAndNamesIt) {
  fault::Fault hang;
  hang.kind = fault::Kind::Hang;
  hang.step = 1;
  auto c = make(milliseconds(1000), {hang}, /*blocking=*/true);
  auto buf = c->allocate(4096);
  c->allreduce(buf->data(), 1024, DataType::Float32, ReduceOp::Sum);  // seq 0: fine
  auto start = std::chrono::steady_clock::now();
  std::string message;
  try {
    c->allreduce(buf->data(), 1024, DataType::Float32, ReduceOp::Sum);  // seq 1: hangs
    ADD_FAILURE() << "a hung collective returned";
  } catch (const TimeoutError& e) {
    message = e.what();
  }
  double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(ms, 950);
  EXPECT_LE(ms, 3000) << "never an endless hang: timeout + watchdog interval";
  EXPECT_NE(message.find("nccl rank 0/1: seq 1 allreduce(float32 x 1024, sum) on cuda:0 did not "
                         "finish within its timeout; the communicator was aborted (ncclCommAbort)"),
            std::string::npos)
      << message;
  start = std::chrono::steady_clock::now();
  EXPECT_THROW(c->barrier(), TimeoutError) << "later calls rethrow the first error";
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(100));
  c->shutdown();
}

TEST_F(NcclGpu, WithoutBlockingWaitTheFailureShowsUpInError) {
  fault::Fault hang;
  hang.kind = fault::Kind::Hang;
  hang.step = 0;
  auto c = make(milliseconds(800), {hang});
  auto buf = c->allocate(64);
  auto work = c->allreduceAsync(buf->data(), 16, DataType::Int32, ReduceOp::Max);
  work->wait();  // orders streams only: returns at once
  auto deadline = std::chrono::steady_clock::now() + milliseconds(3000);
  while (c->error() == nullptr && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(20));
  }
  ASSERT_NE(c->error(), nullptr);
  EXPECT_TRUE(work->isCompleted());
  EXPECT_THROW(work->wait(), TimeoutError);
}

// Communicator::abort from another thread (a lost node's membership epoch): a collective held
// by an injected hang is released with MembershipChanged well before its 10 s timeout; later calls
// rethrow it at once; shutdown() after it returns.
TEST_F(NcclGpu, AbortFromAnotherThreadReleasesAHungCollective) {
  fault::Fault hang;
  hang.kind = fault::Kind::Hang;
  hang.step = 1;
  auto c = make(milliseconds(10000), {hang}, /*blocking=*/true);
  auto buf = c->allocate(4096);
  c->allreduce(buf->data(), 1024, DataType::Float32, ReduceOp::Sum);  // seq 0: fine
  std::thread aborter([&] {
    std::this_thread::sleep_for(milliseconds(300));
    c->abort("epoch 1: a test's lost node");
  });
  const auto start = std::chrono::steady_clock::now();
  std::string message;
  try {
    c->allreduce(buf->data(), 1024, DataType::Float32, ReduceOp::Sum);  // seq 1: hangs
    ADD_FAILURE() << "a hung collective returned";
  } catch (const MembershipChanged& e) {
    message = e.what();
  }
  aborter.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(1300));
  EXPECT_NE(message.find("membership changed: epoch 1: a test's lost node"), std::string::npos)
      << message;
  const auto again = std::chrono::steady_clock::now();
  EXPECT_THROW(c->barrier(), MembershipChanged);
  EXPECT_LT(std::chrono::steady_clock::now() - again, milliseconds(100));
  c->shutdown();
}

TEST_F(NcclGpu, AbortOfAnIdleCommunicatorThenShutdown) {
  auto c = make();
  c->barrier();
  c->abort("epoch 1: idle");
  c->abort("epoch 2: a second abort keeps the first reason");
  try {
    c->barrier();
    ADD_FAILURE() << "an aborted communicator ran a barrier";
  } catch (const MembershipChanged& e) {
    EXPECT_NE(std::string(e.what()).find("epoch 1: idle"), std::string::npos) << e.what();
  }
  c->shutdown();
}

TEST_F(NcclGpu, AllocateReturnsDeviceMemory) {
  auto c = make();
  auto buf = c->allocate(1 << 20);
  cudaPointerAttributes attr{};
  CUDA_OK(cudaPointerGetAttributes(&attr, buf->data()));
  EXPECT_EQ(attr.type, cudaMemoryTypeDevice);
  EXPECT_EQ(attr.device, 0);
  EXPECT_EQ(buf->bytes(), size_t(1) << 20);
}

}  // namespace
}  // namespace dtrain::comm::nccl_gpu_test
