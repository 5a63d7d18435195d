#include "gasloc/algo/registry.hpp"

#include "gasloc/algo/algo_config.hpp"
#include "gasloc/algo/algorithms.hpp"
#include "gasloc/algo/compression.hpp"
#include "gasloc/core/error.hpp"

namespace gasloc::algo {

topology::Topology SyncContext::topology() const {
  return topology::Topology(topology::parse_kind(cfg.topology), world, seed);
}

namespace {
LocalSteps priced_steps(const SyncContext& c, int64_t H, const char* what) {
  if (!c.network) throw ConfigError(std::string(what) + " needs the network model", "internal: pass [network] to make_synchronizer");
  return LocalSteps(H, *c.network, c.entry.needs_topology ? std::optional(c.topology()) : std::nullopt, c.world,
                    c.cfg.overlap_steps);
}
}  // namespace

LocalSteps SyncContext::steps() const {
  if (cfg.h_policy != "time_budget") return LocalSteps(cfg.H);
  return priced_steps(*this, cfg.H, "algo.h_policy = time_budget");
}

double SyncContext::round_seconds(int64_t actual_bytes) const {
  return priced_steps(*this, entry.has_rounds ? cfg.H : 1, "pricing a round").round_seconds(actual_bytes);
}

OuterOptions SyncContext::outer() const { return {cfg.outer_lr, cfg.outer_momentum}; }

Overlap SyncContext::overlap() const { return parse_overlap(cfg.overlap_steps, cfg.overlap); }

torch::ScalarType SyncContext::wire() const { return parse_wire_dtype(cfg.wire_dtype); }

namespace {
using Made = std::unique_ptr<Synchronizer>;
}  // namespace

const std::vector<AlgorithmEntry>& algorithms() {
  static const std::vector<AlgorithmEntry> table = {
      {.name = "none", .doc = "one worker, no communication", .single_worker = true,
       .make = [](const SyncContext&) -> Made { return std::make_unique<NoSync>(); }},
      {.name = "allreduce", .doc = "DDP: gradients averaged every step", .sends_gradients = true,
       .make = [](const SyncContext& c) -> Made { return std::make_unique<AllReduceSync>(c.world, c.membership); }},
      {.name = "diloco", .doc = "H local steps, then an all-reduce and an outer Nesterov step",
       .sends_parameters = true, .has_rounds = true, .has_outer = true,
       .make = [](const SyncContext& c) -> Made { return std::make_unique<DiLoCoSync>(c.steps(), c.outer(), c.world, c.membership, c.wire(), c.overlap()); }},
      {.name = "gasloc", .doc = "H local steps, then gossip with the round's neighbours and an outer step",
       .needs_topology = true, .sends_parameters = true, .has_rounds = true, .has_outer = true, .has_forms = true,
       .make = [](const SyncContext& c) -> Made {
         return std::make_unique<GossipSync>(c.steps(), c.outer(), c.topology(),
                                             GossipForm{parse_form(c.cfg.form), c.cfg.gossip_step}, c.wire(), c.membership,
                                             c.overlap());
       }},
      {.name = "dadam", .doc = "gossip mixing every step, then the AdamW step", .needs_topology = true, .sends_parameters = true,
       .make = [](const SyncContext& c) -> Made { return std::make_unique<DAdamSync>(c.topology(), c.wire(), c.membership); }},
      {.name = "local_dadam", .doc = "H local steps, then gossip averaging, no outer step",
       .needs_topology = true, .sends_parameters = true, .has_rounds = true,
       .make = [](const SyncContext& c) -> Made { return std::make_unique<LocalDAdamSync>(c.steps(), c.topology(), c.wire(), c.membership, c.overlap()); }},
  };
  return table;
}

int64_t AlgorithmEntry::rounds_in(int64_t steps, int64_t H) const {
  if (single_worker) return 0;
  return has_rounds ? steps / H : steps;
}

bool AlgorithmEntry::all_reduces(const std::string& topology) const {
  return !needs_topology || topology::parse_kind(topology) == topology::Kind::complete;
}

const config::Choices& algorithm_choices() {
  static const config::Choices c = config::choices_of("algorithm", algorithms());
  return c;
}

const AlgorithmEntry& algorithm(const std::string& name) { return algorithms().at(algorithm_choices().index(name)); }

std::string algorithm_names(bool AlgorithmEntry::*flag, bool value) { return config::names_where(algorithms(), flag, value); }

std::unique_ptr<Synchronizer> make_synchronizer(const AlgoConfig& cfg, int world, uint64_t seed,
                                                const comm::NetworkModel* network, const Membership* membership,
                                                const std::vector<Poison>& poisons) {
  cfg.validate(world);
  const AlgorithmEntry& entry = algorithm(cfg.name);
  if (membership && entry.single_worker)
    throw ConfigError("cluster.elastic: algo.name = " + cfg.name.str() + " trains one worker, which has nobody to lose",
                      "set cluster.elastic = false");
  auto sync = entry.make(SyncContext{cfg, entry, world, seed, network, membership});
  if (const auto o = compression_options(cfg)) {
    auto* rounds = dynamic_cast<MixSync*>(sync.get());
    if (!rounds) throw ConfigError("config key 'algo.compression': " + cfg.name.str() + " sends no parameters", "set algo.compression = none");
    rounds->compress(*o);
  }
  if (cfg.clip_peers || !poisons.empty()) {
    // allreduce averages gradients without a mixer of parameters (AlgoConfig refuses clip_peers there).
    auto* views = dynamic_cast<MixSync*>(sync.get());
    if (!views || entry.sends_gradients)
      throw ConfigError("config key 'faults.poison': " + cfg.name.str() + " sends no parameters to poison",
                        "remove faults.poison, or choose one of " + algorithm_names(&AlgorithmEntry::sends_parameters));
    if (cfg.clip_peers) views->clip(cfg.clip_factor);
    views->poison(poisons);
  }
  return sync;
}

}  // namespace gasloc::algo
