#include "c10d_peer.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "bench_buffers.h"
#include "common/stats.h"

namespace dtrain::bench {

namespace {

using Clock = std::chrono::steady_clock;

at::ScalarType scalarType(comm::DataType dtype) {
  switch (dtype) {
    case comm::DataType::Float32: return at::kFloat;
    case comm::DataType::Float64: return at::kDouble;
    case comm::DataType::Float16: return at::kHalf;
    case comm::DataType::BFloat16: return at::kBFloat16;
    case comm::DataType::Int32: return at::kInt;
    case comm::DataType::Int64: return at::kLong;
    default: return at::kFloat;
  }
}

c10d::ReduceOp reduceOp(comm::ReduceOp op) {
  switch (op) {
    case comm::ReduceOp::Sum: return c10d::ReduceOp::SUM;
    case comm::ReduceOp::Avg: return c10d::ReduceOp::AVG;
    case comm::ReduceOp::Max: return c10d::ReduceOp::MAX;
    case comm::ReduceOp::Min: return c10d::ReduceOp::MIN;
  }
  return c10d::ReduceOp::SUM;
}

class GlooPeer final : public C10dPeer {
 public:
  GlooPeer(c10::intrusive_ptr<c10d::TCPStore> store, c10::intrusive_ptr<c10d::ProcessGroupGloo> pg,
           int rank, int world, comm::DataType dtype, comm::ReduceOp op, size_t maxBytes)
      : store_(std::move(store)),
        pg_(std::move(pg)),
        rank_(rank),
        world_(world),
        dtype_(dtype),
        op_(op) {
    // One buffer for every size, touched once here: first touches stay out of the timed loop.
    buffer_ = at::zeros({static_cast<int64_t>(maxBytes / comm::elementSize(dtype))},
                        at::TensorOptions().dtype(scalarType(dtype)));
  }

  Result run(size_t bytes, int warmup, int iters) override {
    const size_t count = bytes / comm::elementSize(dtype_);
    std::vector<at::Tensor> tensors{buffer_.narrow(0, 0, static_cast<int64_t>(count))};
    c10d::AllreduceOptions options;
    options.reduceOp = reduceOp(op_);
    fillHost(tensors[0].data_ptr(), dtype_, rank_, count);
    pg_->allreduce(tensors, options)->wait();
    Result result;
    result.wrong = countWrongHost(tensors[0].data_ptr(), dtype_, count, world_, op_);
    for (int i = 0; i < warmup; ++i) pg_->allreduce(tensors, options)->wait();
    pg_->barrier()->wait();
    std::vector<double> times;
    for (int i = 0; i < iters; ++i) {
      auto t0 = Clock::now();
      pg_->allreduce(tensors, options)->wait();
      times.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    }
    result.medianUs = median(times);
    return result;
  }

 private:
  c10::intrusive_ptr<c10d::TCPStore> store_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
  int rank_;
  int world_;
  comm::DataType dtype_;
  comm::ReduceOp op_;
  at::Tensor buffer_;
};

}  // namespace

std::unique_ptr<C10dPeer> C10dPeer::start(store::Store& store, int rank, int world,
                                          comm::DataType dtype, comm::ReduceOp op,
                                          size_t maxBytes) {
  if (op == comm::ReduceOp::Avg) {
    // c10d's Gloo (libtorch 1.13) refuses ReduceOp.AVG.
    if (rank == 0) std::fprintf(stderr, "# c10d peer: ProcessGroupGloo has no avg; skipped\n");
    return nullptr;
  }
  // Every rank decides the same way: the same dtype and op, the same libtorch.
  const std::string portKey = "allreduce_bench/c10d_port";
  c10d::TCPStoreOptions o;
  o.waitWorkers = false;
  o.timeout = std::chrono::milliseconds(120000);
  c10::intrusive_ptr<c10d::TCPStore> c10dStore;
  if (rank == 0) {
    o.port = 0;
    o.isServer = true;
    c10dStore = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", o);
    store.setString(portKey, std::to_string(c10dStore->getPort()));
    store.flush();
  } else {
    o.port = static_cast<uint16_t>(std::stoi(store.getString(portKey)));
    o.isServer = false;
    c10dStore = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", o);
  }
  auto options = c10d::ProcessGroupGloo::Options::create(std::chrono::milliseconds(120000));
  options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(c10dStore, rank, world, options);
  // c10d's Gloo checks the type before communicating, so every rank fails this alike.
  try {
    std::vector<at::Tensor> probe{at::zeros({1}, at::TensorOptions().dtype(scalarType(dtype)))};
    c10d::AllreduceOptions probeOptions;
    probeOptions.reduceOp = reduceOp(op);
    pg->allreduce(probe, probeOptions)->wait();
  } catch (const std::exception& e) {
    if (rank == 0) {
      std::fprintf(stderr, "# c10d peer: ProcessGroupGloo refuses %s %s; skipped\n",
                   comm::dataTypeName(dtype), comm::reduceOpName(op));
    }
    return nullptr;
  }
  return std::make_unique<GlooPeer>(std::move(c10dStore), std::move(pg), rank, world, dtype, op,
                                    maxBytes);
}

}  // namespace dtrain::bench
