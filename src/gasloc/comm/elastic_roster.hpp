// Elastic membership of process runs, kept in the job's store (docs/design.md section 10).
//
// One writer: `gasloc launch --elastic` sees every rank process start and exit and owns the
// roster key; it marks a rank dead the moment its process is gone, and kills a rank whose
// heartbeat stalls (fencing: a rank declared dead never comes back with stale state; it is
// restarted as a new incarnation and joins). Ranks only read the roster, announce themselves
// (up: ready to receive a state; in: healed, a member), and pin each round's view:
//   el/roster          "ID:INC:S;..." for every id, S = s(tarting) m(ember) j(oining) d(ead)
//   el/view/R.A        round R's view (attempt A after an aborted all-reduce), set once by
//                      compare_set: the first rank to reach the merge writes the roster's members
//                      and joiners as they are then, and every other rank reads the same view,
//                      with no barrier
//   el/latest          the newest round pinned (a joiner's place to start looking)
//   el/up/ID, el/in/ID the incarnation that announced itself
//   el/suspect/ID      a rank whose link failed while it was not known dead (the writer kills it)
//   el/stop            the step at which every rank stops (an interrupt, set once)
//   el/config          the run's shared settings, set by the first rank: a joiner must match
//   el/at/ID           "INC:R": the newest round whose view this incarnation asked for; the
//                      roster's writer deletes the keys of rounds below every member's
//                      (RosterWriter::prune_rounds), so the store does not grow with the rounds
//   el/ar/C, el/ar/C/ok/ID  an all-reduce's decision and its members' receipts (C = round *
//                      kAttemptsPerRound + attempt)
//   el/resume/ID, el/resume   a resumed job: the committed steps each founding rank can load, and
//                      the step all resume from, decided once (train/elastic_process.hpp)
//   el/behind/ID       the incarnation of a member that resumes without a state of its own: views
//                      list it as joining (healed by a donor) until it announces `in`
//   el/files, el/files_ready  who opens the run's files, and that they are open
//   el/finished        the last step, once a rank reached it
//   el/left/ID         "INC:STEP": this incarnation leaves the job on purpose after STEP, its
//                      checkpoint written (a Python rank's Ctrl+C or exception, docs/python.md):
//                      the launcher does not count its exit as a death nor restart it
#pragma once
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "gasloc/comm/view.hpp"

namespace gasloc::comm {

// All-reduce attempts of one round: a round's call ids are round * kAttemptsPerRound + attempt.
constexpr int64_t kAttemptsPerRound = 64;

enum class RankState : char { starting = 's', member = 'm', joining = 'j', dead = 'd' };

struct RosterEntry {
  int id = 0;
  int64_t incarnation = 0;
  RankState state = RankState::starting;
};

struct Roster {
  std::vector<RosterEntry> entries;  // ids ascending
  std::string encode() const;
  // Throws CommError on text that is not a roster.
  static Roster decode(const std::string& text);
  const RosterEntry* find(int id) const;
  std::vector<int> with(RankState s) const;
};


// The store's key names (tests and the launcher use them too).
namespace elastic_keys {
std::string roster();
std::string view(int64_t round, int attempt);
std::string latest();
std::string up(int id);
std::string in(int id);
std::string suspect(int id);
std::string stop();
std::string config();
std::string at(int id);
std::string resume_of(int id);
std::string resume();
std::string behind(int id);
std::string any_behind();
std::string files();
std::string files_ready();
std::string finished();
std::string left(int id);
std::string all_reduce(int64_t call_id);
std::string all_reduce_ok(int64_t call_id, int id);
}  // namespace elastic_keys

// A rank's side. All calls are bounded by the store's timeout and throw CommError.
class ElasticRoster {
 public:
  // `founding`: a first member of the job (default: incarnation 0, as gasloc launch starts them);
  // otherwise a joiner that takes a donor's state.
  ElasticRoster(c10::intrusive_ptr<c10d::Store> store, int id, int64_t incarnation, std::optional<bool> founding = {});
  int id() const { return id_; }
  int64_t incarnation() const { return incarnation_; }
  bool founding() const { return founding_; }
  c10d::Store& store() { return *store_; }

  Roster read();
  // Round `round`'s view (attempt `attempt`): pinned now from the roster if no rank has yet.
  View pin(int64_t round, int attempt = 0);
  // The view if some rank has pinned it.
  std::optional<View> pinned(int64_t round, int attempt = 0);
  int64_t latest_round();
  // The incarnation of `id` in the newest view this rank pinned or read (-1: none seen yet).
  int64_t incarnation_of(int id) const;
  // Whether incarnation `inc` of `id` is gone: dead, or replaced by a newer one.
  bool gone(int id, int64_t inc);
  void announce_up();
  void announce_member();
  // This member resumes without a state of its own: views list it as joining until it is healed.
  void announce_behind();
  // This incarnation leaves the job after `step` (its checkpoint written): its exit is not a death.
  void announce_leave(int64_t step);
  // Reports incarnation `inc` of `peer`, whose link failed while the roster listed it alive.
  void suspect(int peer, int64_t inc);
  // The step every rank stops at: proposes `step` if nobody has yet; returns the agreed one.
  int64_t request_stop(int64_t step);
  std::optional<int64_t> stop_step();

 private:
  View seen(View v);
  // Tells the roster's writer that this incarnation reads no view below `round` again.
  void mark_progress(int64_t round);

  c10::intrusive_ptr<c10d::Store> store_;
  int id_;
  int64_t incarnation_;
  bool founding_;
  std::map<int, int64_t> known_;
  int64_t marked_round_ = -1;
};

// The launcher's side, on its own store (no socket, never blocks on a rank).
class RosterWriter {
 public:
  RosterWriter(c10d::Store& store, int world);
  // Process `id` started as `incarnation`: a member (the job's first incarnations) or a joiner-to-be.
  void started(int id, int64_t incarnation, bool member);
  void exited(int id, int64_t incarnation);
  // Reads the ranks' announcements; writes the roster when it changed. Returns the ids that
  // became members since the last call (healed joiners).
  std::vector<int> poll();
  // Ranks reported by a peer whose link to them failed, with the incarnation reported (cleared
  // once read): the caller kills that incarnation if it still runs.
  std::vector<std::pair<int, int64_t>> take_suspects();
  const Roster& roster() const { return roster_; }
  int count(RankState s) const { return static_cast<int>(roster_.with(s).size()); }
  // Deletes the views and all-reduce keys of rounds that no live rank reads again: those more
  // than kKeptRounds below every member's progress (el/at/ID of its current incarnation). A
  // joiner scans views from el/latest on and steps over missing ones; its donor cannot pass the
  // round that heals it, so that round stays. Nothing is deleted while a member has not yet
  // said where it is. Returns the number of keys deleted. poll() calls it.
  int64_t prune_rounds();
  static constexpr int64_t kKeptRounds = 2;

 private:
  void publish();
  c10d::Store& store_;
  Roster roster_;
  int64_t pruned_below_ = 0;  // rounds below this have no keys left
};

}  // namespace gasloc::comm
