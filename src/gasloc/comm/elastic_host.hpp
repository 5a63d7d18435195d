// The one elastic control plane, of `gasloc launch --elastic` and of `gasloc store --elastic`: a
// library object driven by the caller's clock, so that it is unit-tested on a fake one
// (tests/test_elastic_host.cpp, tests/test_elastic_roster.cpp). It owns
//   - the roster (the one RosterWriter of the job: a process started, ended, healed),
//   - liveness (one HeartbeatWatch: a running rank whose counter stalled for the timeout, and
//     what peers' reports of a failed link to a rank come to),
//   - fencing (a stalled rank, or one a peer reported over a failed link whose counter then stopped,
//     is killed through the ProcessControl hook; its exit then comes back through exited() like
//     any other),
//   - restarts (a failed rank starts again as the next incarnation while --max-restarts lasts),
//   - the floor of the job (no member left, fewer than --min-ranks alive, an error a restart would
//     meet again: the job stops).
// A fixed world (`gasloc launch` without --elastic) is this host with zero restarts and
// min_ranks = world: its first failure stops the job, and a stalled rank is killed, which then
// stops the job the same way (ranks that are not elastic never read the roster it keeps).
// A peer's report alone fences nobody, with a hook or without: anyone who reaches a pair's port
// can make a link fail (Gloo takes the first connection on it, docs/communication.md "Authenticated
// jobs"), so a report is no evidence against the rank. It is fenced only once its counter has also
// been still for kSuspectSilenceS (comm/heartbeat.hpp; at most half the heartbeat timeout); a rank
// that goes on beating was a failed edge. HeartbeatWatch is the one judge of both.
// Without a hook (ranks nobody here can kill or start, as under `gasloc store --elastic`) a rank
// judged dead is only dropped from the roster: a stopped one finds itself out of the next view
// and leaves (fencing without a kill).
//
// Ranks started by hand (Options::by_hand, `gasloc store --elastic`; comm/by_hand.hpp has the
// rank's side): nobody here starts them or sees them exit, so each claims its incarnation and the
// host admits it (a founding member until every founding id has started, a joiner after, refused
// while the id is alive), watches it from its admission, and reads the word of one that ended;
// the heartbeat timeout, when the host was given none, is the one the job's first rank publishes.
//
// The caller does the process plumbing (fork, exec, waitpid, signals) and reports what it saw;
// the host answers with typed events, each with the line the launcher or the store prints.
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

// What the host may do to the processes of the ranks. Both calls act on the newest incarnation.
class ProcessControl {
 public:
  virtual ~ProcessControl() = default;
  // Who kills, for the lines that say so ("gasloc launch").
  virtual std::string name() const = 0;
  // Starts incarnation `inc` of rank `id` (a joiner: it takes a donor's state).
  virtual void start(int id, int64_t inc) = 0;
  // Kills the running process of `id` at once (stopped ones too); `why` names the reason in the
  // rank's summary. Its exit reaches the host through ElasticHost::exited.
  virtual void kill(int id, const std::string& why) = 0;
};

// How a rank's process ended, as its parent saw it.
struct ProcessEnd {
  std::optional<int> exit_status;  // unset: killed by a signal
  std::string status;              // in words ("exit status 1", "signal 9 (Killed)")
  std::string how;                 // the same with the killer's reason when the host had it killed
  bool ok() const { return exit_status == 0; }
};

// A rank's error that a restart would meet again (configuration, data, a full disk): gasloc exits
// 2 for those (apps/gasloc/main.cpp), so the job stops with that error instead of looping.
constexpr int kNoRestartStatus = 2;

struct HostEvent {
  enum class Kind {
    admitted,   // by hand: a process's claim answered: a founding member or a joiner-to-be
    refused,    // by hand: a second process for an id that is alive
    founded,    // by hand: every founding id started: the job runs
    ended,      // by hand: an incarnation said it ended
    note,       // what the host learned (the job's heartbeat timeout; a reported rank beats on)
    joined,     // a first incarnation (or one started early) became a member
    rejoined,   // a restarted incarnation healed and became a member
    fenced,     // judged dead (a stalled heartbeat; reported and silent): killed, or dropped without a hook
    restarted,  // failed; its next incarnation was started
    lost,       // failed with no restart left; the others go on
    left,       // ended after announcing that it leaves (ElasticRoster::announce_leave): not a death
    stop,       // the job cannot go on: the caller stops every rank
  };
  Kind kind;
  int id;
  std::string line;  // what happened, for the log
};

