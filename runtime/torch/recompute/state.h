#pragma once
// The thread and process state a recompute must reproduce or leave alone (Note [Recompute] in
// recompute.cpp): random generators, autocast, running statistics. Private to the torch layer.

#include <cstdint>
#include <vector>

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include "dtrain/torch/recompute.h"

namespace dtrain::recompute_state {

// The default generators' states (CPU, and CUDA for each device given) at one moment.
class RngStates {
 public:
  static RngStates capture(const std::vector<c10::Device>& cudaDevices);

 private:
  friend class RngFork;
  struct State {
    at::Generator generator;
    at::Tensor state;
  };
  std::vector<State> states_;
};

// Sets the captured states for the guard's lifetime, then puts back the states it found, so that
// the generators go on as if the recompute had drawn nothing.
class RngFork {
 public:
  explicit RngFork(const RngStates& states);
  ~RngFork();
  RngFork(const RngFork&) = delete;
  RngFork& operator=(const RngFork&) = delete;

 private:
  RngStates found_;
};

// Autocast's thread-local settings for CPU and CUDA at one moment.
struct AutocastState {
  bool cpuEnabled = false;
  c10::ScalarType cpuDtype = c10::ScalarType::BFloat16;
  bool cudaEnabled = false;
  c10::ScalarType cudaDtype = c10::ScalarType::Half;
  bool cacheEnabled = true;

  static AutocastState current();
  void apply() const;
};

// Runs with `state` set (a region of its own: autocast's weight cache is emptied when the
// outermost region ends), then restores what it found.
class AutocastRegion {
 public:
  explicit AutocastRegion(const AutocastState& state);
  ~AutocastRegion();
  AutocastRegion(const AutocastRegion&) = delete;
  AutocastRegion& operator=(const AutocastRegion&) = delete;

 private:
  AutocastState found_;
};

// Turns autocast's weight cache off for its lifetime: the segment's forward casts its weights
// itself rather than reading casts made before it (Note [Recompute] in recompute.cpp).
class AutocastCacheOff {
 public:
  AutocastCacheOff();
  ~AutocastCacheOff();
  AutocastCacheOff(const AutocastCacheOff&) = delete;
  AutocastCacheOff& operator=(const AutocastCacheOff&) = delete;

 private:
  bool found_;
};

// Copies the segment's running statistics and notes its other buffers' versions; restore() puts
// the statistics back, finish() too and then throws if another buffer changed.
class BufferGuard {
 public:
  explicit BufferGuard(const RecomputeSegment& segment);
  void restore();
  void finish();

 private:
  const RecomputeSegment& segment_;
  std::vector<at::Tensor> saved_;
  std::vector<int64_t> versions_;
};

}  // namespace dtrain::recompute_state
