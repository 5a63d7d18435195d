// Clipping what peers send; see peer_clip.hpp.
#include "gasloc/algo/peer_clip.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include "gasloc/core/error.hpp"

namespace gasloc::algo {

double poison_factor(const std::vector<Poison>& poisons, int id, int64_t round) {
  double f = 1.0;
  for (const Poison& p : poisons)
    if (p.worker == id && p.round == round) f *= p.factor;
  return f;
}

double l2_norm(const torch::Tensor& t) {
  const auto c = t.detach().to(torch::kCPU, torch::kDouble).contiguous();
  const double* v = c.data_ptr<double>();
  double s = 0.0;
  for (int64_t i = 0; i < c.numel(); ++i) s += v[i] * v[i];
  return std::sqrt(s);
}

double lower_median(std::vector<double> values) {
  if (values.empty()) throw Error("lower_median: no values");
  const auto mid = values.begin() + static_cast<std::ptrdiff_t>((values.size() - 1) / 2);
  std::nth_element(values.begin(), mid, values.end());
  return *mid;
}

torch::Tensor clip_to(const torch::Tensor& d, double norm, double threshold, bool* clipped) {
  const bool over = norm > threshold;
  if (clipped) *clipped = over;
  if (!over) return d;
  return d * (threshold / norm);
}

PeerClip::PeerClip(double factor, int world)
    : factor_(factor), counts_(static_cast<size_t>(world), 0), dropped_(static_cast<size_t>(world), 0) {
  if (!(factor > 1.0)) throw ConfigError("config key 'algo.clip_factor': must be > 1", "the threshold is a multiple of a median norm");
}

void PeerClip::clip_received(const std::vector<int>& peers, const torch::Tensor& x, std::vector<torch::Tensor>& recv) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> diffs(recv.size());
  for (size_t k = 0; k < recv.size(); ++k)
    if (recv[k].defined()) diffs[k] = recv[k] - x;  // undefined: a failed edge
  const std::vector<bool> clipped = clip_differences(peers, diffs);
  for (size_t k = 0; k < recv.size(); ++k)
    if (clipped[k]) recv[k] = x + diffs[k];
}

std::vector<bool> PeerClip::clip_differences(const std::vector<int>& peers, std::vector<torch::Tensor>& d) {
  torch::NoGradGuard no_grad;
  std::vector<bool> clipped(d.size(), false);
  std::vector<double> norms(d.size(), 0.0);
  std::vector<double> pool(window_.begin(), window_.end());
  for (size_t k = 0; k < d.size(); ++k) {
    if (!d[k].defined()) continue;  // a failed edge
    norms[k] = l2_norm(d[k]);
    pool.push_back(norms[k]);
  }
  if (pool.empty()) return clipped;
  const double threshold = factor_ * lower_median(pool);
  for (size_t k = 0; k < d.size(); ++k) {
    if (!d[k].defined()) continue;
    bool over = false;
    auto c = clip_to(d[k], norms[k], threshold, &over);
    if (over) {
      d[k] = std::move(c);
      clipped[k] = true;
      ++counts_.at(static_cast<size_t>(peers[k]));
    }
    window_.push_back(std::min(norms[k], threshold));
    if (window_.size() > static_cast<size_t>(kClipWindow)) window_.pop_front();
  }
  return clipped;
}

bool PeerClip::accept_finite(const torch::Tensor& t, int sender) {
  if (torch::isfinite(t).all().item<bool>()) return true;
  ++dropped_.at(static_cast<size_t>(sender));
  return false;
}

torch::Tensor PeerClip::clipped_mean(const torch::Tensor& anchor, const std::vector<torch::Tensor>& msgs) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> g(msgs.size());
  std::vector<double> norms(msgs.size()), kept;
  for (size_t j = 0; j < msgs.size(); ++j) {
    if (!msgs[j].defined()) continue;  // dropped: non-finite
    g[j] = anchor - msgs[j];  // the pseudo-gradient
    norms[j] = l2_norm(g[j]);
    kept.push_back(norms[j]);
  }
  const double threshold = factor_ * lower_median(kept);
  torch::Tensor sum;
  for (size_t j = 0; j < msgs.size(); ++j) {
    if (!g[j].defined()) continue;
    bool clipped = false;
    const auto c = clip_to(g[j], norms[j], threshold, &clipped);
    if (clipped) ++counts_.at(j);
    if (!sum.defined()) sum = c.clone();
    else sum.add_(c);
  }
  return anchor - sum / static_cast<double>(kept.size());
}

void PeerClip::save(std::map<std::string, torch::Tensor>& s) const {
  s["clip_counts"] = torch::tensor(counts_, torch::kInt64);
  s["clip_window"] = torch::tensor(std::vector<double>(window_.begin(), window_.end()), torch::kFloat64);
  s["clip_dropped"] = torch::tensor(dropped_, torch::kInt64);
}

void PeerClip::load(const std::map<std::string, torch::Tensor>& s) {
  const auto c = s.find("clip_counts"), w = s.find("clip_window");
  if (c == s.end() || w == s.end())
    throw CheckpointError("checkpoint lacks algo.clip_peers' state (clip_counts, clip_window)",
                          "it was written with algo.clip_peers = false; resume with the same algo settings");
  const auto counts = c->second.to(torch::kInt64).contiguous();
  if (counts.numel() != static_cast<int64_t>(counts_.size()))
    throw CheckpointError("checkpoint's clip_counts are for another world size", "resume with the same cluster.workers");
  std::copy(counts.data_ptr<int64_t>(), counts.data_ptr<int64_t>() + counts.numel(), counts_.begin());
  const auto win = w->second.to(torch::kFloat64).contiguous();
  window_.assign(win.data_ptr<double>(), win.data_ptr<double>() + win.numel());
  std::fill(dropped_.begin(), dropped_.end(), 0);
  if (const auto d = s.find("clip_dropped"); d != s.end() && d->second.numel() == static_cast<int64_t>(dropped_.size())) {
    const auto drops = d->second.to(torch::kInt64).contiguous();
    std::copy(drops.data_ptr<int64_t>(), drops.data_ptr<int64_t>() + drops.numel(), dropped_.begin());
  }
}

}  // namespace gasloc::algo
