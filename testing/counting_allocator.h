#pragma once
// CountingCpuAllocator: wraps libtorch's CPU allocator and counts the bytes of live CPU tensor
// storage and their peak, for tests and benchmarks that measure activation memory. Install it
// before the tensors to be counted are made; storage allocated earlier is freed by the allocator
// that made it and never counted. Header-only; needs libtorch (c10).

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <unordered_map>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <torch/version.h>

namespace dtrain::testing {

class CountingCpuAllocator final : public c10::Allocator {
 public:
  // Installs the process-wide instance (once) in front of the allocator in use, and returns it.
  static CountingCpuAllocator& install() {
    static CountingCpuAllocator* instance = [] {
      auto* a = new CountingCpuAllocator(c10::GetCPUAllocator());
      self() = a;
      // Priority above the default's, so a later SetCPUAllocator at priority 0 cannot undo it.
      c10::SetCPUAllocator(a, /*priority=*/100);
      return a;
    }();
    return *instance;
  }

  // The context is the data pointer and the deleter takes it alone (raw_deleter()), as for the
  // default allocator: oneDNN allocates through raw_allocate(), which needs both.
  c10::DataPtr allocate(size_t bytes) override {
    c10::DataPtr inner = inner_->allocate(bytes);
    void* data = inner.get();
    const c10::Device device = inner.device();
    if (data == nullptr) return inner;
    if (inner.get_context() != data) std::abort();  // not an allocator this wrapper can count
    {
      std::lock_guard<std::mutex> lock(mutex_);
      blocks_[data] = {bytes, inner.get_deleter()};
    }
    inner.release_context();
    const int64_t now = live_.fetch_add(static_cast<int64_t>(bytes)) + static_cast<int64_t>(bytes);
    int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    return {data, data, &CountingCpuAllocator::release, device};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &CountingCpuAllocator::release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  // Bytes of counted storage alive now.
  int64_t live() const { return live_.load(); }
  // The most that was alive at once since the last resetPeak().
  int64_t peak() const { return peak_.load(); }
  void resetPeak() { peak_.store(live_.load()); }

 private:
  struct Block {
    size_t bytes;
    c10::DeleterFnPtr deleter;  // the inner allocator's
  };

  explicit CountingCpuAllocator(c10::Allocator* inner) : inner_(inner) {}

  static CountingCpuAllocator*& self() {
    static CountingCpuAllocator* instance = nullptr;
    return instance;
  }

  static void release(void* data) {
    CountingCpuAllocator* a = self();
    Block block{};
    {
      std::lock_guard<std::mutex> lock(a->mutex_);
      auto it = a->blocks_.find(data);
      if (it == a->blocks_.end()) {
        // Raw memory the inner allocator gave out before the install (oneDNN frees through
        // whichever allocator is current).
        a->inner_->raw_deleter()(data);
        return;
      }
      block = it->second;
      a->blocks_.erase(it);
    }
    a->live_.fetch_sub(static_cast<int64_t>(block.bytes));
    block.deleter(data);
  }

  c10::Allocator* inner_;
  mutable std::mutex mutex_;
  mutable std::unordered_map<void*, Block> blocks_;  // guarded by mutex_
  mutable std::atomic<int64_t> live_{0};
  mutable std::atomic<int64_t> peak_{0};
};

}  // namespace dtrain::testing