class ElasticHost {
 public:
  struct Options {
    int world = 1;
    int founders = 0;                // ids 0..founders-1 start as members, the rest as joiners (0: all)
    int max_restarts = 0;            // restarts over the whole job
    int min_ranks = 1;               // fewer ranks alive stop the job
    double heartbeat_timeout_s = 0;  // 0: heartbeats are not judged (by hand: until the job's first rank sets one)
    bool by_hand = false;            // ranks started by hand: they claim incarnations (above); no ProcessControl
    // A fixed world of `world` ranks (above): no restart, every rank needed.
    static Options fixed_world(int world, double heartbeat_timeout_s) {
      return {world, world, 0, world, heartbeat_timeout_s, false};
    }
  };
  // Writes the roster with incarnation 0 of every id started (by hand: none started yet; the job's
  // world and founders published for the ranks' claims). `control` may be null (see above), and
  // is by hand. Throws ConfigError on impossible options, before anything is written.
  ElasticHost(c10d::Store& store, Options opts, ProcessControl* control);

  // The process of `id` ended at `now_s` (seconds on the caller's clock).
  std::vector<HostEvent> exited(int id, const ProcessEnd& end, double now_s);
  // Announcements, peers' suspect reports and heartbeats, at `now_s`; call it often (the
  // heartbeats are read five times a second at most).
  std::vector<HostEvent> tend(double now_s);
  // The job is being stopped by its user: no more restarts, and endings are told as asked for.
  void interrupt() { interrupted_ = true; }

  bool stopping() const { return stopped_; }
  int restarts_left() const { return restarts_left_; }
  int64_t incarnation(int id) const { return incarnation_.at(id); }
  bool running(int id) const { return running_.at(id); }
  // By hand: every founding id has started (the job runs).
  bool founded() const { return founded_; }
  // The heartbeat timeout in force (0: none yet).
  double heartbeat_timeout_s() const { return heartbeats_.timeout_s(); }
  // By id: what each of its incarnations did, and whether its newest one exited 0.
  const std::vector<std::string>& story(int id) const { return story_.at(id); }
  bool ended_well(int id) const { return ended_well_.at(id); }
  // Its newest incarnation left the job on purpose (announced, its checkpoint written).
  bool left(int id) const { return left_.at(id); }
  const Roster& roster() const { return writer_.roster(); }

 private:
  void judge_liveness(double now_s, std::vector<HostEvent>& events);
  // By hand: the job's heartbeat timeout, claims, the founding, and announcements of an end.
  void tend_by_hand(double now_s, std::vector<HostEvent>& events);
  void answer_claims(int id, double now_s, std::vector<HostEvent>& events);
  void learn_heartbeat_timeout(std::vector<HostEvent>& events);
  void fence(int id, const std::string& line, const std::string& why, std::vector<HostEvent>& events);
  HostEvent stop(int id, std::string line);

  c10d::Store& store_;
  Options opts_;
  ProcessControl* control_;
  RosterWriter writer_;
  HeartbeatWatch heartbeats_;
  int restarts_left_;
  bool interrupted_ = false, stopped_ = false, founded_ = false;
  double next_heartbeat_check_s_ = 0;
  std::vector<int64_t> incarnation_;  // by id: the newest started (-1: none yet, by hand)
  std::vector<int64_t> claims_seen_;  // by hand, by id: claims answered
  std::vector<bool> running_;         // by id: its newest incarnation's process runs (as far as the host knows)
  std::vector<bool> killing_;         // by id: its kill was asked for and its exit not seen yet (asked once)
  std::vector<std::vector<std::string>> story_;
  std::vector<bool> ended_well_;
  std::vector<bool> left_;
  std::map<int, double> failed_at_s_;  // by id: when the predecessor of its newest incarnation failed
};

}  // namespace gasloc::comm
