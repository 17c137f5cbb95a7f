#pragma once
// GPU samples without linking CUDA: NVML loaded with dlopen when the driver's libnvidia-ml.so.1
// is there (in-process, about a millisecond a sample), else `nvidia-smi --query-gpu` in CSV once
// per interval, each call under a deadline (a wedged driver makes nvidia-smi hang). Either gives
// per GPU utilisation, memory used and total, temperature and power, and which processes use it.
//
// GPU numbers are the driver's (nvidia-smi's) indices, in PCI bus order; CUDA numbers devices
// the same way only with CUDA_DEVICE_ORDER=PCI_BUS_ID.

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dtrain::launcher::monitor {

struct GpuProcess {
  int64_t pid = 0;
  int64_t usedBytes = -1;  // -1: not reported (nvidia-smi's [N/A] without privileges)
};

struct GpuSample {
  int index = 0;
  std::string uuid;
  std::optional<double> utilPercent;
  std::optional<double> memUsedBytes;
  std::optional<double> memTotalBytes;
  std::optional<double> temperatureC;
  std::optional<double> powerW;
  // ECC errors since the driver loaded (volatile counts); absent without ECC.
  std::optional<double> eccCorrected;
  std::optional<double> eccUncorrected;
  // XID events (critical errors the driver reports) since launch opened NVML, and the last XID
  // code; NVML only: nvidia-smi has no query for them.
  std::optional<double> xidEvents;
  std::optional<double> lastXid;
  std::vector<GpuProcess> processes;
};

// The query launch runs (nvidia-smi --query-gpu=<kGpuQueryFields> --format=csv,noheader,nounits):
// memory in MiB, power in W, ECC errors as counts since the driver loaded.
constexpr const char* kGpuQueryFields =
    "index,uuid,utilization.gpu,memory.used,memory.total,temperature.gpu,power.draw,"
    "ecc.errors.corrected.volatile.total,ecc.errors.uncorrected.volatile.total";
constexpr const char* kComputeAppsFields = "pid,gpu_uuid,used_memory";

// Pure parsers of those two CSV outputs. "[N/A]" / "[Not Supported]" become absent values; a
// malformed line is skipped and named in `problems` (when given), never a crash. A query line of
// the first 7 fields only (before launch asked for ECC errors) is read too.
std::vector<GpuSample> parseGpuQueryCsv(std::string_view csv,
                                        std::vector<std::string>* problems = nullptr);
struct GpuApp {
  std::string gpuUuid;
  GpuProcess process;
};
std::vector<GpuApp> parseComputeAppsCsv(std::string_view csv,
                                        std::vector<std::string>* problems = nullptr);
// Attaches each app to the GPU with its uuid.
void attachApps(std::vector<GpuSample>& gpus, const std::vector<GpuApp>& apps);

class GpuSource {
 public:
  virtual ~GpuSource() = default;
  // The GPUs now; empty (and `lastError()` set) when this sample failed.
  virtual std::vector<GpuSample> sample() = 0;
  virtual std::string describe() const = 0;  // "NVML (libnvidia-ml.so.1)", "nvidia-smi"
  const std::string& lastError() const { return lastError_; }

 protected:
  std::string lastError_;
};

struct GpuSourceOptions {
  std::string nvidiaSmi = "nvidia-smi";     // program name or path
  std::chrono::milliseconds timeout{5000};  // per nvidia-smi call
  bool tryNvml = true;
};

// NVML when it loads and initialises, else nvidia-smi when it is in PATH and lists a GPU, else
// null (no GPU sampling; `why` says what was tried).
std::unique_ptr<GpuSource> openGpuSource(const GpuSourceOptions& options, std::string* why);

// The nvidia-smi source on its own (tests point it at a stand-in script).
std::unique_ptr<GpuSource> nvidiaSmiSource(const GpuSourceOptions& options);

}  // namespace dtrain::launcher::monitor
