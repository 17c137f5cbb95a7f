#include "launcher/monitor/gpu_sampler.h"

#include <dlfcn.h>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstring>

#include <fmt/format.h>

#include "launcher/monitor/command.h"

namespace dtrain::launcher::monitor {

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

std::vector<std::string_view> csvFields(std::string_view line) {
  std::vector<std::string_view> out;
  size_t at = 0;
  while (true) {
    size_t comma = line.find(',', at);
    out.push_back(
        trim(line.substr(at, comma == std::string_view::npos ? line.size() - at : comma - at)));
    if (comma == std::string_view::npos) break;
    at = comma + 1;
  }
  return out;
}

// A number, or nullopt for "[N/A]", "[Not Supported]", "N/A" and anything else non-numeric.
// nvidia-smi prints units even with nounits in a few versions ("250.00 W"): a trailing unit is
// ignored.
std::optional<double> csvNumber(std::string_view field) {
  if (field.empty() || field.front() == '[' || field == "N/A") return std::nullopt;
  double v = 0;
  auto [end, ec] = std::from_chars(field.data(), field.data() + field.size(), v);
  if (ec != std::errc() || end == field.data()) return std::nullopt;
  std::string_view rest = trim(
      std::string_view(end, static_cast<size_t>(field.data() + field.size() - end)));
  if (!rest.empty() && rest != "%" && rest != "MiB" && rest != "W" && rest != "C")
    return std::nullopt;
  return v;
}

template <typename Fn>
void forEachLine(std::string_view text, Fn fn) {
  size_t at = 0;
  int number = 0;
  while (at < text.size()) {
    size_t nl = text.find('\n', at);
    if (nl == std::string_view::npos) nl = text.size();
    ++number;
    std::string_view line = trim(text.substr(at, nl - at));
    if (!line.empty()) fn(line, number);
    at = nl + 1;
  }
}

}  // namespace

std::vector<GpuSample> parseGpuQueryCsv(std::string_view csv, std::vector<std::string>* problems) {
  std::vector<GpuSample> out;
  forEachLine(csv, [&](std::string_view line, int number) {
    auto f = csvFields(line);
    std::optional<double> index = f.size() == 9 || f.size() == 7 ? csvNumber(f[0]) : std::nullopt;
    if (!index || f[1].empty()) {
      if (problems) {
        problems->push_back(fmt::format("line {}: expected 9 fields ({}), got \"{}\"", number,
                                        kGpuQueryFields, line));
      }
      return;
    }
    GpuSample g;
    g.index = static_cast<int>(*index);
    g.uuid = std::string(f[1]);
    g.utilPercent = csvNumber(f[2]);
    if (auto used = csvNumber(f[3])) g.memUsedBytes = *used * kMiB;
    if (auto total = csvNumber(f[4])) g.memTotalBytes = *total * kMiB;
    g.temperatureC = csvNumber(f[5]);
    g.powerW = csvNumber(f[6]);
    if (f.size() == 9) {
      g.eccCorrected = csvNumber(f[7]);
      g.eccUncorrected = csvNumber(f[8]);
    }
    out.push_back(std::move(g));
  });
  return out;
}

std::vector<GpuApp> parseComputeAppsCsv(std::string_view csv, std::vector<std::string>* problems) {
  std::vector<GpuApp> out;
  forEachLine(csv, [&](std::string_view line, int number) {
    // "No running processes found" (older versions print it even with csv).
    if (line.find("No running") != std::string_view::npos) return;
    auto f = csvFields(line);
    std::optional<double> pid = f.size() == 3 ? csvNumber(f[0]) : std::nullopt;
    if (!pid || f[1].empty()) {
      if (problems) {
        problems->push_back(fmt::format("line {}: expected 3 fields ({}), got \"{}\"", number,
                                        kComputeAppsFields, line));
      }
      return;
    }
    GpuApp app;
    app.gpuUuid = std::string(f[1]);
    app.process.pid = static_cast<int64_t>(*pid);
    if (auto used = csvNumber(f[2])) app.process.usedBytes = static_cast<int64_t>(*used * kMiB);
    out.push_back(std::move(app));
  });
  return out;
}

