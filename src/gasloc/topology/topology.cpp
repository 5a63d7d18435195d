#include "gasloc/topology/topology.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <bit>

#include "gasloc/core/error.hpp"
#include "gasloc/core/rng.hpp"

namespace gasloc::topology {

namespace {

int log2_exact(int n) { return std::countr_zero(static_cast<unsigned>(n)); }

std::vector<int> inverse(const std::vector<int>& pi) {
  std::vector<int> pos(pi.size());
  for (size_t p = 0; p < pi.size(); ++p) pos[pi[p]] = static_cast<int>(p);
  return pos;
}

}  // namespace

const config::Choices& kind_choices() {
  static const config::Choices c("topology", {{"complete", "complete graph, W = 11^T/n, run as an all-reduce"},
                                              {"1peer", "random matching, a fresh permutation every round"},
                                              {"2peer", "random ring, a fresh permutation every round"},
                                              {"ring", "fixed ring i-1, i, i+1"},
                                              {"exp", "one-peer exponential graph, i XOR 2^(t mod log2 n)"}});
  return c;
}

Kind parse_kind(const std::string& name) { return static_cast<Kind>(kind_choices().index(name)); }

std::string to_string(Kind kind) { return kind_choices().options().at(static_cast<size_t>(kind)).name; }

Topology::Topology(Kind kind, int n, uint64_t seed) : requested_(kind), kind_(kind), n_(n), seed_(seed) {
  const std::string name = to_string(kind);
  const std::string single = "use the complete topology for a single worker, or run with more workers";
  if (n < 1)
    throw ConfigError("topology " + name + ": the number of workers must be >= 1, got " + std::to_string(n),
                      "n is the number of workers: 1 or more");
  switch (kind) {
    case Kind::complete: break;
    case Kind::one_peer:
      if (n == 1) throw ConfigError("topology 1peer needs n >= 2 workers (a lone worker has no peer)", single);
      break;
    case Kind::two_peer:
      if (n == 1) throw ConfigError("topology 2peer needs n >= 2 workers (a lone worker has no peer)", single);
      // Two workers cannot form a ring with distinct left and right neighbours; the only
      // graph left is the pair, which is 1peer's (deterministic) matching.
      if (n == 2) {
        spdlog::warn("topology 2peer needs n >= 3 workers; with n = 2 it falls back to 1peer (the pair, W = 1/2)");
        kind_ = Kind::one_peer;
      }
      break;
    case Kind::ring:
      if (n == 1) throw ConfigError("topology ring needs n >= 2 workers (a lone worker has no neighbour)", single);
      // n = 2: left and right neighbours coincide; the ring is the pair with W = 1/2 (not
      // 1/3 and 2/3), which keeps every row's weights equal and averages exactly.
      break;
    case Kind::exp:
      if (!std::has_single_bit(static_cast<unsigned>(n)))
        throw ConfigError("topology exp needs a power-of-two number of workers, got n = " + std::to_string(n),
                          "use 1peer (random matching) for any n, or pick n = 1, 2, 4, 8, ...");
      break;
  }
}

int64_t Topology::period() const {
  if (is_random()) return 0;
  if (kind_ == Kind::exp && n_ > 1) return log2_exact(n_);
  return 1;
}

void Topology::check(int rank, int64_t round) const {
  if (rank < 0 || rank >= n_)
    throw ConfigError("rank " + std::to_string(rank) + " is outside 0.." + std::to_string(n_ - 1),
                      "ranks of a topology of n workers are 0..n-1");
  if (round < 0) throw ConfigError("round " + std::to_string(round) + " is negative", "rounds count from 0");
}

std::vector<int> Topology::permutation(int64_t round) const {
  check(0, round);
  // One counter-based stream per round: round t's graph needs no state from round t-1, so a
  // resumed or late-joining worker computes the same pi_t as everyone else.
  const uint64_t stream = mix64(seed_ ^ mix64(static_cast<uint64_t>(round)));
  std::vector<int> pi(n_);
  for (int i = 0; i < n_; ++i) pi[i] = i;
  uint64_t k = 0;
  for (int i = n_ - 1; i > 0; --i) {
    const auto j = static_cast<int>(random_below(stream, k++, static_cast<uint64_t>(i) + 1));
    std::swap(pi[i], pi[j]);
  }
  return pi;
}

std::vector<int> Topology::peers_at(int rank, int64_t round, const std::vector<int>& pi,
                                    const std::vector<int>& pos) const {
  std::vector<int> out;
  switch (kind_) {
    case Kind::complete:
      for (int j = 0; j < n_; ++j)
        if (j != rank) out.push_back(j);
      break;
    case Kind::one_peer: {
      // Pairs are positions (2k, 2k+1); with odd n the last position, n-1, has no partner.
      const int partner = pos[rank] ^ 1;
      if (partner < n_) out.push_back(pi[partner]);
      break;
    }
    case Kind::two_peer: {
      const int p = pos[rank];
      out = {pi[(p + n_ - 1) % n_], pi[(p + 1) % n_]};
      break;
    }
    case Kind::ring:
      out = {(rank + n_ - 1) % n_, (rank + 1) % n_};
      break;
    case Kind::exp:
      if (n_ > 1) out.push_back(rank ^ (1 << (round % log2_exact(n_))));
      break;
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());  // ring n = 2: left == right
  return out;
}

Row Topology::row_from_peers(int rank, const std::vector<int>& peers) const {
  // Every graph here is regular within each connected piece (a lone 1peer worker is its own
  // piece), so W_ij = 1/(deg+1) gives the same weight from both ends: W is symmetric, and
  // with deg+1 equal entries per row it is doubly stochastic.
  const double w = 1.0 / static_cast<double>(peers.size() + 1);
  Row row;
  row.reserve(peers.size() + 1);
  bool self_done = false;
  for (int j : peers) {
    if (!self_done && rank < j) {
      row.emplace_back(rank, w);
      self_done = true;
    }
    row.emplace_back(j, w);
  }
  if (!self_done) row.emplace_back(rank, w);
  return row;
}

std::vector<int> Topology::peers(int rank, int64_t round) const {
  check(rank, round);
  const auto pi = is_random() ? permutation(round) : std::vector<int>{};
  return peers_at(rank, round, pi, inverse(pi));
}

Row Topology::mixing_row(int rank, int64_t round) const { return row_from_peers(rank, peers(rank, round)); }

std::vector<Row> Topology::mixing_rows(int64_t round) const {
  check(0, round);
  const auto pi = is_random() ? permutation(round) : std::vector<int>{};
  const auto pos = inverse(pi);
  std::vector<Row> rows(n_);
  for (int i = 0; i < n_; ++i) rows[i] = row_from_peers(i, peers_at(i, round, pi, pos));
  return rows;
}

std::vector<double> Topology::mixing_matrix(int64_t round) const {
  std::vector<double> w(static_cast<size_t>(n_) * n_, 0.0);
  const auto rows = mixing_rows(round);
  for (int i = 0; i < n_; ++i)
    for (auto [j, v] : rows[i]) w[static_cast<size_t>(i) * n_ + j] = v;
  return w;
}

}  // namespace gasloc::topology
