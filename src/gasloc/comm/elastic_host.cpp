#include "gasloc/comm/elastic_host.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "gasloc/comm/rendezvous.hpp"
#include "gasloc/comm/by_hand.hpp"
#include "gasloc/comm/store.hpp"
#include "gasloc/core/error.hpp"

namespace gasloc::comm {

namespace {
// Heartbeats are read at most this often: a hang is named within this of its timeout plus a
// beat's interval, for one store call per rank per look.
constexpr double kHeartbeatLookS = 0.2;

ElasticHost::Options checked(ElasticHost::Options o, const ProcessControl* control) {
  if (o.world < 1) throw ConfigError(fmt::format("elastic host: a job of {} ranks", o.world));
  if (o.by_hand && o.founders > o.world)
    throw ConfigError(fmt::format("store: --founders {} is more than the job's {} ranks (-n)", o.founders, o.world),
                      "the founders are ranks 0..F-1 of the -n; the others join the running job");
  if (o.founders < 0 || o.founders > o.world)
    throw ConfigError(fmt::format("elastic host: {} founding ranks of a job of {}", o.founders, o.world));
  if (o.by_hand && control != nullptr)
    throw Error("elastic host: ranks started by hand have no process control", "internal: pass a null control");
  if (o.founders == 0) o.founders = o.world;
  if (o.max_restarts < 0) throw ConfigError(fmt::format("elastic host: --max-restarts {} must be >= 0", o.max_restarts));
  if (o.min_ranks < 1 || o.min_ranks > o.world)
    throw ConfigError(fmt::format("elastic host: --min-ranks {} is outside 1..{}", o.min_ranks, o.world));
  return o;
}

// The step after which incarnation `inc` of `id` announced that it leaves the job (el/left/ID).
std::optional<int64_t> announced_leave(c10d::Store& store, int id, int64_t inc) {
  const std::string key = elastic_keys::left(id);
  if (!store.check({key})) return std::nullopt;
  const std::string text = to_text(store.get(key));
  const auto colon = text.find(':');
  try {
    if (colon != std::string::npos && std::stoll(text.substr(0, colon)) == inc) return std::stoll(text.substr(colon + 1));
  } catch (const std::exception&) {
  }
  return std::nullopt;
}
}  // namespace

ElasticHost::ElasticHost(c10d::Store& store, Options opts, ProcessControl* control)
    : store_(store),
      opts_(checked(opts, control)),
      control_(control),
      writer_(store, opts_.world),
      heartbeats_(opts_.world, opts_.heartbeat_timeout_s),
      restarts_left_(opts_.max_restarts),
      incarnation_(opts_.world, opts_.by_hand ? -1 : 0),
      claims_seen_(opts_.world, 0),
      running_(opts_.world, !opts_.by_hand),
      killing_(opts_.world, false),
      story_(opts_.world),
      ended_well_(opts_.world, false),
      left_(opts_.world, false) {
  if (opts_.by_hand) {
    store_.set(elastic_keys::founders(), to_bytes(std::to_string(opts_.founders)));
    store_.set(elastic_keys::world(), to_bytes(std::to_string(opts_.world)));
    return;
  }
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
  // It said it leaves (its checkpoint written): not a death, whatever its exit status, and not restarted.
  if (const auto step = announced_leave(store_, id, inc)) {
    left_[id] = true;
    tell(fmt::format("left the job after step {} ({}; its checkpoint written; not restarted)", *step, end.status));
    if (interrupted_ || stopped_) return {};
    return {{HostEvent::Kind::left, id,
             fmt::format("rank {} (incarnation {}) left the job after step {} with its checkpoint (it announced it: not "
                         "a death, and not restarted); the others go on",
                         id, inc, *step)}};
  }
  if (end.ok()) {
    tell(interrupted_ ? "stopped as asked" : "finished");
    return {};
  }
  if (interrupted_ && end.exit_status == 130) {
    tell("stopped as asked, its checkpoint committed");
    return {};
  }
  if (interrupted_) {
    tell("ended with " + end.how + " while the job stopped");
    return {};
  }
  // Its own record, written before it exited, wins over this one.
  publish_failure(store_, id, {id, fmt::format("rank {} exited with {} (seen by gasloc launch)", id, end.status)});
  if (stopped_) {
    tell("ended with " + end.how + " while the job stopped");
    return {};
  }
  // A fixed world (no restart, every rank needed): any failure ends the job.
  if (restarts_left_ == 0 && opts_.min_ranks == opts_.world) {
    tell("failed with " + end.how);
    return {stop(id, fmt::format("rank {} failed with {} after {:.1f} s; stopping the other ranks", id, end.status, now_s))};
  }
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
  if (opts_.by_hand) tend_by_hand(now_s, events);
  for (int id : writer_.poll()) {
    const int64_t inc = incarnation_[id];
    const auto failed = failed_at_s_.find(id);
    // Incarnation 0 is a first arrival (a founder late to the first view, or a joiner declared at
    // the start), not a return.
    if (inc == 0)
      events.push_back({HostEvent::Kind::joined, id,
                        fmt::format("rank {} (incarnation {}) joined {:.1f} s into the job", id, inc, now_s)});
    else
      events.push_back({HostEvent::Kind::rejoined, id,
                        failed == failed_at_s_.end()
                            ? fmt::format("rank {} (incarnation {}) rejoined: it holds its donor's state and mixes", id, inc)
                            : fmt::format("rank {} (incarnation {}) rejoined {:.1f} s after it failed", id, inc,
                                          now_s - failed->second)});
  }
  // A peer's link to it failed while the roster listed it alive. A report is no evidence: anyone
  // who reaches a pair's port can make a link fail (Gloo takes the first connection on it), so
  // the report only makes the judge look at the rank's heartbeat sooner (judge_liveness): a rank
  // that beats on stays (a failed edge), one whose counter stopped is fenced.
  for (const auto& [id, inc] : writer_.take_suspects())
    if (incarnation_[id] == inc && running_[id]) heartbeats_.reported(id, inc);
  if (!opts_.by_hand) judge_liveness(now_s, events);
  return events;
}

// First the liveness (the silences a second claim of a living id is judged by are then fresh,
// and the host's own gaps forgiven), after the word of those that ended; then the claims.
void ElasticHost::tend_by_hand(double now_s, std::vector<HostEvent>& events) {
  learn_heartbeat_timeout(events);
  for (int id = 0; id < opts_.world; ++id) {
    if (!running_[id]) continue;
    const int64_t inc = incarnation_[id];
    if (store_.check({elastic_keys::out(id)}) && to_text(store_.get(elastic_keys::out(id))) == std::to_string(inc)) {
      running_[id] = false;
      writer_.exited(id, inc);
      events.push_back({HostEvent::Kind::ended, id, fmt::format("rank {} (incarnation {}) ended", id, inc)});
    }
  }
  judge_liveness(now_s, events);
  for (int id = 0; id < opts_.world; ++id) answer_claims(id, now_s, events);
  if (founded_) return;
  const auto members = writer_.roster().with(RankState::member);
  if (std::count_if(members.begin(), members.end(), [&](int id) { return id < opts_.founders; }) < opts_.founders) return;
  founded_ = true;
  store_.set(elastic_keys::founded(), to_bytes("1"));
  const int n = opts_.world, f = opts_.founders;
  events.push_back({HostEvent::Kind::founded, -1,
                    f == n ? fmt::format("all {} ranks started: the job runs", n)
                           : fmt::format("founding ranks 0..{} started: the job runs (ranks {}..{} join it when started)",
                                         f - 1, f, n - 1)});
}

void ElasticHost::answer_claims(int id, double now_s, std::vector<HostEvent>& events) {
  if (id >= opts_.founders && !founded_) return;  // a joiner is answered once the job runs
  const int64_t claims = store_.add(elastic_keys::claim(id), 0);
  for (int64_t& inc = claims_seen_[id]; inc < claims; ++inc) {
    const double silent = heartbeats_.silence_s(id, now_s).value_or(0);
    if (running_[id] && silent < heartbeats_.suspect_silence_s()) {
      const std::string why = fmt::format("rank {} is already alive (incarnation {}, its heartbeat {:.1f} s ago)", id,
                                          incarnation_[id], silent);
      store_.set(elastic_keys::admit(id, inc), to_bytes(admission::kRefused + why));
      events.push_back({HostEvent::Kind::refused, id, fmt::format("refused a second process for rank {}: {}", id, why)});
      continue;
    }
    if (running_[id]) fence(id, "", fmt::format("silent for {:.1f} s and replaced by a new process", silent), events);
    const bool member = !founded_ && id < opts_.founders;
    writer_.started(id, inc, member);
    incarnation_[id] = inc;
    running_[id] = true;
    heartbeats_.watch_from(store_, id, now_s);
    store_.set(elastic_keys::admit(id, inc), to_bytes(member ? admission::kMember : admission::kJoiner));
    events.push_back({HostEvent::Kind::admitted, id,
                      member ? fmt::format("rank {} (incarnation {}) started", id, inc)
                             : fmt::format("rank {} (incarnation {}) started: it joins the running job", id, inc)});
  }
}

void ElasticHost::learn_heartbeat_timeout(std::vector<HostEvent>& events) {
  if (heartbeats_.timeout_s() > 0 || !store_.check({elastic_keys::heartbeat_timeout()})) return;
  const std::string text = to_text(store_.get(elastic_keys::heartbeat_timeout()));
  double s = 0;
  try {
    s = std::stod(text);
  } catch (const std::exception&) {
    throw CommError(fmt::format("the job's store holds '{}' as its heartbeat timeout", text),
                    "another program or gasloc version wrote the job's store");
  }
  heartbeats_.set_timeout(s);
  events.push_back({HostEvent::Kind::note, -1, fmt::format("heartbeat timeout {:g} s, the job's cluster.heartbeat_timeout_s", s)});
}

// A running rank whose heartbeat stalled is stopped, frozen or cut off: its peers would wait for
// it until cluster.timeout_s. Fencing it makes it a failure like any other, named now. A rank a
// peer reported goes once its counter is still, and stays if it beats on (a failed edge, not a
// dead rank). Not while the job stops (its ranks are busy ending).
void ElasticHost::judge_liveness(double now_s, std::vector<HostEvent>& events) {
  // The launcher tends often and reads at most every kHeartbeatLookS; `gasloc store` looks at
  // every tend (a tenth of a second), and its judge must not miss the one look in a while.
  if (interrupted_ || stopped_ || (!opts_.by_hand && now_s < next_heartbeat_check_s_)) return;
  next_heartbeat_check_s_ = now_s + kHeartbeatLookS;
  const std::vector<int> stalled = heartbeats_.stalled(store_, now_s);
  const auto reports = heartbeats_.settle_reports(now_s, [&](int id, int64_t inc) { return running_[id] && incarnation_[id] == inc; });
  for (const auto& [id, silence] : reports.gone) {
    const std::string why = fmt::format("reported by a peer whose link to it failed, and silent for {:.1f} s", silence);
    fence(id, control_ ? fmt::format("rank {} was {}; {} killed it", id, why, control_->name()) : "", why, events);
  }
  for (int id : reports.beating)
    events.push_back({HostEvent::Kind::note, id,
                      fmt::format("a peer reported its link to rank {} broken, but rank {} beats: it stays (a failed edge)",
                                  id, id)});
  for (int id : stalled) {
    if (!running_[id]) continue;
    const std::string what = fmt::format("rank {} sent no heartbeat for {:g} s (stopped, frozen or cut off from the "
                                         "store); {}",
                                         id, heartbeats_.timeout_s(),
                                         control_ ? control_->name() + " killed it" : "dropped from the roster");
    // Ranks by hand find their own death in the next view (comm::ElasticGloo), on every host alike.
    if (!opts_.by_hand) publish_failure(store_, id, {id, what});
    fence(id, what,
          opts_.by_hand ? fmt::format("sent no heartbeat for {:g} s (dead, stopped, frozen or cut off from the store)",
                                      heartbeats_.timeout_s())
                        : fmt::format("no heartbeat for {:g} s", heartbeats_.timeout_s()),
          events);
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
  if (opts_.by_hand)  // what the person who started it can do
    events.push_back({HostEvent::Kind::fenced, id,
                      fmt::format("rank {} (incarnation {}) {}: declared dead; the others go on without it (started "
                                  "again, it rejoins; if it was only stopped, it leaves by itself when it resumes)",
                                  id, inc, why)});
  else
    events.push_back({HostEvent::Kind::fenced, id,
                      fmt::format("rank {} (incarnation {}) declared dead ({}): dropped from the roster; the others "
                                  "go on without it",
                                  id, inc, why)});
}

}  // namespace gasloc::comm