void attachApps(std::vector<GpuSample>& gpus, const std::vector<GpuApp>& apps) {
  for (const auto& app : apps) {
    for (auto& g : gpus) {
      if (g.uuid == app.gpuUuid) g.processes.push_back(app.process);
    }
  }
}

namespace {

class NvidiaSmiSource : public GpuSource {
 public:
  explicit NvidiaSmiSource(GpuSourceOptions options) : options_(std::move(options)) {}

  std::vector<GpuSample> sample() override {
    lastError_.clear();
    CommandResult gpus = runCommand({options_.nvidiaSmi,
                                     std::string("--query-gpu=") + kGpuQueryFields,
                                     "--format=csv,noheader,nounits"},
                                    options_.timeout, 256 * 1024);
    if (!gpus.ok()) {
      lastError_ = gpus.error.empty() ? fmt::format("nvidia-smi exited {}: {}", gpus.exitCode,
                                                    trim(gpus.err.empty() ? gpus.out : gpus.err))
                                      : gpus.error;
      return {};
    }
    std::vector<GpuSample> out = parseGpuQueryCsv(gpus.out);
    CommandResult apps = runCommand({options_.nvidiaSmi,
                                     std::string("--query-compute-apps=") + kComputeAppsFields,
                                     "--format=csv,noheader,nounits"},
                                    options_.timeout, 256 * 1024);
    if (apps.ok()) attachApps(out, parseComputeAppsCsv(apps.out));
    return out;
  }

  std::string describe() const override { return "nvidia-smi (" + options_.nvidiaSmi + ")"; }

 private:
  GpuSourceOptions options_;
};

// The few NVML entry points launch needs, declared here (no NVML header, no CUDA at build
// time). These signatures and the two structs have been stable since NVML 5; the process list
// uses the unversioned (v1) entry point, whose struct has two fields in every driver.
class NvmlSource : public GpuSource {
 public:
  static std::unique_ptr<NvmlSource> open(std::string* why) {
    void* lib = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      if (why) *why = "NVML: libnvidia-ml.so.1 not found";
      return nullptr;
    }
    auto s = std::unique_ptr<NvmlSource>(new NvmlSource(lib));
    if (!s->resolve()) {
      if (why) *why = "NVML: libnvidia-ml.so.1 lacks an entry point launch needs";
      return nullptr;
    }
    int rc = s->init_();
    if (rc != 0) {
      if (why) *why = fmt::format("NVML: nvmlInit_v2 failed ({})", s->errorString(rc));
      return nullptr;
    }
    s->initialised_ = true;
    s->watchXids();
    return s;
  }

  ~NvmlSource() override {
    if (events_ != nullptr && freeEvents_) freeEvents_(events_);
    if (initialised_ && shutdown_) shutdown_();
    // The library stays loaded: NVML's own threads may outlive nvmlShutdown briefly.
  }

