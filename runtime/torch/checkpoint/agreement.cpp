// Note [Checkpoint agreement] for a process group without a store: the same answers through the
// group's collectives, each given the agreement's deadline as its own timeout (CallOptions), so
// that a slow writer is waited for as long as the checkpoint allows, not the collectives' default.
#include <ATen/ATen.h>

#include "../torch_compat.h"
#include "dtrain/torch/process_group.h"
#include "placement.h"

namespace dtrain::checkpoint {

namespace {

class CollectiveAgreement : public checkpoint::Agreement {
 public:
  explicit CollectiveAgreement(std::shared_ptr<ProcessGroup> group) : group_(std::move(group)) {}

  std::vector<checkpoint::Report> exchange(int64_t code, checkpoint::Millis deadline,
                                           const std::string&) override {
    const int world = group_->size();
    std::vector<checkpoint::Report> reports;
    if (world == 1) {
      if (code) reports.push_back({0, code});
      return reports;
    }
    at::Tensor in = at::full({1}, code, at::kLong).to(group_->device());
    at::Tensor out = at::empty({world}, in.options());
    group_->communicator().allgather(in.data_ptr(), out.data_ptr(), 1, comm::DataType::Int64,
                                     options(in, deadline));
    at::Tensor host = out.cpu();
    const int64_t* p = host.data_ptr<int64_t>();
    for (int r = 0; r < world; ++r) {
      if (p[r]) reports.push_back({r, p[r]});
    }
    return reports;
  }

  int64_t share(int root, int64_t value, checkpoint::Millis deadline, const std::string&) override {
    if (group_->size() == 1) return value;
    at::Tensor t = at::full({1}, value, at::kLong).to(group_->device());
    group_->communicator().broadcast(t.data_ptr(), 1, comm::DataType::Int64, root,
                                     options(t, deadline));
    return t.cpu().item<int64_t>();
  }

 private:
  static comm::CallOptions options(const at::Tensor& t, checkpoint::Millis deadline) {
    comm::CallOptions o;
    o.timeout = deadline;
    o.stream = compat::currentStream(t.device());
    o.shape = {t.numel()};
    return o;
  }

  std::shared_ptr<ProcessGroup> group_;
};

}  // namespace

std::unique_ptr<checkpoint::Agreement> collectiveAgreement(std::shared_ptr<ProcessGroup> group) {
  return std::make_unique<CollectiveAgreement>(std::move(group));
}

}  // namespace dtrain::checkpoint
