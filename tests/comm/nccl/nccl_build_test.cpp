// What of the NCCL backend can be checked without a GPU (label unit; built whenever NCCL and CUDA
// are found, runs everywhere): the device guard's rule (Note [Device guards and GPU 0]) through a
// fake device API, how the failure report joins an NCCL error, the dtype/op mapping (which no
// GPU test can see: at world size 1 an allreduce is an identity whatever NCCL was told), and how a
// non-blocking NCCL call is waited for (Note [Non-blocking communicators]) through a fake NCCL.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <vector>

#include "device_guard.h"
#include "dtrain/base/error.h"
#include "nccl_errors.h"
#include "nccl_progress.h"
#include "nccl_types.h"

namespace dtrain::comm::nccl_build_test {
namespace {

// A thread's view of the CUDA devices: the current one, which have a primary context, and every
// cudaSetDevice made. Setting a device creates its context, as cudaSetDevice does since CUDA 12.
struct FakeDevices {
  static inline int currentDevice = 0;
  static inline std::map<int, bool> context;
  static inline std::vector<int> sets;

  static void reset(int current, std::map<int, bool> contexts) {
    currentDevice = current;
    context = std::move(contexts);
    sets.clear();
  }
  static int current() noexcept { return currentDevice; }
  static void set(int device) {
    sets.push_back(device);
    currentDevice = device;
    context[device] = true;
  }
  static void restore(int device) noexcept { set(device); }
  static bool hasContext(int device) noexcept { return context[device]; }
};
using FakeGuard = BasicDeviceGuard<FakeDevices>;

TEST(NcclDeviceGuard, AlreadyCurrentDeviceIsNeitherSetNorRestored) {
  FakeDevices::reset(3, {{3, true}});
  { FakeGuard guard(3); }
  EXPECT_TRUE(FakeDevices::sets.empty()) << "a set the guard did not need";
  EXPECT_EQ(FakeDevices::currentDevice, 3);
}

TEST(NcclDeviceGuard, AChangedDeviceWithAContextIsRestored) {
  FakeDevices::reset(1, {{1, true}, {3, true}});
  { FakeGuard guard(3); }
  EXPECT_EQ(FakeDevices::sets, (std::vector<int>{3, 1}));
  EXPECT_EQ(FakeDevices::currentDevice, 1);
}

TEST(NcclDeviceGuard, NoContextIsCreatedOnGpuZeroToRestoreIt) {
  // A rank's thread that never chose a device reports device 0, which has no context: restoring
  // it would create one (hundreds of MiB on GPU 0 in every rank).
  FakeDevices::reset(0, {});
  { FakeGuard guard(5); }
  EXPECT_EQ(FakeDevices::sets, (std::vector<int>{5}));
  EXPECT_FALSE(FakeDevices::context[0]) << "the guard created a context on device 0";
  EXPECT_EQ(FakeDevices::currentDevice, 5);
}

TEST(NcclDeviceGuard, UnknownCurrentDeviceIsNotRestored) {
  FakeDevices::reset(-1, {});  // cudaGetDevice failed
  { FakeGuard guard(2); }
  EXPECT_EQ(FakeDevices::sets, (std::vector<int>{2}));
}

TEST(NcclFailureReport, OtherRanksGoBeforeTheHintAndTheTypeStays) {
  // Note [NCCL failure report]: the ranks' reports are added to the watchdog's error.
  auto error = std::make_exception_ptr(TimeoutError(
      "nccl rank 0/2: seq 3 allreduce(float32 x 4, sum) on cuda:0 did not finish within its "
      "timeout. HINT: a rank that died [nccl_errors.cpp:9]"));
  auto joined = withOtherRanks(error,
                               "rank 1 is behind at seq 2 (barrier(); this rank is at seq 3)");
  try {
    std::rethrow_exception(joined);
  } catch (const TimeoutError& e) {
    EXPECT_STREQ(e.what(),
                 "nccl rank 0/2: seq 3 allreduce(float32 x 4, sum) on cuda:0 did not finish within "
                 "its timeout. Other ranks: rank 1 is behind at seq 2 (barrier(); this rank is at "
                 "seq 3). HINT: a rank that died [nccl_errors.cpp:9]");
  } catch (...) {
    ADD_FAILURE() << "the error changed type";
  }
  auto plain = withOtherRanks(std::make_exception_ptr(NetworkError("peer gone")),
                              "rank 1 did not report");
  EXPECT_THROW(std::rethrow_exception(plain), NetworkError);
}

// Bytes per element of an NCCL type, from NCCL's documentation of ncclDataType_t.
size_t ncclBytes(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
    default: return 0;
  }
}

TEST(NcclMapping, EveryDataTypeIsItsNcclTwin) {
  const std::vector<std::pair<DataType, ncclDataType_t>> table = {
      {DataType::Float32, ncclFloat32}, {DataType::Float64, ncclFloat64},
      {DataType::Float16, ncclFloat16}, {DataType::BFloat16, ncclBfloat16},
      {DataType::Int32, ncclInt32},     {DataType::Int64, ncclInt64},
      {DataType::UInt8, ncclUint8},     {DataType::Int8, ncclInt8}};
  // The table covers the whole enum (Int8 is its last value).
  ASSERT_EQ(table.size(), static_cast<size_t>(DataType::Int8) + 1);
  for (const auto& [ours, theirs] : table) {
    EXPECT_EQ(toNcclDataType(ours), theirs) << dataTypeName(ours);
    EXPECT_EQ(ncclBytes(toNcclDataType(ours)), elementSize(ours)) << dataTypeName(ours);
  }
  EXPECT_THROW(toNcclDataType(static_cast<DataType>(200)), InvalidArgument);
}

TEST(NcclMapping, EveryReductionIsItsNcclTwin) {
  EXPECT_EQ(toNcclRedOp(ReduceOp::Sum), ncclSum);
  EXPECT_EQ(toNcclRedOp(ReduceOp::Avg), ncclAvg);
  EXPECT_EQ(toNcclRedOp(ReduceOp::Max), ncclMax);
  EXPECT_EQ(toNcclRedOp(ReduceOp::Min), ncclMin);
  EXPECT_THROW(toNcclRedOp(static_cast<ReduceOp>(200)), InvalidArgument);
}

// A communicator's state as NCCL would report it, one answer per poll, on a clock that moves
// only when the poller sleeps.
struct FakeNccl {
  using Clock = std::chrono::steady_clock;
  static inline std::vector<ncclResult_t> answers;  // what each poll returns; the last repeats
  static inline size_t polls = 0;
  static inline Clock::duration slept{};
  static inline ncclComm_t polled = nullptr;

