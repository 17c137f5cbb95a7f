#pragma once
// BasicDeviceGuard: makes a CUDA device current for one scope and puts back only what it changed.
// A template over the device API so that its rule can be tested without a GPU; the NCCL backend
// uses DeviceGuard (cuda_device.h), the CUDA runtime instance.
//
// Note [Device guards and GPU 0]
// Since CUDA 12, cudaSetDevice(d) creates device d's primary context when it has none, hundreds
// of MiB of GPU memory. A guard that always restores the previous device therefore creates a
// context on GPU 0 in every rank: a thread that never chose a device reports device 0, and
// "restoring" it initialises GPU 0 (a well-known c10d bug, fixed there the same way). So the guard
//   - does nothing when the device is already current (no set, no restore);
//   - restores the previous device only when it changed it, and only when that device already has
//     an active primary context (Api::hasContext), i.e. when restoring creates nothing: a thread
//     that had no device in use stays on the communicator's device afterwards, which costs nothing.
// Threads of the backend itself (the watchdog) set their device once, first thing.

namespace dtrain::comm {

// Api: static int current() (-1 when unknown), static void set(int) (throws),
// static void restore(int) noexcept, static bool hasContext(int) noexcept.
template <typename Api>
class BasicDeviceGuard {
 public:
  explicit BasicDeviceGuard(int device) : previous_(Api::current()) {
    if (previous_ != device) {
      Api::set(device);
      changed_ = true;
    }
  }
  ~BasicDeviceGuard() {
    if (changed_ && previous_ >= 0 && Api::hasContext(previous_)) Api::restore(previous_);
  }
  BasicDeviceGuard(const BasicDeviceGuard&) = delete;
  BasicDeviceGuard& operator=(const BasicDeviceGuard&) = delete;

 private:
  int previous_;
  bool changed_ = false;
};

}  // namespace dtrain::comm
