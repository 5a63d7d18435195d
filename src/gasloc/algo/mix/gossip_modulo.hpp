// The modulo gossip codec (docs/design.md section 12, after Moniqua; the grid's maths in
// modulo_codec.hpp): receiver-free, no reference, no global step. A pair (i, j) first swaps, per
// chunk, its last gap (the largest |difference| it saw there at its last exchange) and max |s|:
// both set the same grid, theta = margin x the larger gap. Each then sends only the residues of its
// values on that grid, and both ends compute the same wrapped difference d_ij = -d_ji, which is
// s_j - s_i up to the grid where no gap exceeds theta / 2; so the workers' mean is kept exactly and
// the precision follows the consensus gap, not the weights. A chunk that wrapped (caught by a
// checksum, at both ends) is resent in fp32 in the same round. The first round has no gaps: it
// goes in fp32 and measures them. Elastic rounds: the pairs' colours come from the view's graphs;
// a failed edge drops its pair's d_ij; a worker without gaps (a joiner) has its pairs' chunks
// resent in fp32 once.
#pragma once
#include <memory>
#include <vector>

#include "gasloc/algo/mix/codec_mix.hpp"
#include "gasloc/algo/modulo_codec.hpp"

namespace gasloc::algo {

class ModuloGossipMix final : public CodecGossipMix {
 public:
  ModuloGossipMix(topology::Topology topo, const CompressionOptions& o, std::unique_ptr<PeerClip> clip);
  // The coded rounds' prelude and residues, or p fp32 values in the first round.
  int64_t message_bytes(int64_t p, torch::ScalarType wire, int64_t t) const override;
  MixStats stats() const override;  // codec_resends: chunks resent in fp32 so far (a pair's chunk once per end)

 private:
  torch::Tensor exchange(int64_t t, const std::vector<RoundGraph>& graphs, const torch::Tensor& s, comm::Communicator& comm) override;
  void stand_by_exchange(int64_t t, const std::vector<RoundGraph>& graphs, comm::Communicator& comm) override;
  void save_codec(StateDict& s) const override;
  void load_codec(const StateDict& s) override;

  // Whether this worker's message of p parameters goes in fp32 in round t (the grids unsized).
  bool sends_fp32(int64_t t, int64_t p) const;
  // The fp32 first round: m as today's mix, and each chunk's gap measured from what arrived.
  torch::Tensor first_round(const RoundGraph& g, const torch::Tensor& s, comm::Communicator& comm);
  // The prelude: every neighbour's (gaps, max |s|) per chunk, in g.peers' order (undefined: a
  // failed edge); `maxes` gets this worker's max |s|.
  std::vector<torch::Tensor> swap_grids(const RoundGraph& g, const torch::Tensor& s, std::vector<float>& maxes,
                                        comm::Communicator& comm);
  // With partner p on the grid agreed from its prelude `theirs`: the residues, then the wrapped
  // chunks resent in fp32. Returns d = s_p - s up to the grid (undefined: the pair was dropped)
  // and raises new_gaps to its largest |d| per chunk.
  torch::Tensor pair_difference(int p, const torch::Tensor& theirs, const std::vector<float>& maxes, const torch::Tensor& s,
                                comm::Communicator& comm, torch::Tensor& new_gaps);

  ModuloGrid grid_;
  torch::Tensor gaps_;  // per chunk, the largest |d| of the last exchange (-1: none yet); "compression_gaps"
  int64_t resends_ = 0; // "compression_resends"
};

}  // namespace gasloc::algo