  std::vector<GpuSample> sample() override {
    lastError_.clear();
    unsigned count = 0;
    int rc = getCount_(&count);
    if (rc != 0) {
      lastError_ = fmt::format("nvmlDeviceGetCount_v2 failed ({})", errorString(rc));
      return {};
    }
    takeXids();
    std::vector<GpuSample> out;
    for (unsigned i = 0; i < count; ++i) {
      Device device = nullptr;
      if (getHandle_(i, &device) != 0) continue;
      GpuSample g;
      g.index = static_cast<int>(i);
      char uuid[96] = {};
      if (getUuid_(device, uuid, sizeof uuid - 1) == 0) g.uuid = uuid;
      Utilization u{};
      if (getUtilization_(device, &u) == 0) g.utilPercent = u.gpu;
      Memory m{};
      if (getMemory_(device, &m) == 0) {
        g.memUsedBytes = static_cast<double>(m.used);
        g.memTotalBytes = static_cast<double>(m.total);
      }
      unsigned temperature = 0;
      if (getTemperature_(device, /*NVML_TEMPERATURE_GPU=*/0, &temperature) == 0) {
        g.temperatureC = temperature;
      }
      unsigned milliwatts = 0;
      if (getPower_(device, &milliwatts) == 0) g.powerW = milliwatts / 1000.0;
      unsigned long long ecc = 0;
      // NVML_MEMORY_ERROR_TYPE_CORRECTED / _UNCORRECTED, NVML_VOLATILE_ECC: since the driver
      // loaded. NVML_ERROR_NOT_SUPPORTED without ECC: left out.
      if (getEcc_ && getEcc_(device, 0, 0, &ecc) == 0) g.eccCorrected = static_cast<double>(ecc);
      if (getEcc_ && getEcc_(device, 1, 0, &ecc) == 0) g.eccUncorrected = static_cast<double>(ecc);
      if (events_ != nullptr) {
        g.xidEvents = 0;
        for (const auto& x : xids_) {
          if (x.device != device) continue;
          g.xidEvents = static_cast<double>(x.count);
          g.lastXid = static_cast<double>(x.last);
        }
      }
      if (getProcesses_) {
        ProcessInfoV1 procs[64];
        unsigned n = 64;
        if (getProcesses_(device, &n, procs) == 0) {
          for (unsigned k = 0; k < n && k < 64; ++k) {
            GpuProcess p;
            p.pid = procs[k].pid;
            // NVML_VALUE_NOT_AVAILABLE (all ones) without privileges.
            p.usedBytes = procs[k].usedGpuMemory == ~0ULL
                              ? -1
                              : static_cast<int64_t>(procs[k].usedGpuMemory);
            g.processes.push_back(p);
          }
        }
      }
      out.push_back(std::move(g));
    }
    return out;
  }

  std::string describe() const override { return "NVML (libnvidia-ml.so.1)"; }

 private:
  using Device = void*;
  struct Utilization {
    unsigned gpu;
    unsigned memory;
  };
  struct Memory {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
  };
  struct ProcessInfoV1 {
    unsigned pid;
    unsigned long long usedGpuMemory;
  };

  // nvmlEventData_t as of NVML 11 (the two instance ids came after the first three fields).
  struct EventData {
    Device device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned gpuInstanceId;
    unsigned computeInstanceId;
  };
  struct XidCount {
    Device device;
    uint64_t count;
    unsigned long long last;
  };
  static constexpr unsigned long long kXidCriticalError = 0x8;  // nvmlEventTypeXidCriticalError

  explicit NvmlSource(void* lib) : lib_(lib) {}

  // Note [XID events]
  // ~~~~~~~~~~~~~~~~~
  // The driver reports an XID (a GPU's critical error: a GPU fallen off the bus, a double-bit
  // ECC error, a page retirement) as an NVML event. launch registers every GPU for them once,
  // then drains the event set without waiting at each sample; the records carry a count per GPU
  // since launch started and the last code. Without the entry points, or where no GPU accepts
  // the registration (no privileges in some containers), there is no count. nvidia-smi has no
  // query for XIDs: without NVML there is none either.
  void watchXids() {
    if (!createEvents_ || !registerEvents_ || !waitEvents_) return;
    if (createEvents_(&events_) != 0) {
      events_ = nullptr;
      return;
    }
    unsigned count = 0;
    bool any = false;
    if (getCount_(&count) == 0) {
      for (unsigned i = 0; i < count; ++i) {
        Device device = nullptr;
        if (getHandle_(i, &device) != 0) continue;
        if (registerEvents_(device, kXidCriticalError, events_) == 0) any = true;
      }
    }
    if (!any) {
      if (freeEvents_) freeEvents_(events_);
      events_ = nullptr;
    }
  }

  void takeXids() {
    if (events_ == nullptr) return;
    for (int n = 0; n < 1024; ++n) {  // bounded: a storm of events waits for the next sample
      EventData e{};
      if (waitEvents_(events_, &e, 0) != 0) return;  // NVML_ERROR_TIMEOUT: none left
      if ((e.eventType & kXidCriticalError) == 0) continue;
      auto it = std::find_if(xids_.begin(), xids_.end(),
                             [&](const XidCount& x) { return x.device == e.device; });
      if (it == xids_.end()) it = xids_.insert(xids_.end(), XidCount{e.device, 0, 0});
      ++it->count;
      it->last = e.eventData;
    }
  }

