// The owners' compressed all-reduce (docs/design.md section 12): the mean pseudo-gradient
// Delta = mean_i (r - x_i) over the members, r the anchor every member holds.
// - int8 / int4: the chunks are dealt into n shards of whole chunks (member k owns shard k); an
//   all-to-all of encode(shard k) to its owner; the owner's fp32 sum of the n decoded codes in id
//   order divided by n, re-encoded with the owner's own error feedback; an all-gather of the
//   owners' codes. Every member takes decode of its owner's code, the owner included.
// - topk: an all-gather of fixed-size payloads, decoded and summed in id order.
// Every member ends with the same Delta, bit for bit; the result is r - Delta. The delta gossip
// codec refreshes its reference with the int8 form (gossip_delta.hpp).
#pragma once
#include <torch/types.h>

#include <vector>

#include "gasloc/algo/mix/codec_mix.hpp"
#include "gasloc/comm/codec.hpp"
#include "gasloc/comm/communicator.hpp"

namespace gasloc::algo {

// One worker's part in the all-reduce and its error feedback: e of the worker's own Delta_i
// ("compression_feedback", P) and e* of the shard it owns ("compression_owner_feedback").
class OwnersAllReduce {
 public:
  OwnersAllReduce(comm::Codec codec, bool feedback, float decay) : codec_(codec), feedback_on_(feedback), decay_(decay) {}
  // r - Delta^ over `members` (ids ascending, the caller among them); x and r of one shape, any
  // float dtype, on any device; the result is fp32 on x's device. Every member calls it with the
  // same members; a non-finite Delta_i is a CommError naming the worker.
  // complete: null for a fixed membership (a failed edge throws). Else one attempt of an elastic
  // round: every worker of the world calls it with the attempt's members, x undefined for a worker
  // that does not send (a member that dies here lists its partners and sends nothing, so they see
  // failed edges; a worker outside makes the exchanges alone). A failed edge does not throw:
  // *complete turns false and the result is undefined.
  torch::Tensor run(const torch::Tensor& x, const torch::Tensor& r, const std::vector<int>& members, comm::Communicator& comm,
                    bool* complete = nullptr);
  const comm::Codec& codec() const { return codec_; }
  void save(StateDict& s) const;
  void load(const StateDict& s);

 private:
  // Phase 1 and 2 of int8/int4 (the owners' shards, then their codes), or topk's all-gather:
  // `decoded` gets Delta^ over n shards of `shard` values.
  void owners(const torch::Tensor& codes, const std::vector<std::vector<int>>& colours, const std::vector<int>& members, int me,
              int64_t shard, comm::Communicator& comm, torch::Tensor& decoded, int& failed);
  void all_gather(const torch::Tensor& codes, const std::vector<std::vector<int>>& colours, const std::vector<int>& members, int me,
                  comm::Communicator& comm, torch::Tensor& decoded, int& failed);

  comm::Codec codec_;
  bool feedback_on_;
  float decay_;
  torch::Tensor feedback_;        // e: of Delta_i; P
  torch::Tensor owner_feedback_;  // e*: the owner's, of its shard's mean; S C
};

// r - mean_i (r - x_i), r the anchor theta (OwnersAllReduce). Elastic rounds: attempts that the
// members agree on, each aborted one putting the codec's state back.
class OwnersAllReduceMix final : public CodecMix {
 public:
  OwnersAllReduceMix(topology::Topology topo, const CompressionOptions& o);
  MixFlight start(const MixRound& r, comm::Communicator& comm) override;
  torch::Tensor finish(MixFlight& f) override { return f.result; }
  bool has_collective(int64_t) const override { return true; }
  MixAttempt collective_attempt(const MixRound& r, comm::Communicator& comm) override;
  bool restores_state() const override { return true; }
  bool needs_anchor() const override { return true; }
  int64_t message_bytes(int64_t p, torch::ScalarType wire, int64_t t) const override;
  StateDict state() const override;
  void load_state(const StateDict& s) override;

 private:
  OwnersAllReduce reduce_;
};

}  // namespace gasloc::algo
