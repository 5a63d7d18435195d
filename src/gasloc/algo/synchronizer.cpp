#include "gasloc/algo/synchronizer.hpp"

#include "gasloc/core/error.hpp"

namespace gasloc::algo {

std::unique_ptr<Synchronizer> make_synchronizer(const std::string& name) {
  if (name == "none") return std::make_unique<NoSync>();
  throw ConfigError("unknown algorithm '" + name + "' (config key algo.name)",
                    "valid algorithms in this build: none (single worker)");
}

}  // namespace gasloc::algo
