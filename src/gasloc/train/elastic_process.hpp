// What an elastic Gloo rank does outside its algorithm, without a collective over all ranks
// (docs/training.md, "Elastic runs over Gloo"): the job's settings agreed in the store, a
// restarted rank's join (it waits for a view that lists it and takes its donor's whole state), a
// stop agreed in the store, and evaluation of the rank's own model.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
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

  // Resuming (docs/design.md section 10, "Resuming an elastic run"): the ranks committed on their
  // own, so their newest steps may differ. Each founding rank publishes the committed steps it
  // can load; once every member of the roster has (or left it), the first to look decides, once
  // for all in the store: `asked` (--resume-step) if given, else the step the most ranks can
  // load, the newest on a tie. A rank that holds it loads it; one that does not (`heal`) takes a
  // donor's state at the first round's merge. Throws CheckpointError when nobody can load it.
  struct Resume {
    int64_t step = 0;
    bool heal = false;
    std::vector<int> loaders, healers;  // ids, as decided
    bool newer_dropped = false;         // a loader had committed a later step
  };
  Resume agree_resume(const std::vector<int64_t>& loadable, std::optional<int64_t> asked);
  // The agreed resume step, for a rank that did not take part (a joiner); waits for it.
  int64_t agreed_resume_step();

  // The run's files (run.json; metrics.jsonl dropped or cut at the resume step) are opened once,
  // by the first rank to claim them, of any id and incarnation: a claimant that dies before it is
  // done is replaced by a waiting rank. True for the rank that must open them now (then
  // files_ready()); false once another has.
  bool claim_files();
  void files_ready();

  // A joiner, or a founding rank that resumes without a state (Resume::heal): waits for a round
  // whose view lists it as joining, takes its donor's state at that round's merge, and becomes a
  // member. Returns the step it continues from; -1 when the job ended first.
  int64_t join(Worker& w);
  // The same for a worker of another kind (a Python rank, train/user_run.hpp): `heal` takes part
  // in the transfer of a HealPlan (false: its donor failed at it), `steps_done` is the step the
  // healed worker holds.
  int64_t join(const std::function<bool(const algo::HealPlan&)>& heal, const std::function<int64_t()>& steps_done);
  // This rank reached the job's last step: a joiner still waiting then knows the job finished.
  void finished(int64_t step);
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
  bool heals_ = false;  // a founding rank without a state: listed as joining until healed
  std::optional<int64_t> stop_at_;
  bool proposed_ = false;
};

}  // namespace gasloc::train
