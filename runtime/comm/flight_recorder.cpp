#include "flight_recorder.h"

#include <fmt/format.h>

namespace dtrain::comm {

FlightRecorder::FlightRecorder(size_t capacity) : ring_(capacity == 0 ? 1 : capacity) {}

const char* FlightRecorder::stateName(State state) {
  switch (state) {
    case State::Queued: return "queued";
    case State::Running: return "running";
    case State::Done: return "done";
    case State::Failed: return "failed";
    case State::Skipped: return "skipped";
  }
  return "?";
}

void FlightRecorder::recordQueued(const CollectiveInfo& info) {
  auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(mutex_);
  Entry& e = ring_[next_];
  e.info = info;
  e.state = State::Queued;
  e.queuedAt = now;
  e.changedAt = now;
  next_ = (next_ + 1) % ring_.size();
  if (size_ < ring_.size()) ++size_;
}

void FlightRecorder::setState(uint64_t seq, State state) {
  auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(mutex_);
  // Recent entries are at the end: search backwards from the newest.
  for (size_t k = 0; k < size_; ++k) {
    Entry& e = ring_[(next_ + ring_.size() - 1 - k) % ring_.size()];
    if (e.info.seq == seq) {
      e.state = state;
      e.changedAt = now;
      return;
    }
  }
}

std::vector<FlightRecorder::Entry> FlightRecorder::snapshot() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<Entry> out;
  out.reserve(size_);
  for (size_t k = 0; k < size_; ++k) {
    out.push_back(ring_[(next_ + ring_.size() - size_ + k) % ring_.size()]);
  }
  return out;
}

std::string FlightRecorder::dump(size_t last) const {
  auto entries = snapshot();
  auto now = std::chrono::steady_clock::now();
  size_t from = entries.size() > last ? entries.size() - last : 0;
  std::string text;
  for (size_t i = from; i < entries.size(); ++i) {
    const Entry& e = entries[i];
    bool open = e.state == State::Queued || e.state == State::Running;
    double ms =
        std::chrono::duration<double, std::milli>((open ? now : e.changedAt) - e.queuedAt).count();
    if (!text.empty()) text += "; ";
    text += fmt::format("{} {} {:.1f} ms", e.info.describeWithSeq(), stateName(e.state), ms);
  }
  return text.empty() ? "none" : text;
}

progress::CollectiveState FlightRecorder::progressState(const std::string& name, uint64_t issued,
                                                        size_t last) const {
  auto entries = snapshot();
  auto now = std::chrono::steady_clock::now();
  progress::CollectiveState state;
  state.name = name;
  state.issued = issued;
  size_t from = entries.size() > last ? entries.size() - last : 0;
  for (size_t i = from; i < entries.size(); ++i) {
    const Entry& e = entries[i];
    bool open = e.state == State::Queued || e.state == State::Running;
    progress::CollectiveEntry out;
    out.seq = e.info.seq;
    out.what = e.info.describe();
    out.state = stateName(e.state);
    out.ms =
        std::chrono::duration<double, std::milli>((open ? now : e.changedAt) - e.queuedAt).count();
    state.tail.push_back(std::move(out));
  }
  return state;
}

}  // namespace dtrain::comm
