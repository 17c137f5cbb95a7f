#include "state.h"

#include <mutex>

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <c10/core/GradMode.h>

#include "../torch_compat.h"
#include "dtrain/base/error.h"

namespace dtrain::recompute_state {

RngStates RngStates::capture(const std::vector<c10::Device>& cudaDevices) {
  RngStates out;
  auto add = [&out](at::Generator generator) {
    std::lock_guard<std::mutex> lock(generator.mutex());
    out.states_.push_back({generator, generator.get_state()});
  };
  add(at::globalContext().defaultGenerator(c10::Device(c10::kCPU)));
  for (const auto& device : cudaDevices) add(at::globalContext().defaultGenerator(device));
  return out;
}

RngFork::RngFork(const RngStates& states) {
  for (const auto& s : states.states_) {
    at::Generator generator = s.generator;
    std::lock_guard<std::mutex> lock(generator.mutex());
    found_.states_.push_back({generator, generator.get_state()});
    generator.set_state(s.state);
  }
}

RngFork::~RngFork() {
  for (auto& s : found_.states_) {
    std::lock_guard<std::mutex> lock(s.generator.mutex());
    s.generator.set_state(s.state);
  }
}

AutocastState AutocastState::current() {
  AutocastState s;
  s.cpuEnabled = compat::autocastEnabled(c10::DeviceType::CPU);
  s.cpuDtype = compat::autocastDtype(c10::DeviceType::CPU);
  s.cudaEnabled = compat::autocastEnabled(c10::DeviceType::CUDA);
  s.cudaDtype = compat::autocastDtype(c10::DeviceType::CUDA);
  s.cacheEnabled = at::autocast::is_autocast_cache_enabled();
  return s;
}

void AutocastState::apply() const {
  compat::setAutocastEnabled(c10::DeviceType::CPU, cpuEnabled);
  compat::setAutocastDtype(c10::DeviceType::CPU, cpuDtype);
  compat::setAutocastEnabled(c10::DeviceType::CUDA, cudaEnabled);
  compat::setAutocastDtype(c10::DeviceType::CUDA, cudaDtype);
  at::autocast::set_autocast_cache_enabled(cacheEnabled);
}

AutocastRegion::AutocastRegion(const AutocastState& state) : found_(AutocastState::current()) {
  state.apply();
  at::autocast::increment_nesting();
}

AutocastRegion::~AutocastRegion() {
  // As AutocastGuard: the weight casts cached in the outermost region die with it.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  found_.apply();
}

AutocastCacheOff::AutocastCacheOff() : found_(at::autocast::is_autocast_cache_enabled()) {
  at::autocast::set_autocast_cache_enabled(false);
}

AutocastCacheOff::~AutocastCacheOff() { at::autocast::set_autocast_cache_enabled(found_); }

BufferGuard::BufferGuard(const RecomputeSegment& segment) : segment_(segment) {
  for (const auto& s : segment.statistics()) saved_.push_back(s.tensor.clone());
  for (const auto& b : segment.otherBuffers()) versions_.push_back(b.tensor._version());
}

void BufferGuard::restore() {
  c10::NoGradGuard noGrad;
  for (size_t i = 0; i < saved_.size(); ++i) segment_.statistics()[i].tensor.copy_(saved_[i]);
}

void BufferGuard::finish() {
  restore();
  for (size_t i = 0; i < versions_.size(); ++i) {
    const auto& b = segment_.otherBuffers()[i];
    DTRAIN_CHECK(b.tensor._version() == versions_[i],
                 "dtrain::recompute: running the segment again for backward changed buffer '{}' "
                 "in place, so it now differs from what the forward left. HINT: if its forward "
                 "updates it (as BatchNorm updates running statistics), register it with "
                 "RecomputeSegment::addStatistic(\"{}\", buffer) so that the recompute restores it",
                 b.name, b.name);
  }
}

}  // namespace dtrain::recompute_state
