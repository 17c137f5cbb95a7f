// What of the NCCL backend can be checked without a GPU (label unit; built whenever NCCL and CUDA
// are found, runs everywhere): the device guard's rule (Note [Device guards and GPU 0]) through a
// fake device API, how the failure report joins an NCCL error, and the dtype/op mapping (which no
// GPU test can see: at world size 1 an allreduce is an identity whatever NCCL was told).
#include <gtest/gtest.h>

#include <map>
#include <vector>

#include "device_guard.h"
#include "dtrain/base/error.h"
#include "nccl_errors.h"
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

}  // namespace
}  // namespace dtrain::comm::nccl_build_test
