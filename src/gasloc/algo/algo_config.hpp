// [algo] section of the job file: which synchronizer runs and its settings.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "gasloc/algo/synchronizer.hpp"
#include "gasloc/comm/network_model.hpp"

namespace gasloc::algo {

struct AlgoConfig {
  std::string name = "none";
  int64_t H = 30;
  double outer_lr = 0.7;
  double outer_momentum = 0.9;
  std::string topology = "2peer";
  std::string h_policy = "fixed";
  std::string form = "anchor";
  double gossip_step = 1.0;
  std::string wire_dtype = "fp32";

  template <class V>
  void visit(V&& v) {
    v("name", name, "none, allreduce, diloco, gasloc, dadam, local_dadam");
    v("H", H, "inner steps per round (diloco, gasloc, local_dadam)");
    v("outer_lr", outer_lr, "outer learning rate eta (diloco, gasloc)");
    v("outer_momentum", outer_momentum, "outer Nesterov momentum mu in [0, 1) (diloco, gasloc)");
    v("topology", topology, "gossip graph: complete, 1peer, 2peer, ring, exp (gasloc, dadam, local_dadam)");
    v("h_policy", h_policy, "local steps per round: fixed (H everywhere) or time_budget (H_i from [network]; diloco, gasloc, local_dadam)");
    v("form", form, "gasloc: anchor (mix phi, outer step on theta), mix_after (outer step, then mix), accelerated (mix u, momentum on iterates)");
    v("gossip_step", gossip_step, "gasloc accelerated: alpha in [0, 1], theta <- u - alpha (I - W) u + mu (u - u_prev); 1 mixes exactly as W");
    v("wire_dtype", wire_dtype, "fp32 or bf16: parameter messages are cast to it on send; mixing and state stay fp32");
  }
  // Throws ConfigError naming the key; `world` is the number of workers (0 = not known yet:
  // the checks that depend on it are skipped).
  void validate(int world) const;
};

// The synchronizer for one worker. `seed` seeds the shared gossip graphs (same on every worker);
// `network` prices rounds for h_policy = "time_budget" (required then, ignored otherwise).
std::unique_ptr<Synchronizer> make_synchronizer(const AlgoConfig& cfg, int world, uint64_t seed,
                                                const comm::NetworkModel* network = nullptr);

}  // namespace gasloc::algo
