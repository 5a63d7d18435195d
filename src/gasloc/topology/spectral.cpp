#include "gasloc/topology/spectral.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ATen.h>
#include <torch/torch.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <numbers>
#include <string>
#include <vector>

#include "gasloc/core/error.hpp"

namespace gasloc::topology {

double spectral_gap(const Topology& topo, int64_t rounds) {
  const int n = topo.size();
  if (rounds < 1) throw ConfigError("spectral gap needs rounds >= 1, got " + std::to_string(rounds));
  if (n > 4096)
    throw ConfigError("spectral gap for n = " + std::to_string(n) + " is a dense " + std::to_string(n) + "^2 "
                      "eigenvalue problem", "use n <= 4096, or the closed form in docs/topology.md");
  const auto N = static_cast<size_t>(n);
  std::vector<double> m(N * N, 0.0);
  int64_t count = 0;
  if (topo.is_all_reduce()) {
    // W^T W = W = 11^T/n: skip the O(n^3) sum over dense rows.
    std::fill(m.begin(), m.end(), 1.0 / n);
    count = 1;
  } else {
    count = topo.is_random() ? rounds : topo.period();
    for (int64_t t = 0; t < count; ++t) {
      // (W^T W)_jk = sum_i W_ij W_ik: each sparse row adds its outer product, O(n deg^2).
      for (const auto& row : topo.mixing_rows(t))
        for (auto [j, wj] : row)
          for (auto [k, wk] : row) m[j * N + k] += wj * wk;
    }
  }
  // Subtracting 11^T/n sends the consensus direction's eigenvalue (1) to 0 and leaves the
  // others alone (E[W^T W] is symmetric with eigenvector 1), so the largest eigenvalue left is
  // lambda_2, with no need to identify which computed eigenvalue is "the" 1.
  for (auto& v : m) v = v / static_cast<double>(count) - 1.0 / n;
  const auto mat = torch::from_blob(m.data(), {n, n}, torch::kFloat64);
  const double lambda2 = at::linalg_eigvalsh(mat, "L").max().item<double>();
  return 1.0 - std::max(lambda2, 0.0);
}

double spectral_gap_closed_form(const Topology& topo) {
  const double n = topo.size();
  if (topo.size() <= 2) return 1.0;  // every valid graph on 1 or 2 workers averages exactly
  switch (topo.kind()) {
    case Kind::complete: return 1.0;
    case Kind::ring: {
      // Circulant W: eigenvalues (1 + 2cos(2 pi k/n))/3; for n >= 3, k = 1 has the largest square.
      const double l = (1.0 + 2.0 * std::cos(2.0 * std::numbers::pi / n)) / 3.0;
      return 1.0 - l * l;
    }
    case Kind::exp: return 1.0 / std::countr_zero(static_cast<unsigned>(topo.size()));
    case Kind::one_peer:
      // W^T W = W; E[W] = a I + b (11^T - I) with b = P(i, j paired)/2. Even n: a = 1/2,
      // b = 1/(2(n-1)); odd n: a = (n+1)/(2n), b = 1/(2n). lambda_2 = a - b.
      return topo.size() % 2 == 0 ? 0.5 + 0.5 / (n - 1) : 0.5;
    case Kind::two_peer:
      // W^2 = (3I + 2P + 2P^T + P^2 + P^-2)/9 with P a relabelled n-cycle; each power of P is
      // fixed-point free, so its expectation is (11^T - I)/(n-1): lambda_2 = 1/3 - 2/(3(n-1)).
      return 2.0 / 3.0 + 2.0 / (3.0 * (n - 1));
  }
  return 0.0;
}

int max_degree(const Topology& topo) {
  size_t deg = 0;
  // Degrees do not change from round to round (only who the neighbours are), so round 0 tells.
  for (const auto& row : topo.mixing_rows(0)) deg = std::max(deg, row.size() - 1);
  return static_cast<int>(deg);
}

double bytes_per_worker_per_round(const Topology& topo, int64_t message_bytes) {
  const double p = static_cast<double>(message_bytes);
  if (topo.is_all_reduce()) return 2.0 * (topo.size() - 1) / topo.size() * p;
  return max_degree(topo) * p;
}

}  // namespace gasloc::topology
