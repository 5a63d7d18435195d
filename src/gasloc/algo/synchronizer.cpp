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

std::unique_ptr<Synchronizer> make_synchronizer(const AlgoConfig& cfg, int world, uint64_t seed) {
  cfg.validate(world);
  const OuterOptions outer{cfg.outer_lr, cfg.outer_momentum};
  auto topo = [&] { return topology::Topology(topology::parse_kind(cfg.topology), world, seed); };
  if (cfg.name == "none") return std::make_unique<NoSync>();
  if (cfg.name == "allreduce") return std::make_unique<AllReduceSync>();
  if (cfg.name == "diloco") return std::make_unique<DiLoCoSync>(cfg.H, outer);
  if (cfg.name == "gasloc") return std::make_unique<GossipSync>(cfg.H, outer, topo());
  if (cfg.name == "local_dadam") return std::make_unique<LocalDAdamSync>(cfg.H, topo());
  return std::make_unique<DAdamSync>(topo());
}

}  // namespace gasloc::algo
