// What an elastic Gloo rank does outside its algorithm, without a collective over all ranks
// (docs/training.md, "Elastic runs over Gloo"): the job's settings agreed in the store, a
// restarted rank's join (it waits for a view that lists it and takes its donor's whole state), a
// stop agreed in the store, and evaluation of the rank's own model.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

#include "gasloc/algo/store_views.hpp"
#include "gasloc/comm/elastic_roster.hpp"
#include "gasloc/train/meeting.hpp"
#include "gasloc/train/worker.hpp"

namespace gasloc::train {

class ElasticProcess {
 public:
  // `steps_per_round`: steps of one communication round (H, or 1 for per-step algorithms).
  ElasticProcess(comm::ElasticRoster& roster, int world, int64_t steps_per_round, double timeout_s);
  algo::StoreViews& views() { return views_; }
  // A restarted incarnation: it joins a running job instead of resuming from a checkpoint.
  bool joiner() const { return !roster_.founding(); }
  // Rank 0 among the job's first members: it starts the run's files.
  bool leader() const { return roster_.id() == 0 && roster_.founding(); }

  // The first rank to arrive publishes the job's shared settings; every later one (a joiner
  // too) compares its own and is refused naming the keys that differ.
  void agree(const nlohmann::json& shared);
  // The leader's run files are in place (metrics truncated for a fresh run); others wait for it.
  void files_ready();
  void wait_files_ready();
  // A joiner: waits for a round whose view lists it, takes its donor's state at that round's
  // merge, and becomes a member. Returns the step it continues from; -1 when the job ended first.
  int64_t join(Worker& w);
  // True when this rank stops after `step`: an interrupt here proposes a step two rounds ahead,
  // and every rank stops at the first proposal (so all checkpoint at the same step).
  bool should_stop(int64_t step, bool stop_requested);
  // This rank's own model, no collective.
  EvalResult evaluate(Worker& w, const std::vector<data::Batch>& val) const;

 private:
  comm::ElasticRoster& roster_;
  algo::StoreViews views_;
  int64_t steps_per_round_;
  double timeout_s_;
  std::optional<int64_t> stop_at_;
  bool proposed_ = false;
};

}  // namespace gasloc::train
