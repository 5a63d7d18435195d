// Liveness of process ranks, judged by the store's host (docs/communication.md, "Heartbeats").
// Each rank runs a thread that adds 1 to hb/RANK in the job's store twice a second over a
// connection of its own, so a rank whose main thread waits in a collective still beats, while
// one that is stopped (SIGSTOP), frozen, or cut off from the store does not. The host watches the
// counters on its own clock (no clock is compared across hosts) and acts on a rank whose counter
// has stalled: `gasloc launch` kills it, which turns a hang that would hold its peers for
// cluster.timeout_s into a failure named within the heartbeat timeout.
//
// A paused or slow host must not get healthy ranks killed: a beat that fails is retried on a new
// connection (the rank's store is a ReconnectingStore), and the judges discount a gap in their
// own clock (HostClock): while the host itself did not run, nobody's silence can be seen.
#pragma once
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace gasloc::comm {

std::string heartbeat_key(int rank);

// How often a rank beats.
constexpr double kHeartbeatIntervalS = 0.5;
// The shortest heartbeat timeout: four beats, so that one late beat on a busy host is no death.
constexpr double kMinHeartbeatTimeoutS = 4 * kHeartbeatIntervalS;
// Throws ConfigError naming `what` (a key or a flag) unless `seconds` is a usable heartbeat
// timeout: finite and at least kMinHeartbeatTimeoutS, or 0 where `zero_turns_off`.
void check_heartbeat_timeout(double seconds, const std::string& what, bool zero_turns_off = false);

// A judge's clock without the time the judge itself did not run (SIGSTOP, a frozen VM, a host
// starved for seconds): the judge looks every fraction of a second, so a longer gap between two
// looks is time in which it could not have seen anyone beat, and counts against nobody.
class HostClock {
 public:
  explicit HostClock(double max_look_gap_s = 1.0) : max_gap_s_(max_look_gap_s) {}
  // The seconds to forgive at this look: the part of the gap since the last look beyond the
  // longest gap expected (0 at the first look).
  double forgive(double now_s);

 private:
  double max_gap_s_;
  double last_s_ = -1;
};

class Heartbeat {
 public:
  // Beats for `rank` into `store` (the rank's own connection, best a ReconnectingStore) every
  // interval_s, from now on. Half a second: a hang is named within half a second of the heartbeat
  // timeout, for one small store call per beat. A failed beat is logged once and retried at the
  // next interval; beats that resume are logged with the gap.
  Heartbeat(c10::intrusive_ptr<c10d::Store> store, int rank, double interval_s = kHeartbeatIntervalS);
  // Stops and joins the thread (at most one store call's timeout).
  ~Heartbeat();
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

 private:
  void loop();

  c10::intrusive_ptr<c10d::Store> store_;
  const int rank_;
  const double interval_s_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

// Seconds a counter must be still before a peer's suspect report, or a second process claiming
// the same id, counts the incarnation as gone (six missed beats; at most half the heartbeat
// timeout).
constexpr double kSuspectSilenceS = 3.0;

// The one liveness judge of the job's hosts (comm::ElasticHost, under `gasloc launch` with or
// without --elastic and under `gasloc store --elastic`): which ranks' counters have not moved for
// timeout_s of the host's clock, and what peers' reports of a failed link to a rank come to. A
// rank that never beat is not judged unless watched from a given time (watch_from): it is still
// starting, or it is not a gasloc rank.
class HeartbeatWatch {
 public:
  // timeout_s <= 0: counters are read but nobody is judged stalled (set_timeout may come later).
  HeartbeatWatch(int world, double timeout_s) : world_(world), timeout_s_(timeout_s) {}
  // Reads every counter at `now_s` (seconds of the host's steady clock) and returns the ranks
  // stalled for timeout_s or longer, ascending. A store that fails is skipped this time. A gap
  // in the host's own clock since the last call (HostClock) is added to every rank's allowance.
  std::vector<int> stalled(c10d::Store& store, double now_s);
  // A rank restarted: its counter goes on from the old process's count, and the new process is
  // judged only once it has beaten (a process still starting, or one that cannot reach the
  // store, holds nobody: it is in no view until it announces itself).
  void forget(int rank) {
    seen_.erase(rank);
    restarted_[rank] = -1;
  }
  // A new incarnation of `rank` admitted at `now_s` (started by hand: nobody sees its process
  // exit): judged from now, beaten or not.
  void watch_from(c10d::Store& store, int rank, double now_s);
  void set_timeout(double timeout_s) { timeout_s_ = timeout_s; }
  double timeout_s() const { return timeout_s_; }
  // Seconds at `now_s` since the counter of `rank` last moved, as of the last stalled() call
  // (unset: not judged yet, see above).
  std::optional<double> silence_s(int rank, double now_s) const {
    const auto it = seen_.find(rank);
    if (it == seen_.end()) return std::nullopt;
    return now_s - it->second.since_s;
  }
  // How long a reported rank's counter must be still to count as gone: kSuspectSilenceS, at most
  // half the timeout.
  double suspect_silence_s() const {
    return timeout_s_ > 0 ? std::min(kSuspectSilenceS, timeout_s_ / 2) : kSuspectSilenceS;
  }

  // A peer reported its link to incarnation `inc` of `rank` failed. A report alone evicts nobody.
  void reported(int rank, int64_t inc);
  // What the pending reports came to at `now_s` (after stalled() read the counters): a rank
  // silent for suspect_silence_s() is gone; one whose counter moved twice since the first look
  // after its report beats on (the report was a failed edge). `current(rank, inc)`: whether the report still concerns
  // the rank's newest living incarnation (others are dropped).
  struct Reports {
    std::vector<std::pair<int, double>> gone;  // rank, its silence
    std::vector<int> beating;
  };
  Reports settle_reports(double now_s, const std::function<bool(int, int64_t)>& current);

 private:
  struct Seen {
    int64_t count = 0;
    double since_s = 0;  // when count last changed
  };
  struct Report {
    int64_t inc = 0;
    std::optional<int64_t> count;  // the counter at the first look after the report (unset until then)
  };
  int world_;
  double timeout_s_;
  HostClock clock_;
  std::map<int, Seen> seen_;
  std::map<int, int64_t> restarted_;  // rank -> its count when restarted (-1: not read yet)
  std::map<int, Report> reports_;
};

}  // namespace gasloc::comm
