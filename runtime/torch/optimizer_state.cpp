#include "optimizer_state.h"

#include <torch/optim.h>

namespace dtrain::optim_state {

const char* optimizerType(const torch::optim::Optimizer& o) {
  if (dynamic_cast<const torch::optim::SGD*>(&o)) return "SGD";
  if (dynamic_cast<const torch::optim::Adam*>(&o)) return "Adam";
  if (dynamic_cast<const torch::optim::AdamW*>(&o)) return "AdamW";
  if (dynamic_cast<const torch::optim::Adagrad*>(&o)) return "Adagrad";
  if (dynamic_cast<const torch::optim::RMSprop*>(&o)) return "RMSprop";
  return nullptr;
}

StateFields fieldsOf(torch::optim::OptimizerParamState& s) {
  using namespace torch::optim;
  if (auto* p = dynamic_cast<SGDParamState*>(&s))
    return {{{"momentum_buffer", &p->momentum_buffer()}}, nullptr};
  if (auto* p = dynamic_cast<AdamParamState*>(&s)) {
    return {{{"exp_avg", &p->exp_avg()},
             {"exp_avg_sq", &p->exp_avg_sq()},
             {"max_exp_avg_sq", &p->max_exp_avg_sq()}},
            &p->step()};
  }
  if (auto* p = dynamic_cast<AdamWParamState*>(&s)) {
    return {{{"exp_avg", &p->exp_avg()},
             {"exp_avg_sq", &p->exp_avg_sq()},
             {"max_exp_avg_sq", &p->max_exp_avg_sq()}},
            &p->step()};
  }
  if (auto* p = dynamic_cast<AdagradParamState*>(&s)) return {{{"sum", &p->sum()}}, &p->step()};
  if (auto* p = dynamic_cast<RMSpropParamState*>(&s)) {
    return {{{"square_avg", &p->square_avg()},
             {"momentum_buffer", &p->momentum_buffer()},
             {"grad_avg", &p->grad_avg()}},
            &p->step()};
  }
  return {};
}

std::unique_ptr<torch::optim::OptimizerParamState> newParamState(const std::string& type) {
  using namespace torch::optim;
  if (type == "SGD") return std::make_unique<SGDParamState>();
  if (type == "Adam") return std::make_unique<AdamParamState>();
  if (type == "AdamW") return std::make_unique<AdamWParamState>();
  if (type == "Adagrad") return std::make_unique<AdagradParamState>();
  if (type == "RMSprop") return std::make_unique<RMSpropParamState>();
  return nullptr;
}

}  // namespace dtrain::optim_state
