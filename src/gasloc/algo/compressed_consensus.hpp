// Compressed gossip with no training (`gasloc topo --consensus --compression ...`): the consensus
// a codec lets GASLoC's workers reach, through the code a training run executes. Unlike
// consensus.hpp's simulation (float64, the mean projected out, rescaled every round), the workers
// here are the real synchronizers (algo.compression, algo.gossip_codec) on an in-process cluster
// of n threads, exchanging fp32 payloads, with the parameters frozen between rounds (H = 1, no
// inner step). The start is x_i = c + e_i: e_i the disagreement (consensus_start: independent
// standard normal vectors, their mean removed) and c a vector every worker shares, of standard
// deviation `common_scale`. The shared part is what makes the codecs differ: direct quantizes
// x_j, whose grid is set by |c|, so its error stays while the disagreement shrinks; delta
// quantizes x_j - r, with r the shared reference refreshed every K rounds; modulo's grid follows
// the pair's last gap, so its error shrinks with the disagreement.
#pragma once
#include <cstdint>
#include <vector>

#include "gasloc/algo/algo_config.hpp"

namespace gasloc::algo {

struct CompressedConsensus {
  std::vector<double> distance;  // mean_i ||x_i - xbar||^2 / its initial value, after rounds 0..rounds
  std::vector<double> bits;      // bits sent per parameter by the mean worker in round t (bits[0] = 0)
  int64_t resends = 0;           // modulo: chunks resent in fp32 after a wrap, summed over workers
};

// cfg: a gossip algorithm's [algo] keys (name, topology, form and its step, compression and its
// codec settings; H is taken as 1). ConfigError if they are invalid, if the topology is not a
// gossip graph, or if n is outside [2, 250] (a thread per worker).
CompressedConsensus simulate_compressed_consensus(AlgoConfig cfg, int n, int64_t rounds, int64_t dim, uint64_t seed,
                                                  double common_scale);

}  // namespace gasloc::algo
