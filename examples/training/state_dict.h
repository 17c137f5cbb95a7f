#pragma once
// readStateDict: the tensors of a PyTorch state_dict saved by `torch.save(model.state_dict(),
// path)` -- the zip archive PyTorch writes since 1.6 -- by name, in the file's order, without
// Python. libtorch's own torch::pickle_load cannot read one: it unpickles the OrderedDict a
// state_dict is as None (its unpickler keeps OrderedDict only for a tensor's backward hooks).
// So this reads the archive's data.pkl with an unpickler of its own for what a state_dict holds
// -- dicts (plain or ordered), tensors (_rebuild_tensor_v2, _rebuild_parameter), numbers,
// strings, tuples, lists -- and the storages from the archive's data/ records. Anything else (a
// pickled module, a custom class) is refused naming the class: save model.state_dict().
//
//   for (auto& [name, tensor] : examples::readStateDict("gpt2.pt")) ...

#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

namespace examples {

// Throws std::runtime_error naming the file and what it could not read.
std::vector<std::pair<std::string, at::Tensor>> readStateDict(const std::string& path);

}  // namespace examples
