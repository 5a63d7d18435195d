// The consensus the GASLoC forms reach when no training moves the parameters: `gasloc topo
// --consensus` and docs/topology.md measure each form's rate here. A round is the form's own
// code (round_forms.hpp), the one GossipSync runs, applied to every worker's vector at once
// (Algo.GossipSyncWithFrozenParametersIsTheConsensusSimulation runs the two side by side):
//   anchor:      Delta_i = x_i - m_i, b_i <- momentum*b_i + Delta_i, x_i <- x_i - lr*(Delta_i + momentum*b_i)
//   mix_after:   the outer step on the pseudo-gradient x_i - phi_i = 0, then mixing: plain gossip
//   accelerated: u_i = x_i; x_i <- u_i - gossip_step*(u_i - m_i(u)) + momentum*(u_i - u_i^prev)
// with m_i = sum_j W_t[i,j] x_j. {1, 0} in the anchor form is plain gossip averaging, x_i <- m_i
// exactly: Local-DAdam's round (make_mix_only_form), not x_i - (x_i - m_i).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "gasloc/algo/round_forms.hpp"
#include "gasloc/core/choice.hpp"
#include "gasloc/topology/topology.hpp"

namespace gasloc::algo {

// Gossip with no training: n workers start from independent standard normal vectors of `dim`
// entries (from `seed`); each round every worker mixes and takes the form's step. Returns the
// consensus distance mean_i ||x_i - xbar||^2 after rounds 0..rounds, divided by its initial
// value. With plain averaging on 1peer and 2peer, E[W^T W] restricted to the vectors orthogonal
// to 1 is a multiple of the identity (permutation symmetry), so in expectation this decays
// exactly as (1 - gap)^t. With outer momentum it does not: on a mode that W scales by lambda,
// the disagreement follows the two-term recursion of docs/topology.md.
// The start simulate_consensus draws from `seed`: n standard normal vectors of `dim` entries,
// row-major, their mean removed (so that a test can start training code from the same point).
std::vector<double> consensus_start(int n, int64_t dim, uint64_t seed);
// mean_i ||x_i - xbar||^2 of n row-major vectors of `dim` entries.
double consensus_distance(const std::vector<double>& x, int n, int64_t dim);

std::vector<double> simulate_consensus(const topology::Topology& topo, int64_t rounds, int64_t dim, uint64_t seed,
                                       OuterStep outer = {});

// The same run summarized over `rounds` rounds: the geometric mean of the per-round ratios
// d_{t+1}/d_t (the long-run contraction per round), and their mean (what 1 - gap predicts for
// plain gossip on 1peer and 2peer: E[d_{t+1} | x_t] = (1 - gap) d_t; the geometric mean is lower,
// by Jensen's inequality, since the ratios vary from round to round, and under momentum the mean
// is dominated by the rounds where an oscillating disagreement passes near 0). The state is
// rescaled every round (the dynamics are linear), so thousands of rounds neither underflow nor
// overflow; > 1 means the form diverges. A round that reaches exact consensus counts as ratio 0
// in the mean and is left out of the geometric mean, and the run restarts from fresh vectors
// (`restarts`; the complete graph restarts every round, and its rates are 0).
struct ConsensusRate {
  double mean = 0.0;
  double geometric = 0.0;
  int64_t restarts = 0;
};
ConsensusRate consensus_contraction(const topology::Topology& topo, int64_t rounds, int64_t dim, uint64_t seed, OuterStep outer = {});

// The best (lowest geometric-mean) contraction over a grid: anchor and mix_after scan (lr, momentum),
// accelerated (gossip_step, momentum); lr and gossip_step over 0.1, 0.2, ..., 1.0 and momentum
// over 0, 0.05, ..., 0.95. All points share the graphs and the start. `best` holds the winning
// step (the first one found on ties, in grid order).
struct Optimum {
  OuterStep best;
  ConsensusRate rate;
  int points = 0;
};
Optimum optimize_consensus(const topology::Topology& topo, Form form, int64_t rounds, int64_t dim, uint64_t seed);

}  // namespace gasloc::algo
