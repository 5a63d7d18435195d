// Elastic membership on the in-process cluster (docs/design.md section 10): which workers act in
// each communication round, as a pure function of a fault schedule, so that every worker derives
// the same view of round r with no messages and a run with faults is deterministic.
//
// A worker is known by its id, the rank it was launched as, kept across restarts; its data
// stream, seed, local-step budget, slowdown and bandwidth stay keyed by that id whatever the view,
// so a death never moves data or heterogeneity between workers. Round r of a worker killed at r:
//   - it computes round r's local steps and dies at round r's merge: it is in the view V_r, so its
//     partners lose their edge to it (W_ij moves onto W_ii) and an all-reduce round over V_r is
//     aborted and retried over the survivors;
//   - it is out of the views of rounds r+1 .. r+d-1 (no compute, no messages, its clock stops);
//   - with a restart after d rounds it is a joiner of round r+d: it computes nothing in that round
//     and, at its merge, receives the whole worker state from a donor (weight 0 in the mix);
//   - from round r+d+1 on it is a member again.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "gasloc/comm/view.hpp"

namespace gasloc::algo {

// One scheduled failure: worker `id` dies at the merge of round `round`; it restarts and rejoins
// `restart_after_rounds` rounds later (0: it never comes back).
struct FaultEvent {
  int id = 0;
  int64_t round = 0;
  int64_t restart_after_rounds = 0;
  bool operator==(const FaultEvent&) const = default;
};

// Random churn: each worker fails after a geometric number of rounds of mean `mean_rounds`
// (counted from its (re)start), and restarts `restart_after_rounds` later.
struct Churn {
  double mean_rounds = 0.0;  // 0: no churn
  int64_t restart_after_rounds = 1;
  uint64_t seed = 0;
};

// Stop-and-resume, what elastic runs are judged against: at a failure every worker stops and all
// restart from the last committed checkpoint. Training is the failure-free run's, bit for bit (a
// resumed run continues exactly), so only the clocks pay: at a failure's round every clock waits
// for the slowest, then for delay_s, then for the work since the last checkpoint, done again.
struct RestartAll {
  double delay_s = 30.0;                // restarting the job: processes, rendezvous, loading the checkpoint
  int64_t checkpoint_every_rounds = 0;  // 0: no checkpoint, a failure replays from the start
};

// Ids that first arrive at a round, by id (an elastic run resumed on more workers than saved it):
// out of every view before that round, joining at it (healed from a donor at its merge), members
// after it.
using Arrivals = std::map<int, int64_t>;

// The members of one round (comm/view.hpp): one type for the in-process reference and the
// views a process run pins in the store.
using comm::View;

// A worker's part in handing a joiner its state at a round's merge: the donor lists its joiners,
// a joiner lists its donor; `receives` for a joiner. Every worker takes part in the transfer call
// (an empty list for a bystander), since the in-process backend matches calls by order.
struct HealPlan {
  std::vector<int> peers;
  bool receives = false;
};
// Worker `id`'s part in the state transfer after a round of `view`, when it has joiners.
std::optional<HealPlan> heal_plan(const View& view, int id);

// Who acts in each round. This class is the in-process reference, a pure function of a fault
// schedule; an elastic process run derives from it a source whose views the job's store pins
// (store_views.hpp), and every synchronizer reads either through the same calls.
class Membership {
 public:
  // `workers` ids 0..workers-1; events are checked (ConfigError naming the entry): an id inside
  // the world, a round >= 0, no second death of an id before it has rejoined, and at least one
  // survivor in every round. Churn events are drawn for rounds < `horizon_rounds`.
  // With `restart_all`, nobody leaves: every view is the whole world, and the events are the
  // rounds at which the whole job stops and restarts (fails_at). An arriving id's events up to
  // its arrival are dropped: it is not there to be killed.
  Membership(int workers, std::vector<FaultEvent> events, Churn churn = {}, int64_t horizon_rounds = 0,
             std::optional<RestartAll> restart_all = std::nullopt, Arrivals arrivals = {});

  virtual ~Membership() = default;
  int workers() const { return workers_; }
  // The view of round r.
  virtual View view(int64_t round) const;
  // Whether `id` computes round r's local steps: a member, dying or not; not a joiner or a dead worker.
  virtual bool computes(int id, int64_t round) const;
  // The view an all-reduce of `v` aborted at its `attempt`-th try (from 1) is retried over: its
  // survivors. A schedule kills at most one round's dying at once, so a second abort is a bug.
  virtual View retry(const View& v, int attempt) const;
  const std::vector<FaultEvent>& events() const { return events_; }  // scheduled and drawn, by round then id
  // Every worker in every round: the fixed-world path, bit for bit.
  virtual bool trivial() const { return events_.empty() && arrivals_.empty(); }
  const std::optional<RestartAll>& restart_all() const { return restart_all_; }
  // Whether a worker fails at round r's merge (the whole job restarts then, under restart_all).
  bool fails_at(int64_t round) const;

 protected:
  // A source of views without a schedule (store_views.hpp).
  explicit Membership(int workers) : workers_(workers) {}

 private:
  enum class State { member, dying, dead, joining };
  State state(int id, int64_t round) const;

  int workers_;
  std::vector<FaultEvent> events_;
  std::optional<RestartAll> restart_all_;
  Arrivals arrivals_;
};

// The churn events of `workers` for rounds < horizon (pure function of the churn's seed).
std::vector<FaultEvent> draw_churn(int workers, const Churn& churn, int64_t horizon_rounds);

}  // namespace gasloc::algo
