#pragma once
// TensorBoard event files from metrics records: a sink beside JsonlSink and PrometheusEndpoint.
//
//   dtrain::metrics::Metrics metrics;
//   metrics.addSink(dtrain::metrics::TensorBoardSink::open("runs/resnet"));
//   metrics.record(step, {{"loss", 0.25}});      // scalar "loss/<node>/rank<R>" at that step
//
// Then, on any machine with the files: `pip install tensorboard; tensorboard --logdir runs`.
// Torch-free (dtrain_base): launch --tensorboard-dir writes its samples and every rank's records
// with the same code. The format and the one-writer rule: docs/monitoring.md "TensorBoard:
// --tensorboard-dir".

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "dtrain/base/metrics.h"

namespace dtrain::metrics {

// The scalar tag of `field` in `record`: the field, then the record's node, GPU, rank, interface
// and mount ("fs" before it) where it has them -- "loss/host1/rank3", "gpu_util/host1/gpu0",
// "gpu_process_mem_bytes/host1/gpu0/rank3", "net_rx_bytes_per_s/host1/eth0",
// "disk_free_ratio/host1/fs/scratch", "restarts" (a job-wide figure). TensorBoard groups the
// charts by the part before the first '/'.
std::string tensorBoardTag(const Record& record, const std::string& field);

// Writes records into a new event file in a directory, one TFRecord per record (an Event with one
// scalar per field), each with a single write(): a writer killed at any moment leaves complete
// records and at most one torn one at the end, which TensorBoard skips.
//
// One writer per directory: TensorBoard's loader follows only the newest event file of a
// directory, so a second live writer's records would be lost. The writer holds an flock on its
// file; open() refuses a directory in which another live process holds one. On a filesystem
// without flock (Lustre without -o flock, NFS without lockd) it cannot tell: it warns once and
// writes (docs/monitoring.md "TensorBoard: --tensorboard-dir").
class TensorBoardSink : public Sink {
 public:
  // Creates `dir` (and its parents) if missing and a new file in it,
  // events.out.tfevents.<unix seconds>.<host>.<pid>.<n>, opening with the file_version record.
  // `option` is how the user named the directory, for errors. Throws InvalidArgument naming the
  // directory and the reason (not writable, another live writer).
  static std::shared_ptr<TensorBoardSink> open(const std::string& dir,
                                               const std::string& option = "--tensorboard-dir");
  ~TensorBoardSink() override;
  TensorBoardSink(const TensorBoardSink&) = delete;
  TensorBoardSink& operator=(const TensorBoardSink&) = delete;

  // One Event at the record's step. A record without a step (launch's samples) is written at
  // the whole seconds from open() to its time. Throws Error when the write fails; a torn write
  // is cut off again, so the file stays a sequence of whole records.
  void write(const Record& record) override;

  const std::string& path() const { return path_; }

 private:
  TensorBoardSink(std::string path, int fd, double openedAt, uint64_t size);
  std::string path_;
  int fd_;
  double openedAt_;  // Unix seconds
  std::mutex mutex_;
  uint64_t size_;  // guarded by mutex_: bytes written, where a torn write is cut back to
};

}  // namespace dtrain::metrics
