// Elastic ranks started by hand (docs/training.md, "Elastic runs started by hand"): `gasloc store
// --elastic -n N` is the one writer of the roster, as `gasloc launch --elastic` is for the ranks
// it starts. It cannot see processes exit or kill them (they may run on other hosts), so:
// - a starting process claims its incarnation, inc = add(el/inc/ID, 1) - 1, and waits for the
//   host's answer in el/admit/ID.INC: a founding member (until every id of the job has started
//   once), a joiner (afterwards: it takes a donor's state), or refused (the id is alive); with
//   founders F < N, ids 0..F-1 found the job and ids F..N-1 are joiners, answered once it runs
//   (room to add workers to a running job, or a run resumed on more ranks than saved it);
// - the host judges liveness by heartbeats alone: an incarnation whose counter has not moved for
//   the heartbeat timeout is declared dead; a peer's suspect report declares it dead sooner, once
//   its counter has been still for kSuspectSilenceS (a report alone never evicts);
// - a rank declared dead that was only stopped finds itself out of the next view and exits
//   (fencing without a kill); started again, it rejoins as a new incarnation;
// - a rank that ends (finished, stopped, or failed with an error) says so in el/out/ID, and
//   leaves the roster at once.
#pragma once
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "gasloc/comm/elastic_roster.hpp"
#include "gasloc/comm/heartbeat.hpp"

namespace gasloc::comm {

// Seconds a counter must be still before a peer's suspect report, or a second process claiming
// the same id, counts the incarnation as gone (six missed beats; at most half the heartbeat
// timeout).
constexpr double kSuspectSilenceS = 3.0;

namespace elastic_keys {
std::string world();                          // the job's number of ids (the host's -n)
std::string founders();                       // ids 0..F-1 found the job; the rest join it (--founders)
std::string claim(int id);                    // incarnation counter of one id
std::string admit(int id, int64_t inc);       // the host's answer to a claim
std::string founded();                        // set once every id has started
std::string out(int id);                      // the incarnation that ended
std::string heartbeat_timeout();              // the job's cluster.heartbeat_timeout_s, set by its first rank
}  // namespace elastic_keys

// What a process started by hand became.
struct Admission {
  int64_t incarnation = 0;
  bool founding = true;  // a first member of the job (false: a joiner that heals from a donor)
};

// The rank's side: claims an incarnation of `id` and waits (at most timeout_s) for the host's
// answer. Throws ConfigError when the host refuses (the id is alive; another world size) and
// CommError when the store keeps no elastic roster or the answer does not come.
Admission admit_by_hand(c10d::Store& store, int id, int world, double timeout_s);
// A founding member, beating already: waits (at most timeout_s) until every founding id has started.
void await_founded(c10d::Store& store, int id, double timeout_s);
// Whether a process of `id` started now would be a founding member: the job does not run yet
// and `id` is below the store's --founders.
bool founds_the_job(c10d::Store& store, int id);
// Says that this incarnation ended (best effort: a failure here is ignored).
void announce_out(c10d::Store& store, int id, int64_t inc) noexcept;

// The host's side, on its own store (no socket, never blocks on a rank).
class RosterHost {
 public:
  // `founders`: ids 0..founders-1 found the job (default: all `world`). `heartbeat_timeout_s`:
  // the host's own (gasloc store --heartbeat-timeout); unset, the job's cluster.heartbeat_timeout_s
  // as its first rank publishes it (elastic_keys::heartbeat_timeout).
  RosterHost(c10d::Store& store, int world, std::optional<double> heartbeat_timeout_s, int founders = 0);
  // Answers claims, reads announcements, heartbeats, leaves and suspects at `now_s` (seconds of
  // the host's steady clock). Returns what happened, one line per event, for the host's log.
  std::vector<std::string> tend(double now_s);
  bool founded() const { return founded_; }
  // The timeout in force (unset until the job's first rank published it, when the host has none).
  std::optional<double> heartbeat_timeout_s() const { return heartbeat_timeout_s_; }
  const Roster& roster() const { return writer_.roster(); }

 private:
  struct Life {
    int64_t claims_seen = 0;  // claims answered
    int64_t beats = 0;        // the heartbeat counter when last read
    double since_s = 0;       // when it last moved (or the incarnation was admitted)
  };
  struct Suspect {
    int64_t inc = 0;
    int64_t beats = 0;  // the counter when the report came
  };
  void answer_claims(int id, double now_s, std::vector<std::string>& events);
  void watch_life(int id, double now_s, std::vector<std::string>& events);
  void check_suspects(double now_s, std::vector<std::string>& events);
  void declare_dead(int id, const std::string& why, std::vector<std::string>& events);
  void learn_heartbeat_timeout(std::vector<std::string>& events);
  double suspect_silence_s() const;
  bool alive(int id) const;

  c10d::Store& store_;
  int world_, founders_;  // before writer_: founders is checked before the roster is written
  RosterWriter writer_;
  std::optional<double> heartbeat_timeout_s_;
  HostClock clock_;
  bool founded_ = false;
  std::map<int, Life> life_;
  std::map<int, Suspect> suspects_;
};

}  // namespace gasloc::comm
