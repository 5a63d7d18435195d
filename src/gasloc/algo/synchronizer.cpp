#include "gasloc/algo/synchronizer.hpp"

#include "gasloc/algo/algo_config.hpp"
#include "gasloc/algo/algorithms.hpp"
#include "gasloc/core/config.hpp"
#include "gasloc/core/error.hpp"

namespace gasloc::algo {

static const char* kNames = "none, allreduce, diloco, gasloc, dadam, local_dadam";

void AlgoConfig::validate(int world) const {
  using config::require;
  const bool known = name == "none" || name == "allreduce" || name == "diloco" || name == "gasloc" ||
                     name == "dadam" || name == "local_dadam";
  require(known, "algo.name", "unknown algorithm '" + name + "'; valid: " + kNames);
  require(H >= 1, "algo.H", "must be >= 1, got " + std::to_string(H));
  require(outer_lr > 0, "algo.outer_lr", "must be > 0");
  require(outer_momentum >= 0 && outer_momentum < 1, "algo.outer_momentum", "must be in [0, 1)");
  require(h_policy == "fixed" || h_policy == "time_budget", "algo.h_policy", "must be fixed or time_budget, got '" + h_policy + "'");
  require(h_policy == "fixed" || name == "diloco" || name == "gasloc" || name == "local_dadam", "algo.h_policy",
          "time_budget applies to algorithms with rounds of local steps (diloco, gasloc, local_dadam), not '" + name + "'");
  try {
    topology::parse_form(form);
  } catch (const ConfigError& e) {
    throw ConfigError("config key 'algo.form': " + std::string(e.what()), e.hint());
  }
  require(form == "anchor" || name == "gasloc", "algo.form",
          "applies to gasloc only; '" + name + "' has one form: leave algo.form = anchor");
  require(gossip_step >= 0 && gossip_step <= 1, "algo.gossip_step", "must be in [0, 1]");
  require(gossip_step == 1.0 || form == "accelerated", "algo.gossip_step",
          "is alpha of the accelerated form; with algo.form = " + form + " leave it at 1");
  parse_wire_dtype(wire_dtype);
  require(wire_dtype == "fp32" || name != "allreduce", "algo.wire_dtype",
          "applies to parameter messages; allreduce averages gradients in fp32");
  if (world > 0)
    require(name != "none" || world == 1, "algo.name",
            "'none' trains one worker; choose allreduce, diloco, gasloc, dadam or local_dadam for " +
                std::to_string(world) + " workers");
  if (name == "gasloc" || name == "dadam" || name == "local_dadam") {
    try {
      const auto kind = topology::parse_kind(topology);
      if (world > 0) topology::Topology(kind, world, 0);  // throws if the graph cannot exist for n
    } catch (const ConfigError& e) {
      throw ConfigError("config key 'algo.topology': " + std::string(e.what()), e.hint());
    }
  }
}

std::unique_ptr<Synchronizer> make_synchronizer(const AlgoConfig& cfg, int world, uint64_t seed,
                                                const comm::NetworkModel* network) {
  cfg.validate(world);
  const OuterOptions outer{cfg.outer_lr, cfg.outer_momentum};
  auto topo = [&] { return topology::Topology(topology::parse_kind(cfg.topology), world, seed); };
  const bool gossip = cfg.name == "gasloc" || cfg.name == "local_dadam";
  auto steps = [&] {
    if (cfg.h_policy != "time_budget") return LocalSteps(cfg.H);
    if (!network) throw ConfigError("algo.h_policy = time_budget needs the network model", "internal: pass [network] to make_synchronizer");
    return LocalSteps(cfg.H, *network, gossip ? std::optional(topo()) : std::nullopt, world);
  };
  if (cfg.name == "none") return std::make_unique<NoSync>();
  if (cfg.name == "allreduce") return std::make_unique<AllReduceSync>();
  const auto wire = parse_wire_dtype(cfg.wire_dtype);
  if (cfg.name == "diloco") return std::make_unique<DiLoCoSync>(steps(), outer, wire);
  if (cfg.name == "gasloc")
    return std::make_unique<GossipSync>(steps(), outer, topo(), GossipForm{topology::parse_form(cfg.form), cfg.gossip_step}, wire);
  if (cfg.name == "local_dadam") return std::make_unique<LocalDAdamSync>(steps(), topo(), wire);
  return std::make_unique<DAdamSync>(topo(), wire);
}

}  // namespace gasloc::algo
