// What the compressed exchanges share; see pair_exchange.hpp.
#include "gasloc/algo/mix/pair_exchange.hpp"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <utility>

#include "gasloc/core/error.hpp"

namespace gasloc::algo {

std::vector<std::vector<int>> round_robin(int n) {
  std::vector<std::vector<int>> out;
  if (n < 2) return out;
  const int N = n + n % 2;  // an odd n gets a ghost position, N - 1, whose partner sits out
  for (int r = 0; r < N - 1; ++r) {
    std::vector<int> partner(N, -1);
    auto pair = [&](int a, int b) { partner[a] = b, partner[b] = a; };
    pair(N - 1, r);
    for (int k = 1; k < N / 2; ++k) pair((r + k) % (N - 1), (r - k + N - 1) % (N - 1));
    partner.resize(n);
    for (int& p : partner)
      if (p >= n) p = -1;
    out.push_back(std::move(partner));
  }
  return out;
}

std::vector<std::vector<int>> pair_colours(const std::vector<std::vector<int>>& neighbours) {
  const int n = static_cast<int>(neighbours.size());
  std::vector<std::vector<int>> colours;
  for (int i = 0; i < n; ++i) {
    std::vector<int> js = neighbours[i];
    std::sort(js.begin(), js.end());
    for (int j : js) {
      if (j <= i) continue;
      size_t c = 0;
      while (c < colours.size() && (colours[c][i] >= 0 || colours[c][j] >= 0)) ++c;
      if (c == colours.size()) colours.emplace_back(n, -1);
      colours[c][i] = j;
      colours[c][j] = i;
    }
  }
  return colours;
}

std::vector<std::vector<int>> pair_colours(const std::vector<RoundGraph>& graphs) {
  std::vector<std::vector<int>> neighbours;
  for (const auto& gv : graphs) neighbours.push_back(gv.peers);
  return pair_colours(neighbours);
}

torch::Tensor cpu_fp32(const torch::Tensor& x) {
  return x.detach().to(torch::kCPU, torch::kFloat, /*non_blocking=*/false, /*copy=*/true).contiguous().reshape({-1});
}

torch::Tensor byte_tensor(const std::vector<uint8_t>& v) {
  auto t = torch::empty({static_cast<int64_t>(v.size())}, torch::kByte);
  std::copy(v.begin(), v.end(), t.data_ptr<uint8_t>());
  return t;
}

void non_finite(const comm::NonFiniteChunk& e, int rank, const char* what) {
  throw CommError(fmt::format("worker {}: its {} holds {}; nothing was sent", rank, what, e.what()),
                  "that worker diverged: lower optim.lr or resume from its last checkpoint");
}

void bad_payload(const comm::BadPayload& e, int me, int peer) {
  throw CommError(fmt::format("worker {}: the compressed payload from worker {} is malformed: {}", me, peer, e.what()),
                  "every worker must run the same gasloc and the same algo.compression settings");
}

void failed_edge(bool elastic, int me, int peer) {
  if (!elastic)
    throw CommError(fmt::format("worker {}: worker {} sent nothing in a compressed round", me, peer),
                    "compressed rounds need a fixed membership");
}

torch::Tensor GossipPayloads::encode(const torch::Tensor& u, int me) {
  try {
    if (!feedback_on_) return byte_tensor(comm::encode(codec_, floats(u)));
    if (!feedback_.defined() || feedback_.numel() != u.numel()) feedback_ = torch::zeros_like(u);
    return byte_tensor(comm::encode_with_feedback(codec_, floats(u), floats(feedback_), decay_));
  } catch (const comm::NonFiniteChunk& e) {
    non_finite(e, me, "parameters");
  }
}

torch::Tensor GossipPayloads::decode(const torch::Tensor& payload, int64_t n, int me, int from) const {
  auto out = torch::empty({n}, torch::kFloat);
  try {
    comm::decode(codec_, bytes(payload.contiguous()), floats(out));
  } catch (const comm::BadPayload& e) {
    bad_payload(e, me, from);
  }
  return out;
}

void GossipPayloads::save(StateDict& s) const {
  if (feedback_.defined()) s["compression_feedback"] = feedback_;
}

void GossipPayloads::load(const StateDict& s) { feedback_ = loaded_fp32(s, "compression_feedback"); }

torch::Tensor loaded_fp32(const StateDict& s, const char* key) {
  const auto it = s.find(key);
  return it == s.end() ? torch::Tensor() : it->second.detach().to(torch::kFloat).clone();
}

}  // namespace gasloc::algo
