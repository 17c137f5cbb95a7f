#pragma once
// CountingCpuAllocator: wraps libtorch's CPU allocator and counts the bytes of live CPU tensor
// storage and their peak, for tests and benchmarks that measure activation memory. Install it
// before the tensors to be counted are made; storage allocated earlier is freed by the allocator
// that made it and never counted. Header-only; needs libtorch (c10).

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <torch/version.h>

// libtorch 2.3 made Allocator::allocate non-const and added copy_data().
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
#define DTRAIN_TEST_ALLOCATE_CONST
#define DTRAIN_TEST_ALLOCATOR_COPY_DATA 1
#else
#define DTRAIN_TEST_ALLOCATE_CONST const
#define DTRAIN_TEST_ALLOCATOR_COPY_DATA 0
#endif

namespace dtrain::testing {

class CountingCpuAllocator final : public c10::Allocator {
 public:
  // Installs the process-wide instance (once) in front of the allocator in use, and returns it.
  static CountingCpuAllocator& install() {
    static CountingCpuAllocator* instance = [] {
      auto* a = new CountingCpuAllocator(c10::GetCPUAllocator());
      // Priority above the default's, so a later SetCPUAllocator at priority 0 cannot undo it.
      c10::SetCPUAllocator(a, /*priority=*/100);
      return a;
    }();
    return *instance;
  }

  c10::DataPtr allocate(size_t bytes) DTRAIN_TEST_ALLOCATE_CONST override {
    c10::DataPtr inner = inner_->allocate(bytes);
    void* data = inner.get();
    c10::Device device = inner.device();
    auto* record = new Record{std::move(inner), bytes, const_cast<CountingCpuAllocator*>(this)};
    const int64_t now = live_.fetch_add(static_cast<int64_t>(bytes)) + static_cast<int64_t>(bytes);
    int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    return {data, record, &CountingCpuAllocator::release, device};
  }

  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
#if DTRAIN_TEST_ALLOCATOR_COPY_DATA
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#endif

  // Bytes of counted storage alive now.
  int64_t live() const { return live_.load(); }
  // The most that was alive at once since the last resetPeak().
  int64_t peak() const { return peak_.load(); }
  void resetPeak() { peak_.store(live_.load()); }

 private:
  struct Record {
    c10::DataPtr inner;
    size_t bytes;
    CountingCpuAllocator* owner;
  };

  explicit CountingCpuAllocator(c10::Allocator* inner) : inner_(inner) {}

  static void release(void* context) {
    auto* record = static_cast<Record*>(context);
    record->owner->live_.fetch_sub(static_cast<int64_t>(record->bytes));
    delete record;  // frees the storage through the inner allocator's deleter
  }

  c10::Allocator* inner_;
  mutable std::atomic<int64_t> live_{0};
  mutable std::atomic<int64_t> peak_{0};
};

}  // namespace dtrain::testing