  static void reset(std::vector<ncclResult_t> a) {
    answers = std::move(a);
    polls = 0;
    slept = {};
  }
  static ncclResult_t state(ncclComm_t comm, ncclResult_t* result) {
    polled = comm;
    *result = answers[std::min(polls, answers.size() - 1)];
    ++polls;
    return ncclSuccess;
  }
  static Clock::time_point now() { return Clock::time_point() + slept; }
  static void sleep(std::chrono::microseconds d) { slept += d; }
};

const auto kNever = FakeNccl::Clock::time_point::max();
ncclComm_t fakeComm() { return reinterpret_cast<ncclComm_t>(0x1234); }

TEST(NcclProgress, ACallThatReturnedDoneIsNeverPolled) {
  FakeNccl::reset({ncclInternalError});
  const NcclProgress p = awaitNccl<FakeNccl>(fakeComm(), ncclSuccess, kNever, [] { return false; });
  EXPECT_EQ(p.result, ncclSuccess);
  EXPECT_EQ(FakeNccl::polls, 0U);
  FakeNccl::reset({ncclSuccess});
  EXPECT_EQ(awaitNccl<FakeNccl>(fakeComm(), ncclRemoteError, kNever, [] { return false; }).result,
            ncclRemoteError);
  EXPECT_EQ(FakeNccl::polls, 0U);
}

TEST(NcclProgress, AnInProgressCallIsPolledUntilItsStateLeavesInProgress) {
  FakeNccl::reset({ncclInProgress, ncclInProgress, ncclInProgress, ncclSuccess});
  NcclProgress p = awaitNccl<FakeNccl>(fakeComm(), ncclInProgress, kNever, [] { return false; });
  EXPECT_EQ(p.result, ncclSuccess);
  EXPECT_FALSE(p.timedOut);
  EXPECT_FALSE(p.stopped);
  EXPECT_EQ(FakeNccl::polls, 4U);
  EXPECT_EQ(FakeNccl::polled, fakeComm());
  // Backing off from 10 us: 10 + 20 + 40 + 80 before the fourth answer.
  EXPECT_EQ(FakeNccl::slept, std::chrono::microseconds(150));
  // A failure while connecting is the call's outcome.
  FakeNccl::reset({ncclInProgress, ncclRemoteError});
  p = awaitNccl<FakeNccl>(fakeComm(), ncclInProgress, kNever, [] { return false; });
  EXPECT_EQ(p.result, ncclRemoteError);
  EXPECT_FALSE(p.timedOut);
}

TEST(NcclProgress, TheDeadlineEndsTheWaitWithTheCallStillInProgress) {
  // Polls back off to one a millisecond, so a 50 ms deadline is kept within a poll.
  FakeNccl::reset({ncclInProgress});
  const auto deadline = FakeNccl::now() + std::chrono::milliseconds(50);
  const NcclProgress p = awaitNccl<FakeNccl>(fakeComm(), ncclInProgress, deadline,
                                             [] { return false; });
  EXPECT_TRUE(p.timedOut);
  EXPECT_FALSE(p.stopped);
  EXPECT_EQ(p.result, ncclInProgress);
  EXPECT_GE(FakeNccl::slept, std::chrono::milliseconds(50));
  EXPECT_LT(FakeNccl::slept, std::chrono::milliseconds(52));
  EXPECT_LT(FakeNccl::polls, 60U) << "it kept polling every 10 us";
}

TEST(NcclProgress, TheStopConditionEndsTheWaitBeforeTheNextPoll) {
  // The communicator failed (or was aborted) after the third poll: the caller stops waiting, so
  // the watchdog's ncclCommAbort gets the issue lock.
  FakeNccl::reset({ncclInProgress});
  const NcclProgress p = awaitNccl<FakeNccl>(fakeComm(), ncclInProgress, kNever,
                                             [] { return FakeNccl::polls >= 3; });
  EXPECT_TRUE(p.stopped);
  EXPECT_FALSE(p.timedOut);
  EXPECT_EQ(p.result, ncclInProgress);
  EXPECT_EQ(FakeNccl::polls, 3U);
}

}  // namespace
}  // namespace dtrain::comm::nccl_build_test
