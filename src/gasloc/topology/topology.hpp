// Gossip graphs and their mixing weights (docs/design.md section 4). Every worker builds the same
// Topology from (kind, n, seed) and derives round t's graph from (seed, t) alone, so the
// graph of any round is known to all workers, ahead of time, with no messages.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "gasloc/core/choice.hpp"

namespace gasloc::topology {

enum class Kind { complete, one_peer, two_peer, ring, exp };

// The names of the kinds, in the order of Kind (algo.topology, `gasloc topo -t`).
const config::Choices& kind_choices();
// A name of kind_choices() to its Kind; ConfigError listing them otherwise.
Kind parse_kind(const std::string& name);
std::string to_string(Kind kind);

// One row of W_t: (column j, W_t[i, j]) for the nonzero entries, j ascending.
using Row = std::vector<std::pair<int, double>>;

class Topology {
 public:
  // Throws ConfigError for combinations that have no such graph (see docs/topology.md);
  // 2peer with n = 2 falls back to 1peer with a warning.
  Topology(Kind kind, int n, uint64_t seed);

  Kind kind() const { return kind_; }  // effective kind, after any fallback
  Kind requested_kind() const { return requested_; }
  bool fell_back() const { return kind_ != requested_; }
  int size() const { return n_; }
  uint64_t seed() const { return seed_; }
  // complete: W = 11^T/n, which callers implement as an all-reduce mean, not n-1 exchanges.
  bool is_all_reduce() const { return kind_ == Kind::complete; }
  // 1peer and 2peer draw a fresh graph every round; the others repeat with period().
  bool is_random() const { return kind_ == Kind::one_peer || kind_ == Kind::two_peer; }
  // Rounds after which a deterministic graph repeats (1, or log2 n for exp); 0 if random.
  int64_t period() const;

  // pi_t: a uniform permutation of 0..n-1 that is a pure function of (seed, round).
  std::vector<int> permutation(int64_t round) const;
  // Neighbours of `rank` in round `round`, itself excluded, ascending.
  std::vector<int> peers(int rank, int64_t round) const;
  // W_t[rank, j] for the nonzero j, itself included, j ascending: callers sum in this order so
  // that the mixed result is bitwise identical on every worker and every backend.
  Row mixing_row(int rank, int64_t round) const;
  // All n rows of W_t at once (one permutation draw instead of n).
  std::vector<Row> mixing_rows(int64_t round) const;
  // Dense W_t, row-major n*n.
  std::vector<double> mixing_matrix(int64_t round) const;

 private:
  // Peers of `rank` given pos[r] = position of r in pi_t (empty for non-random kinds).
  std::vector<int> peers_at(int rank, int64_t round, const std::vector<int>& pi, const std::vector<int>& pos) const;
  Row row_from_peers(int rank, const std::vector<int>& peers) const;
  void check(int rank, int64_t round) const;

  Kind requested_;
  Kind kind_;
  int n_;
  uint64_t seed_;
};

}  // namespace gasloc::topology
