#include "gasloc/core/flat_params.hpp"

#include <torch/torch.h>

#include <unordered_set>

namespace gasloc {

int64_t ParamSegment::numel() const {
  int64_t n = 1;
  for (auto s : shape) n *= s;
  return n;
}

FlatParams::FlatParams(const std::vector<std::pair<std::string, torch::Tensor>>& named) {
  torch::NoGradGuard no_grad;
  std::vector<std::pair<std::string, torch::Tensor>> unique;
  std::unordered_set<const void*> seen;
  for (const auto& [name, p] : named) {
    if (seen.insert(p.unsafeGetTensorImpl()).second) unique.emplace_back(name, p);
  }
  // Decayed (matrices) first, preserving order within each group.
  std::stable_partition(unique.begin(), unique.end(), [](const auto& np) { return np.second.dim() >= 2; });

  int64_t total = 0;
  for (const auto& [name, p] : unique) {
    ParamSegment seg;
    seg.name = name;
    seg.offset = total;
    seg.shape = p.sizes().vec();
    seg.decay = p.dim() >= 2;
    if (seg.decay) decay_numel_ = total + p.numel();
    total += p.numel();
    segments_.push_back(std::move(seg));
  }
  auto opts = unique.empty() ? torch::TensorOptions().dtype(torch::kFloat32)
                             : unique.front().second.options().dtype(torch::kFloat32);
  data_ = torch::empty({total}, opts);
  grad_ = torch::zeros({total}, opts);
  for (size_t i = 0; i < unique.size(); ++i) {
    auto& p = unique[i].second;
    auto d = view(data_, segments_[i]);
    d.copy_(p.detach());
    p.set_data(d);
    p.mutable_grad() = view(grad_, segments_[i]);
  }
}

torch::Tensor FlatParams::view(const torch::Tensor& flat, const ParamSegment& seg) const {
  return flat.narrow(0, seg.offset, seg.numel()).view(seg.shape);
}

void FlatParams::zero_grad() { grad_.zero_(); }

}  // namespace gasloc
