// The algorithms algo.name selects, one entry each: what settings an algorithm takes and how its
// synchronizer is built. AlgoConfig's validation, its --help-config text and make_synchronizer
// read this table; adding an algorithm is adding an entry (registry.cpp).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gasloc/algo/algorithms.hpp"
#include "gasloc/algo/local_steps.hpp"
#include "gasloc/algo/membership.hpp"
#include "gasloc/algo/outer.hpp"
#include "gasloc/algo/synchronizer.hpp"
#include "gasloc/comm/network_model.hpp"
#include "gasloc/core/choice.hpp"
#include "gasloc/topology/topology.hpp"

namespace gasloc::algo {

struct AlgoConfig;
struct AlgorithmEntry;

// What an entry builds its synchronizer from: the settings, checked, and the world.
struct SyncContext {
  const AlgoConfig& cfg;
  const AlgorithmEntry& entry;
  int world;
  uint64_t seed;                       // seeds the gossip graphs (the same on every worker)
  const comm::NetworkModel* network;   // prices rounds for h_policy = "time_budget"
  const Membership* membership;        // an elastic run's; nullptr for a fixed world

  topology::Topology topology() const;
  // The local-step policy; time_budget plans each round's exchange over the entry's topology.
  LocalSteps steps() const;
  // An unimpeded worker's round time on `network` (required), whatever the local-step policy: H
  // steps (one for algorithms without rounds) and the round's exchange of `actual_bytes`.
  double round_seconds(int64_t actual_bytes) const;
  OuterOptions outer() const;
  Overlap overlap() const;
  torch::ScalarType wire() const;
};

struct AlgorithmEntry {
  std::string name;
  std::string doc;
  bool needs_topology = false;     // gossips over algo.topology
  bool sends_parameters = false;   // exchanges parameters (algo.compression applies)
  bool has_rounds = false;         // rounds of algo.H local steps (and algo.h_policy)
  bool has_outer = false;          // an outer Nesterov step (algo.outer_lr, algo.outer_momentum)
  bool has_forms = false;          // algo.form chooses among several rounds
  bool sends_gradients = false;    // exchanges gradients, always fp32 (algo.wire_dtype does not apply)
  bool single_worker = false;      // trains one worker only
  std::unique_ptr<Synchronizer> (*make)(const SyncContext&) = nullptr;

  // What it sends and when, for those that price or label a run without running it (the study
  // layer): its communication rounds in `steps` inner steps (every step, one per H, or none for
  // a single worker), and whether a round is an all-reduce on `topology` (algo.topology; else a
  // gossip exchange with the round's neighbours).
  int64_t rounds_in(int64_t steps, int64_t H) const;
  bool all_reduces(const std::string& topology) const;
};

// Every algorithm, in the order --help-config lists them.
const std::vector<AlgorithmEntry>& algorithms();
// The entry named `name`; ConfigError listing the valid names otherwise.
const AlgorithmEntry& algorithm(const std::string& name);
// The names of algorithms(), for algo.name.
const config::Choices& algorithm_choices();
// "diloco, gasloc, local_dadam": the algorithms for which `flag` is set.
std::string algorithm_names(bool AlgorithmEntry::*flag, bool value = true);

}  // namespace gasloc::algo
