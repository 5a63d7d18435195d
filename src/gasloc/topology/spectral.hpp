// How fast a topology mixes and what it costs per round. The spectral gap 1 - lambda_2(E[W^T W])
// bounds the expected per-round contraction of the consensus distance:
// E||x_{t+1} - xbar||^2 <= (1 - gap) ||x_t - xbar||^2 (docs/design.md section 4).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

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

}  // namespace gasloc::topology
