#include "gasloc/comm/elastic_host.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "gasloc/comm/rendezvous.hpp"
#include "gasloc/comm/roster_host.hpp"
#include "gasloc/core/error.hpp"

namespace gasloc::comm {

namespace {
// Heartbeats are read at most this often: a hang is named within this of its timeout plus a
// beat's interval, for one store call per rank per look.
constexpr double kHeartbeatLookS = 0.2;

ElasticHost::Options checked(ElasticHost::Options o) {
  if (o.world < 1) throw ConfigError(fmt::format("elastic host: a job of {} ranks", o.world));
  if (o.founders < 0 || o.founders > o.world)
    throw ConfigError(fmt::format("elastic host: {} founding ranks of a job of {}", o.founders, o.world));
  if (o.founders == 0) o.founders = o.world;
  if (o.max_restarts < 0) throw ConfigError(fmt::format("elastic host: --max-restarts {} must be >= 0", o.max_restarts));
  if (o.min_ranks < 1 || o.min_ranks > o.world)
    throw ConfigError(fmt::format("elastic host: --min-ranks {} is outside 1..{}", o.min_ranks, o.world));
  return o;
}
}  // namespace

ElasticHost::ElasticHost(c10d::Store& store, Options opts, ProcessControl* control)
    : store_(store),
      opts_(checked(opts)),
      control_(control),
      writer_(store, opts_.world),
      heartbeats_(opts_.world, opts_.heartbeat_timeout_s),
      restarts_left_(opts_.max_restarts),
      incarnation_(opts_.world, 0),
      running_(opts_.world, true),
      killing_(opts_.world, false),
      story_(opts_.world),
      ended_well_(opts_.world, false) {
  for (int id = 0; id < opts_.world; ++id) writer_.started(id, 0, /*member=*/id < opts_.founders);
}

HostEvent ElasticHost::stop(int id, std::string line) {
  stopped_ = true;
  return {HostEvent::Kind::stop, id, std::move(line)};
}

std::vector<HostEvent> ElasticHost::exited(int id, const ProcessEnd& end, double now_s) {
  const int64_t inc = incarnation_.at(id);
  // It leaves the roster at once: its peers stop waiting for it.
  running_[id] = false;
  killing_[id] = false;
  writer_.exited(id, inc);
  ended_well_[id] = end.ok();
  auto tell = [&](const std::string& what) { story_[id].push_back(fmt::format("incarnation {} {}", inc, what)); };
  if (end.ok()) {
    tell(interrupted_ ? "stopped as asked" : "finished");
    return {};
  }
  if (interrupted_ && end.exit_status == 130) {
    tell("stopped as asked, its checkpoint committed");
    return {};
  }
  if (interrupted_ || stopped_) {
    tell("ended with " + end.how + " while the job stopped");
    return {};
  }
  publish_failure(store_, id, {id, fmt::format("rank {} exited with {} (seen by gasloc launch)", id, end.status)});
  if (end.exit_status == kNoRestartStatus) {
    tell("failed with exit status 2 (not restarted)");
    return {stop(id, fmt::format("rank {} (incarnation {}) failed with exit status 2: its error (above) is about the "
                                 "job's configuration, data or disk, which a restart would meet again; stopping the job",
                                 id, inc))};
  }
  // A restarted rank heals from a member's state: with none left, nobody can give it one.
  if (writer_.count(RankState::member) == 0) {
    tell("failed with " + end.how);
    return {stop(id, fmt::format("rank {} (incarnation {}) failed with {}, and no member of the job is left to give a "
                                 "restarted rank its state; stopping the job (resume it from its checkpoints with "
                                 "gasloc launch --elastic ... -- gasloc train --resume RUN)",
                                 id, inc, end.how))};
  }
  if (restarts_left_ > 0 && control_ != nullptr) {
    --restarts_left_;
    tell(fmt::format("failed with {}; restarted", end.how));
    HostEvent restarted{HostEvent::Kind::restarted, id,
                        fmt::format("rank {} (incarnation {}) failed with {} after {:.1f} s; the others go on, and it "
                                    "restarts as incarnation {} ({} restart(s) left)",
                                    id, inc, end.how, now_s, inc + 1, restarts_left_)};
    incarnation_[id] = inc + 1;
    failed_at_s_[id] = now_s;
    heartbeats_.forget(id);
    writer_.started(id, inc + 1, /*member=*/false);
    running_[id] = true;
    control_->start(id, inc + 1);
    return {restarted};
  }
  const auto alive = static_cast<int>(std::count(running_.begin(), running_.end(), true));
  tell(fmt::format("failed with {}; no restart left", end.how));
  std::vector<HostEvent> events{{HostEvent::Kind::lost, id,
                                 fmt::format("rank {} (incarnation {}) failed with {} after {:.1f} s and no restart is "
                                             "left (--max-restarts); {} rank(s) go on without it",
                                             id, inc, end.how, now_s, alive)}};
  if (alive >= opts_.min_ranks) return events;
  std::vector<int> missing;
  for (int j = 0; j < opts_.world; ++j)
    if (!running_[j]) missing.push_back(j);
  events.push_back(stop(id, fmt::format("only {} rank(s) alive, fewer than --min-ranks {}: no view can form without "
                                        "rank(s) {}; stopping the job",
                                        alive, opts_.min_ranks, fmt::join(missing, ", "))));
  return events;
}

std::vector<HostEvent> ElasticHost::tend(double now_s) {
  std::vector<HostEvent> events;
  for (int id : writer_.poll()) {
    const int64_t inc = incarnation_[id];
    const auto failed = failed_at_s_.find(id);
    // Incarnation 0 is a first arrival (a founder late to the first view, or a joiner declared at
    // the start), not a return.
    if (failed == failed_at_s_.end() || inc == 0)
      events.push_back({HostEvent::Kind::joined, id,
                        fmt::format("rank {} (incarnation {}) joined {:.1f} s into the job", id, inc, now_s)});
    else
      events.push_back({HostEvent::Kind::rejoined, id,
                        fmt::format("rank {} (incarnation {}) rejoined {:.1f} s after it failed", id, inc,
                                    now_s - failed->second)});
  }
  // A peer's link to it failed while the roster listed it alive: fenced now, so that no view
  // waits for a rank its peers cannot reach (it restarts and rejoins through a donor).
  for (const auto& [id, inc] : writer_.take_suspects()) {
    if (incarnation_[id] != inc || !running_[id]) continue;
    if (control_ == nullptr) {
      suspects_.try_emplace(id, inc, now_s);
      continue;
    }
    fence(id, fmt::format("a peer reported its link to rank {} broken; killing rank {} (it restarts)", id, id),
          "a peer reported its link broken", events);
  }
  judge_heartbeats(now_s, events);
  check_suspects(now_s, events);
  return events;
}

void ElasticHost::check_suspects(double now_s, std::vector<HostEvent>& events) {
  const double still_s = std::min(kSuspectSilenceS, opts_.heartbeat_timeout_s > 0 ? opts_.heartbeat_timeout_s / 2 : kSuspectSilenceS);
  for (auto it = suspects_.begin(); it != suspects_.end();) {
    const auto [id, report] = *it;
    const auto silence = heartbeats_.silence_s(id, now_s);
    if (!running_[id] || incarnation_[id] != report.first) {
      it = suspects_.erase(it);
    } else if (silence && *silence >= still_s) {
      it = suspects_.erase(it);
      fence(id, "", fmt::format("reported by a peer whose link to it failed, and silent for {:.1f} s", *silence), events);
    } else if (now_s - report.second >= still_s) {
      it = suspects_.erase(it);  // it beat on after the report: a failed edge, not a dead rank
    } else {
      ++it;
    }
  }
}

// A running rank whose heartbeat stalled is stopped, frozen or cut off: its peers would wait for
// it until cluster.timeout_s. Fencing it makes it a failure like any other, named now. Not while
// the job stops (its ranks are busy ending).
void ElasticHost::judge_heartbeats(double now_s, std::vector<HostEvent>& events) {
  if (opts_.heartbeat_timeout_s <= 0 || interrupted_ || stopped_ || now_s < next_heartbeat_check_s_) return;
  next_heartbeat_check_s_ = now_s + kHeartbeatLookS;
  for (int id : heartbeats_.stalled(store_, now_s)) {
    if (!running_[id]) continue;
    const std::string what = fmt::format("rank {} sent no heartbeat for {:g} s (stopped, frozen or cut off from the "
                                         "store); {}",
                                         id, opts_.heartbeat_timeout_s,
                                         control_ ? control_->name() + " killed it" : "dropped from the roster");
    publish_failure(store_, id, {id, what});
    fence(id, what, fmt::format("no heartbeat for {:g} s", opts_.heartbeat_timeout_s), events);
  }
}

void ElasticHost::fence(int id, const std::string& line, const std::string& why, std::vector<HostEvent>& events) {
  if (control_ != nullptr) {
    // Its exit comes back through exited(), which restarts it.
    if (killing_[id]) return;
    killing_[id] = true;
    control_->kill(id, why);
    events.push_back({HostEvent::Kind::fenced, id, line});
    return;
  }
  // Nobody here can kill it: out of the roster, it finds itself out of the next view and leaves.
  const int64_t inc = incarnation_[id];
  running_[id] = false;
  writer_.exited(id, inc);
  story_[id].push_back(fmt::format("incarnation {} declared dead: {}", inc, why));
  events.push_back({HostEvent::Kind::fenced, id,
                    fmt::format("rank {} (incarnation {}) declared dead ({}): dropped from the roster; the others go "
                                "on without it",
                                id, inc, why)});
}

}  // namespace gasloc::comm
