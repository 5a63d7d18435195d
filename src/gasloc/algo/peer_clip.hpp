// algo.clip_peers (docs/communication.md, "Poisoned peers"): what a worker takes from each peer
// is clipped in L2 norm to algo.clip_factor times a median of norms that one poisoned peer cannot
// raise, so that a peer sending garbage of any size moves the others by a bounded amount.
//
//   gossip      the receiver clips each received difference x_j - x_i to factor * the lower
//               median of its own window: the last kClipWindow norms it accepted (each recorded
//               after clipping, so a clipped message enters at most at the threshold) and this
//               round's received norms. Only the receiver's own observations set its bar.
//   all-reduce  the round becomes an all-gather: every worker receives every contributor's
//               message, clips each pseudo-gradient theta - x_j to factor * the lower median of
//               this round's contributors' norms, and sums them in id order. Every worker sees the
//               same messages and makes the same decisions, so they stay bit-identical.
//
// A non-finite message (NaN or Inf) has no norm to clip: with clip_peers it is dropped, a failed
// edge for that round (gossip: its weight stays on the receiver's own value; all-reduce: the mean
// is over the other messages, the same on every worker), and counted against its sender.
//
// The lower median (the smaller middle element of an even count) is what the threshold is taken
// from: with two values it is the smaller one, so a pair is clipped to the smaller of its two
// updates, and with one poisoned value among k >= 2 honest ones it is an honest value.
#pragma once
#include <torch/types.h>

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

namespace gasloc::algo {

// One poisoned worker (faults.poison): at round `round` it sends its parameters times `factor`
// (its own copy stays as it is).
struct Poison {
  int64_t worker = -1, round = -1;
  double factor = 1.0;
};
// The factor worker `id` scales its round-t message by (1 when none applies).
double poison_factor(const std::vector<Poison>& poisons, int id, int64_t round);

// The L2 norm of t's values in double, summed sequentially in index order: the same bits on every
// worker and thread count, which the all-reduce's shared decisions need.
double l2_norm(const torch::Tensor& t);
// The lower median: the element at (k - 1) / 2 of the sorted values. Throws on an empty list.
double lower_median(std::vector<double> values);
// d scaled to norm `threshold` when its norm `norm` exceeds it; d itself (the same tensor, bit
// for bit) otherwise. True in `clipped` when it scaled.
torch::Tensor clip_to(const torch::Tensor& d, double norm, double threshold, bool* clipped = nullptr);

inline constexpr int kClipWindow = 16;  // accepted norms a gossip receiver keeps

class PeerClip {
 public:
  PeerClip(double factor, int world);
  double factor() const { return factor_; }

  // Gossip: replaces each defined recv[k] (from peers[k], in x's dtype, finite) whose difference
  // to x exceeds the threshold by x + the clipped difference; records the accepted norms.
  void clip_received(const std::vector<int>& peers, const torch::Tensor& x, std::vector<torch::Tensor>& recv);
  // Gossip through a codec, whose receiver adds differences d[k] = x^_j - x_i (from peers[k]; an
  // undefined one is a failed edge): each beyond the threshold is scaled down to it in place, as
  // clip_received does to recv - x; true at k where it was.
  std::vector<bool> clip_differences(const std::vector<int>& peers, std::vector<torch::Tensor>& d);
  // All-reduce: the mean over the defined msgs[j] of anchor - clip(anchor - x_j), x_j = msgs[j]
  // (own included, ids ascending; an undefined one was dropped), summed in id order.
  torch::Tensor clipped_mean(const torch::Tensor& anchor, const std::vector<torch::Tensor>& msgs);
  // Whether t is finite; if not, it is counted as a message dropped from `sender`.
  bool accept_finite(const torch::Tensor& t, int sender);

  // Messages this worker clipped so far, by sender id (the world's size).
  const std::vector<int64_t>& clipped_from() const { return counts_; }
  // Non-finite messages this worker dropped so far, by sender id.
  const std::vector<int64_t>& dropped_from() const { return dropped_; }
  // Checkpoint state: the counts, the gossip window and the drops ("clip_counts", "clip_window",
  // "clip_dropped"; a checkpoint written before drops were counted starts them at 0).
  void save(std::map<std::string, torch::Tensor>& s) const;
  void load(const std::map<std::string, torch::Tensor>& s);

 private:
  double factor_;
  std::vector<int64_t> counts_, dropped_;
  std::deque<double> window_;
};

}  // namespace gasloc::algo
