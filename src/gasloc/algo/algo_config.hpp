// [algo] section of the job file: which synchronizer runs and its settings.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "gasloc/algo/algorithms.hpp"
#include "gasloc/algo/compression.hpp"
#include "gasloc/algo/membership.hpp"
#include "gasloc/algo/peer_clip.hpp"
#include "gasloc/algo/registry.hpp"
#include "gasloc/algo/synchronizer.hpp"
#include "gasloc/comm/codec.hpp"
#include "gasloc/comm/network_model.hpp"
#include "gasloc/core/choice.hpp"
#include "gasloc/algo/consensus.hpp"
#include "gasloc/topology/topology.hpp"

namespace gasloc::algo {

// algo.h_policy's values (local_steps.hpp).
const config::Choices& h_policy_choices();

struct AlgoConfig {
  config::Choice name{algorithm_choices(), "none"};
  int64_t H = 30;
  double outer_lr = 0.7;
  double outer_momentum = 0.9;
  config::Choice topology{topology::kind_choices(), "2peer"};
  config::Choice h_policy{h_policy_choices(), "fixed"};
  config::Choice form{form_choices(), "anchor"};
  double gossip_step = 1.0;
  config::Choice wire_dtype{wire_dtype_choices(), "fp32"};
  int64_t overlap_steps = 0;
  config::Choice overlap{overlap_choices(), "delayed"};
  config::Choice compression{comm::compressions(), "none"};
  int64_t compression_chunk = 0;
  double topk_density = 1.0 / 64;
  config::Choice error_feedback{feedback_choices(), "auto"};
  double error_feedback_decay = 1.0;
  config::Choice gossip_codec{gossip_codec_choices(), "delta"};
  double modulo_margin = 4.0;
  int64_t reference_every = 5;
  bool clip_peers = false;
  double clip_factor = 2.0;

  template <class V>
  void visit(V&& v) {
    const Docs& d = docs();
    v("name", name, "the algorithm");
    v("H", H, d.H.c_str());
    v("outer_lr", outer_lr, d.outer_lr.c_str());
    v("outer_momentum", outer_momentum, d.outer_momentum.c_str());
    v("topology", topology, d.topology.c_str());
    v("h_policy", h_policy, d.h_policy.c_str());
    v("form", form, d.form.c_str());
    v("gossip_step", gossip_step, "gasloc accelerated: alpha in [0, 1], theta <- u - alpha (I - W) u + mu (u - u_prev); 1 mixes exactly as W");
    v("wire_dtype", wire_dtype, "dtype parameter messages are cast to on send (mixing and state stay fp32)");
    v("overlap_steps", overlap_steps, d.overlap_steps.c_str());
    v("overlap", overlap, "where the overlapped steps start (docs/training.md)");
    v("compression", compression, d.compression.c_str());
    v("compression_chunk", compression_chunk, "values per chunk, each with its own scale (0 = the codec's default: 256, topk 4096)");
    v("topk_density", topk_density, "topk: the fraction of each chunk sent, in (0, 1] (default 1/64)");
    v("error_feedback", error_feedback, "carry each round's encoding error into the next (auto: on for int4 and topk all-reduces)");
    v("error_feedback_decay", error_feedback_decay, "beta in a = beta e + u, in [0, 1]");
    v("gossip_codec", gossip_codec, "how gossip rounds compress: delta sends differences from a shared reference, modulo swaps residues on a per-pair grid (the mean kept exactly), direct (int8 only) decodes parameters");
    v("modulo_margin", modulo_margin, "modulo codec: the pair's grid spans this many times its last gap (>= 2)");
    v("reference_every", reference_every, "delta codec: K, the shared reference refreshed by an all-reduce every K rounds (0: first round only)");
    v("clip_peers", clip_peers, "clip each peer's message to clip_factor times a median of recent norms, against poisoned peers (docs/communication.md); an all-reduce becomes an all-gather");
    v("clip_factor", clip_factor, "clip_peers: the threshold as a multiple of the median norm (> 1)");
  }
  // Throws ConfigError naming the key; `world` is the number of workers (0 = not known yet:
  // the checks that depend on it are skipped).
  void validate(int world) const;
  void validate_compression() const;
  void validate_clip() const;

 private:
  // The docs that name the algorithms a setting applies to, from the registry.
  struct Docs {
    std::string H, outer_lr, outer_momentum, topology, h_policy, form, overlap_steps, compression;
  };
  static const Docs& docs();
};

// The synchronizer for one worker. `seed` seeds the shared gossip graphs (same on every worker);
// `network` prices rounds for h_policy = "time_budget" (required then, ignored otherwise).
// `poisons`: faults.poison, this run's poisoned messages (ConfigError naming the key for an
// algorithm that sends no parameters).
// `membership`: an elastic run's (docs/design.md section 10; it must outlive the synchronizer),
// for the algorithms of rounds (ConfigError for the others); nullptr for a fixed world.
std::unique_ptr<Synchronizer> make_synchronizer(const AlgoConfig& cfg, int world, uint64_t seed,
                                                const comm::NetworkModel* network = nullptr,
                                                const Membership* membership = nullptr,
                                                const std::vector<Poison>& poisons = {});

}  // namespace gasloc::algo
