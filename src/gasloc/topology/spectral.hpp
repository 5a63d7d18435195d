// How fast a topology mixes and what it costs per round. The spectral gap 1 - lambda_2(E[W^T W])
// bounds the expected per-round contraction of the consensus distance:
// E||x_{t+1} - xbar||^2 <= (1 - gap) ||x_t - xbar||^2 (DESIGN.md section 4).
#pragma once
#include <cstdint>

#include "gasloc/topology/topology.hpp"

namespace gasloc::topology {

// 1 - lambda_2(E[W^T W]). Random graphs (1peer, 2peer) average W_t^T W_t over rounds
// 0..rounds-1 (an estimate, biased slightly low: sampling noise pushes lambda_2 up); fixed
// graphs average over one period (exact; `rounds` is ignored). n = 1 gives 1. Throws
// ConfigError for rounds < 1 or n > 4096 (a dense n*n eigenvalue problem).
double spectral_gap(const Topology& topo, int64_t rounds);

// The same quantity in closed form (derivations in docs/topology.md).
double spectral_gap_closed_form(const Topology& topo);

// Most neighbours any worker has in a round (complete: n - 1).
int max_degree(const Topology& topo);

// Bytes one worker sends per round for a message of `message_bytes`: complete runs a ring
// all-reduce, 2(n-1)/n * P; gossip sends the whole message to each neighbour, degree * P
// (the busiest worker's count).
double bytes_per_worker_per_round(const Topology& topo, int64_t message_bytes);

// GASLoC's outer step (DESIGN.md section 3) applied to the mixed vectors: Delta_i = x_i - m_i,
// b_i <- momentum*b_i + Delta_i, x_i <- x_i - lr*(Delta_i + momentum*b_i). {1, 0} is plain gossip
// averaging, x_i <- m_i.
struct OuterStep {
  double lr = 1.0;
  double momentum = 0.0;
};

// Gossip with no training: n workers start from independent standard normal vectors of `dim`
// entries (from `seed`); each round every worker mixes, m_i = sum_j W_t[i,j] x_j, and takes the
// outer step. Returns the consensus distance mean_i ||x_i - xbar||^2 after rounds 0..rounds,
// divided by its initial value. With plain averaging on 1peer and 2peer, E[W^T W] restricted to
// the vectors orthogonal to 1 is a multiple of the identity (permutation symmetry), so in
// expectation this decays exactly as (1 - gap)^t. With outer momentum it does not: on a mode
// that W scales by lambda, the disagreement follows the two-term recursion of docs/topology.md.
std::vector<double> simulate_consensus(const Topology& topo, int64_t rounds, int64_t dim, uint64_t seed,
                                       OuterStep outer = {});

}  // namespace gasloc::topology
