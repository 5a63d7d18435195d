// kind = "consensus" studies (study_file.hpp): gossip of random vectors with no training, each
// variant a graph and a GASLoC form taken from the job file's own keys. Nothing is trained or
// written to disk, so the section is computed whenever it is written: the simulation
// (algo/consensus.hpp) is deterministic for its seed and takes seconds.
#pragma once
#include <string>
#include <vector>

#include "gasloc/algo/consensus.hpp"
#include "gasloc/study/sweep.hpp"
#include "gasloc/study/verdict.hpp"

namespace gasloc::study {

// One variant's simulation.
struct ConsensusResult {
  std::string topology;
  int workers = 0;
  std::string step;              // "plain averaging" or the form and its step, as the table shows it
  bool plain = false;            // anchor form at lr 1, momentum 0: (1 - gap)^t is its prediction
  double gap = 0;                // closed form (topology/spectral.hpp)
  std::vector<double> distance;  // consensus distance / initial after rounds 0..spec.rounds
  algo::ConsensusRate rate;      // over spec.rate_rounds
};
// Throws ConfigError if the run's job does not load.
ConsensusResult simulate_run(const SweepSpec& spec, const SweepRun& run);

// "a's consensus distance shrinks per round as 1 - gap predicts": reproduced when the mean
// per-round ratio is within `tolerance` (relative) of 1 - gap, not reproduced otherwise. One
// simulation has no seeds to spread over; the tolerance, fixed in the study file, must cover its
// sampling error.
Judgement judge_gap_rate(const ConsensusResult& a, double tolerance, int64_t rate_rounds);
// "a reaches consensus faster than b": a's long-run contraction (the geometric mean of the
// per-round ratios) is lower than b's.
Judgement judge_contraction_lower(const ConsensusResult& a, const ConsensusResult& b, int64_t rate_rounds);

// The section: per group, a table of each variant's consensus distance at a few rounds against
// (1 - gap)^t, its per-round rates, a plot of every round, and the claims' verdicts.
std::string consensus_section(const SweepSpec& spec, const std::vector<SweepRun>& runs, const SweepOptions& opts);

}  // namespace gasloc::study