  template <typename Fn>
  bool load(Fn& fn, const char* name) {
    fn = reinterpret_cast<Fn>(::dlsym(lib_, name));
    return fn != nullptr;
  }

  bool resolve() {
    bool ok = load(init_, "nvmlInit_v2") && load(getCount_, "nvmlDeviceGetCount_v2") &&
              load(getHandle_, "nvmlDeviceGetHandleByIndex_v2") &&
              load(getUuid_, "nvmlDeviceGetUUID") &&
              load(getUtilization_, "nvmlDeviceGetUtilizationRates") &&
              load(getMemory_, "nvmlDeviceGetMemoryInfo") &&
              load(getTemperature_, "nvmlDeviceGetTemperature") &&
              load(getPower_, "nvmlDeviceGetPowerUsage");
    load(shutdown_, "nvmlShutdown");
    load(errorString_, "nvmlErrorString");
    load(getProcesses_, "nvmlDeviceGetComputeRunningProcesses");  // optional
    load(getEcc_, "nvmlDeviceGetTotalEccErrors");                 // optional, as below
    load(createEvents_, "nvmlEventSetCreate");
    load(registerEvents_, "nvmlDeviceRegisterEvents");
    if (!load(waitEvents_, "nvmlEventSetWait_v2")) load(waitEvents_, "nvmlEventSetWait");
    load(freeEvents_, "nvmlEventSetFree");
    return ok;
  }

  std::string errorString(int rc) const {
    if (errorString_ != nullptr) {
      if (const char* s = errorString_(rc)) return fmt::format("{}: {}", rc, s);
    }
    return std::to_string(rc);
  }

  void* lib_;
  bool initialised_ = false;
  int (*init_)() = nullptr;
  int (*shutdown_)() = nullptr;
  const char* (*errorString_)(int) = nullptr;
  int (*getCount_)(unsigned*) = nullptr;
  int (*getHandle_)(unsigned, Device*) = nullptr;
  int (*getUuid_)(Device, char*, unsigned) = nullptr;
  int (*getUtilization_)(Device, Utilization*) = nullptr;
  int (*getMemory_)(Device, Memory*) = nullptr;
  int (*getTemperature_)(Device, int, unsigned*) = nullptr;
  int (*getPower_)(Device, unsigned*) = nullptr;
  int (*getProcesses_)(Device, unsigned*, ProcessInfoV1*) = nullptr;
  int (*getEcc_)(Device, int, int, unsigned long long*) = nullptr;
  int (*createEvents_)(void**) = nullptr;
  int (*registerEvents_)(Device, unsigned long long, void*) = nullptr;
  int (*waitEvents_)(void*, EventData*, unsigned) = nullptr;
  int (*freeEvents_)(void*) = nullptr;
  void* events_ = nullptr;
  std::vector<XidCount> xids_;
};

}  // namespace

std::unique_ptr<GpuSource> nvidiaSmiSource(const GpuSourceOptions& options) {
  return std::make_unique<NvidiaSmiSource>(options);
}

std::unique_ptr<GpuSource> openGpuSource(const GpuSourceOptions& options, std::string* why) {
  std::string nvmlWhy;
  if (options.tryNvml) {
    if (auto nvml = NvmlSource::open(&nvmlWhy)) return nvml;
  }
  if (!commandExists(options.nvidiaSmi)) {
    if (why) {
      *why = fmt::format("{}{}{} not in PATH", nvmlWhy, nvmlWhy.empty() ? "" : "; ",
                         options.nvidiaSmi);
    }
    return nullptr;
  }
  auto smi = nvidiaSmiSource(options);
  if (smi->sample().empty()) {
    if (why) {
      *why = fmt::format("{}{}{} lists no GPU{}{}", nvmlWhy, nvmlWhy.empty() ? "" : "; ",
                         options.nvidiaSmi, smi->lastError().empty() ? "" : ": ", smi->lastError());
    }
    return nullptr;
  }
  return smi;
}

}  // namespace dtrain::launcher::monitor
