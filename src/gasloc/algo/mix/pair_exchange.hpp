// What the compressed exchanges share (docs/design.md section 12): they are built from the
// communicator's pair exchange of byte payloads alone, so every backend (in-process, Gloo) carries
// them unchanged and gives the same bits. Here: the pair schedules, one exchange per colour, the
// errors a compressed round raises, and a gossip codec's payloads (a worker's own, with its error
// feedback, and a peer's, decoded).
#pragma once
#include <torch/types.h>

#include <cstdint>
#include <span>
#include <vector>

#include "gasloc/algo/mix/mix.hpp"
#include "gasloc/comm/codec.hpp"
#include "gasloc/comm/communicator.hpp"

namespace gasloc::algo {

// The rounds of a complete pairing of `n` positions (the circle method): schedule[c][k] is the
// partner of position k in round c, or -1 when k sits that round out (odd n). n - 1 rounds for
// even n, n for odd; every pair meets once.
std::vector<std::vector<int>> round_robin(int n);
// A proper edge colouring of a symmetric graph given by each vertex's neighbours (edges taken in
// ascending (i, j) order, each given the smallest colour free at both ends): colours[c][v] is v's
// partner in colour c, or -1. The same on every worker for the same graph.
std::vector<std::vector<int>> pair_colours(const std::vector<std::vector<int>>& neighbours);
// pair_colours of a round's graphs (graphs[v]: worker v's).
std::vector<std::vector<int>> pair_colours(const std::vector<RoundGraph>& graphs);

// Views of a contiguous CPU tensor's elements, as the codecs take them.
inline std::span<float> floats(torch::Tensor& t) { return {t.data_ptr<float>(), static_cast<size_t>(t.numel())}; }
inline std::span<const float> floats(const torch::Tensor& t) { return {t.data_ptr<float>(), static_cast<size_t>(t.numel())}; }
inline std::span<uint8_t> bytes(torch::Tensor& t) { return {t.data_ptr<uint8_t>(), static_cast<size_t>(t.numel())}; }
inline std::span<const uint8_t> bytes(const torch::Tensor& t) { return {t.data_ptr<uint8_t>(), static_cast<size_t>(t.numel())}; }
// x as a flat fp32 copy on the CPU, where the codecs run.
torch::Tensor cpu_fp32(const torch::Tensor& x);
torch::Tensor byte_tensor(const std::vector<uint8_t>& v);

// A codec's refusal of a worker's own values, as the round's error naming it.
[[noreturn]] void non_finite(const comm::NonFiniteChunk& e, int rank, const char* what);
// A peer's payload that no encoder produces.
[[noreturn]] void bad_payload(const comm::BadPayload& e, int me, int peer);
// A peer whose payload did not come: an error with a fixed membership; in an elastic round a
// failed edge, which the caller drops.
void failed_edge(bool elastic, int me, int peer);

// One pair exchange per colour: exchange `send(partner)` with the colour's partner, hand what
// arrived to got(partner, tensor). Every worker runs every colour, alone in those it sits out (and
// in all of them when it is not among `ids`: me < 0). A worker that does not send (`sends`
// false) lists its partners with nothing, so they see a failed edge. A failed edge: `failed` gets
// the partner's id, and got() is not called.
template <class Send, class Got>
void pairwise(const std::vector<std::vector<int>>& colours, const std::vector<int>& ids, int me, bool sends,
              comm::Communicator& comm, Send send, Got got, int& failed) {
  for (const auto& partner : colours) {
    const int p = me < 0 ? -1 : partner[me];
    std::vector<torch::Tensor> recv;
    if (p < 0) {
      comm.exchange({}, torch::empty({0}, torch::kByte), recv);
      continue;
    }
    comm.exchange({ids[p]}, sends ? send(p) : torch::Tensor(), recv);
    if (!sends) continue;
    if (!recv.at(0).defined()) {
      failed = ids[p];
      continue;
    }
    got(p, recv[0]);
  }
}

// A gossip codec's payloads on one worker (the direct and delta codecs): its own, encoded with its
// error feedback when on (e, checkpointed as "compression_feedback"), and a peer's, decoded.
class GossipPayloads {
 public:
  GossipPayloads(comm::Codec codec, bool feedback, float decay) : codec_(codec), feedback_on_(feedback), decay_(decay) {}
  // CommError naming the worker on a non-finite u (fp32, flat, on the CPU).
  torch::Tensor encode(const torch::Tensor& u, int me);
  // CommError naming the sender on a malformed payload.
  torch::Tensor decode(const torch::Tensor& payload, int64_t n, int me, int from) const;
  void save(StateDict& s) const;
  void load(const StateDict& s);

 private:
  comm::Codec codec_;
  bool feedback_on_;
  float decay_;
  torch::Tensor feedback_;
};

// A checkpointed tensor as fp32 (undefined when the key is absent: the state starts at zero).
torch::Tensor loaded_fp32(const StateDict& s, const char* key);

}  // namespace gasloc::algo
