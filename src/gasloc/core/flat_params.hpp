// One contiguous buffer for all of a model's parameters (and one for their gradients). Each
// module parameter becomes a view into it, so optimizers run one fused update over the whole
// model and later layers send the model in one message.
//
// Layout: parameters with weight decay (matrices: dim >= 2) first, then the rest (norm gains),
// so decoupled weight decay applies to the prefix [0, decay_numel).
#pragma once
#include <torch/types.h>

#include <string>
#include <utility>
#include <vector>

namespace gasloc {

struct ParamSegment {
  std::string name;             // e.g. model.layers.0.self_attn.q_proj.weight
  int64_t offset = 0;           // first element in the flat buffer
  std::vector<int64_t> shape;   // shape of the parameter
  bool decay = false;           // receives weight decay
  int64_t numel() const;
};

class FlatParams {
 public:
  FlatParams() = default;
  // Moves the given parameters into one flat fp32 buffer (their current values are kept) and
  // rebinds each of them, and its .grad, to views of the flat buffers. Parameters that appear
  // twice under different names (tied weights) are stored once, under the first name.
  explicit FlatParams(const std::vector<std::pair<std::string, torch::Tensor>>& named);

  torch::Tensor& data() { return data_; }  // [N] parameters
  torch::Tensor& grad() { return grad_; }  // [N] gradients, accumulated in place by autograd
  const torch::Tensor& data() const { return data_; }
  const torch::Tensor& grad() const { return grad_; }
  int64_t numel() const { return data_.numel(); }
  int64_t decay_numel() const { return decay_numel_; }
  const std::vector<ParamSegment>& segments() const { return segments_; }
  // View of one parameter inside `flat` (data, grad, or any buffer of the same layout).
  torch::Tensor view(const torch::Tensor& flat, const ParamSegment& seg) const;
  // Sets every gradient to zero (keeps the views bound).
  void zero_grad();

 private:
  torch::Tensor data_, grad_;
  int64_t decay_numel_ = 0;
  std::vector<ParamSegment> segments_;
};

}  // namespace gasloc
