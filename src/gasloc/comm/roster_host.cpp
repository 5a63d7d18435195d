#include "gasloc/comm/roster_host.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <thread>

#include "gasloc/comm/heartbeat.hpp"
#include "gasloc/comm/store.hpp"
#include "gasloc/core/error.hpp"

namespace gasloc::comm {

namespace elastic_keys {
std::string world() { return "el/world"; }
std::string claim(int id) { return fmt::format("el/inc/{}", id); }
std::string admit(int id, int64_t inc) { return fmt::format("el/admit/{}.{}", id, inc); }
std::string founded() { return "el/founded"; }
std::string out(int id) { return fmt::format("el/out/{}", id); }
std::string founders() { return "el/founders"; }
std::string heartbeat_timeout() { return "el/heartbeat_timeout"; }
}  // namespace elastic_keys

namespace {

constexpr const char* kMember = "member";
constexpr const char* kJoiner = "joiner";
constexpr const char* kRefused = "refused:";

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Polls `key` until it exists or `timeout_s` passed; false on timeout.
bool await_key(c10d::Store& store, const std::string& key, double timeout_s) {
  const double deadline = now_s() + timeout_s;
  while (!store.check({key})) {
    if (now_s() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

int parse_count(const std::string& text, const std::string& what) {
  try {
    return std::stoi(text);
  } catch (const std::exception&) {
    throw CommError(fmt::format("the job's store holds '{}' as its {}", text, what),
                    "another program or gasloc version wrote the job's store");
  }
}

// The store's --founders; without the key, every id founds the job.
int founders_of(c10d::Store& store) {
  if (!store.check({elastic_keys::founders()})) return std::numeric_limits<int>::max();
  return parse_count(to_text(store.get(elastic_keys::founders())), "number of founding ranks");
}

std::string founders_not_started(c10d::Store& store) {
  const int founders = founders_of(store);
  std::vector<int> ids;
  for (const auto& e : Roster::decode(to_text(store.get(elastic_keys::roster()))).entries)
    if (e.id < founders && e.state != RankState::member) ids.push_back(e.id);
  return fmt::format("{}", fmt::join(ids, ", "));
}

}  // namespace

Admission admit_by_hand(c10d::Store& store, int id, int world, double timeout_s) {
  if (!store.check({elastic_keys::world()}))
    throw CommError("the job's store keeps no roster of elastic ranks",
                    "start it with `gasloc store --elastic -n N --job-id JOB` (or start the ranks with gasloc launch "
                    "--elastic, which keeps the roster itself)");
  const int host_world = parse_count(to_text(store.get(elastic_keys::world())), "number of ranks");
  if (world != host_world)
    throw ConfigError(fmt::format("WORLD_SIZE is {} here but the job's gasloc store serves {} ranks (-n {})", world,
                                  host_world, host_world),
                      fmt::format("start every rank with WORLD_SIZE={}", host_world));
  if (id < 0 || id >= world)
    throw ConfigError(fmt::format("RANK {} is outside 0..{} of the job's gasloc store", id, world - 1),
                      "a worker added to a running job takes the id of one that left, or one of the ids the store "
                      "keeps for joiners (gasloc store --elastic -n N --founders F: ids F..N-1)");
  const int64_t inc = store.add(elastic_keys::claim(id), 1) - 1;
  const std::string key = elastic_keys::admit(id, inc);
  if (!await_key(store, key, timeout_s))
    throw CommError(fmt::format("rank {}: the gasloc store did not answer its start (incarnation {}) within {} s", id, inc,
                                timeout_s),
                    "is the store started with --elastic, and still running?");
  const std::string answer = to_text(store.get(key));
  if (answer.rfind(kRefused, 0) == 0)
    throw ConfigError(fmt::format("rank {} cannot start: {}", id, answer.substr(std::string(kRefused).size())),
                      "stop the running process of this rank first, or start this one with another RANK");
  return {inc, answer == kMember};
}

void await_founded(c10d::Store& store, int id, double timeout_s) {
  if (!await_key(store, elastic_keys::founded(), timeout_s))
    throw CommError(fmt::format("rank {}: the job's other founding ranks did not all start within {} s (not started: {})",
                                id, timeout_s, founders_not_started(store)),
                    "start every founding rank of the job (0..WORLD_SIZE-1, or 0..F-1 under --founders F) at its "
                    "gasloc store");
}

bool founds_the_job(c10d::Store& store, int id) {
  return !store.check({elastic_keys::founded()}) && id < founders_of(store);
}

void announce_out(c10d::Store& store, int id, int64_t inc) noexcept {
  try {
    store.set(elastic_keys::out(id), to_bytes(std::to_string(inc)));
  } catch (const std::exception& e) {
    spdlog::warn("rank {}: could not say in the job's store that incarnation {} ended ({}): the store's host sees it "
                 "leave at the heartbeat timeout instead",
                 id, inc, e.what());
  }
}

namespace {
int checked_founders(int founders, int world) {
  if (founders > world)
    throw ConfigError(fmt::format("store: --founders {} is more than the job's {} ranks (-n)", founders, world),
                      "the founders are ranks 0..F-1 of the -n; the others join the running job");
  return founders > 0 ? founders : world;
}
}  // namespace

RosterHost::RosterHost(c10d::Store& store, int world, std::optional<double> heartbeat_timeout_s, int founders)
    : store_(store),
      world_(world),
      founders_(checked_founders(founders, world)),
      writer_(store, world),
      heartbeat_timeout_s_(heartbeat_timeout_s) {
  store_.set(elastic_keys::founders(), to_bytes(std::to_string(founders_)));
  store_.set(elastic_keys::world(), to_bytes(std::to_string(world)));
}

bool RosterHost::alive(int id) const {
  const RosterEntry* e = writer_.roster().find(id);
  return e && e->incarnation >= 0 && e->state != RankState::dead;
}

double RosterHost::suspect_silence_s() const {
  return std::min(kSuspectSilenceS, heartbeat_timeout_s_.value_or(2 * kSuspectSilenceS) / 2);
}

void RosterHost::learn_heartbeat_timeout(std::vector<std::string>& events) {
  if (heartbeat_timeout_s_ || !store_.check({elastic_keys::heartbeat_timeout()})) return;
  const std::string text = to_text(store_.get(elastic_keys::heartbeat_timeout()));
  double s = 0;
  try {
    s = std::stod(text);
  } catch (const std::exception&) {
    throw CommError(fmt::format("the job's store holds '{}' as its heartbeat timeout", text),
                    "another program or gasloc version wrote the job's store");
  }
  heartbeat_timeout_s_ = s;
  events.push_back(fmt::format("heartbeat timeout {:g} s, the job's cluster.heartbeat_timeout_s", s));
}

std::vector<std::string> RosterHost::tend(double now_s) {
  std::vector<std::string> events;
  // Time in which this host did not run counts against no rank's heartbeat.
  const double forgiven = clock_.forgive(now_s);
  for (auto& [id, l] : life_) l.since_s += forgiven;
  learn_heartbeat_timeout(events);
  for (int id = 0; id < world_; ++id) answer_claims(id, now_s, events);
  if (!founded_) {
    const auto members = writer_.roster().with(RankState::member);
    if (std::count_if(members.begin(), members.end(), [&](int id) { return id < founders_; }) == founders_) {
      founded_ = true;
      store_.set(elastic_keys::founded(), to_bytes("1"));
      events.push_back(founders_ == world_ ? fmt::format("all {} ranks started: the job runs", world_)
                                           : fmt::format("founding ranks 0..{} started: the job runs (ranks {}..{} "
                                                         "join it when started)",
                                                         founders_ - 1, founders_, world_ - 1));
    }
  }
  for (int id : writer_.poll()) {
    // Incarnation 0 admitted as a joiner is a first arrival (room declared at the start), not a return.
    const int64_t inc = writer_.roster().find(id)->incarnation;
    events.push_back(fmt::format("rank {} (incarnation {}) {}: it holds its donor's state and mixes", id, inc,
                                 inc == 0 ? "joined" : "rejoined"));
  }
  for (int id = 0; id < world_; ++id) watch_life(id, now_s, events);
  for (const auto& [id, inc] : writer_.take_suspects())
    if (alive(id) && writer_.roster().find(id)->incarnation == inc && !suspects_.count(id))
      suspects_[id] = {inc, life_[id].beats};
  check_suspects(now_s, events);
  return events;
}

void RosterHost::answer_claims(int id, double now_s, std::vector<std::string>& events) {
  if (id >= founders_ && !founded_) return;  // a joiner is answered once the job runs
  Life& l = life_[id];
  const int64_t claims = store_.add(elastic_keys::claim(id), 0);
  for (; l.claims_seen < claims; ++l.claims_seen) {
    const int64_t inc = l.claims_seen;
    const RosterEntry& old = *writer_.roster().find(id);
    const double silent = now_s - l.since_s;
    if (alive(id) && silent < suspect_silence_s()) {
      const std::string why = fmt::format("rank {} is already alive (incarnation {}, its heartbeat {:.1f} s ago)", id,
                                          old.incarnation, silent);
      store_.set(elastic_keys::admit(id, inc), to_bytes(kRefused + why));
      events.push_back(fmt::format("refused a second process for rank {}: {}", id, why));
      continue;
    }
    if (alive(id))
      declare_dead(id, fmt::format("silent for {:.1f} s and replaced by a new process", silent), events);
    const bool member = !founded_ && id < founders_;
    writer_.started(id, inc, member);
    suspects_.erase(id);
    l.beats = store_.add(heartbeat_key(id), 0);
    l.since_s = now_s;
    store_.set(elastic_keys::admit(id, inc), to_bytes(member ? kMember : kJoiner));
    events.push_back(member ? fmt::format("rank {} (incarnation {}) started", id, inc)
                            : fmt::format("rank {} (incarnation {}) started: it joins the running job", id, inc));
  }
}

void RosterHost::watch_life(int id, double now_s, std::vector<std::string>& events) {
  if (!alive(id)) return;
  const int64_t inc = writer_.roster().find(id)->incarnation;
  if (store_.check({elastic_keys::out(id)}) && to_text(store_.get(elastic_keys::out(id))) == std::to_string(inc)) {
    writer_.exited(id, inc);
    events.push_back(fmt::format("rank {} (incarnation {}) ended", id, inc));
    return;
  }
  Life& l = life_[id];
  const int64_t beats = store_.add(heartbeat_key(id), 0);
  if (beats != l.beats) {
    l.beats = beats;
    l.since_s = now_s;
  } else if (heartbeat_timeout_s_ && now_s - l.since_s >= *heartbeat_timeout_s_) {
    declare_dead(id, fmt::format("sent no heartbeat for {:g} s (dead, stopped, frozen or cut off from the store)",
                                 *heartbeat_timeout_s_),
                 events);
  }
}

void RosterHost::check_suspects(double now_s, std::vector<std::string>& events) {
  for (auto it = suspects_.begin(); it != suspects_.end();) {
    const int id = it->first;
    const Life& l = life_[id];
    if (!alive(id) || writer_.roster().find(id)->incarnation != it->second.inc) {
      it = suspects_.erase(it);
    } else if (now_s - l.since_s >= suspect_silence_s()) {
      it = suspects_.erase(it);
      declare_dead(id, fmt::format("reported by a peer whose link to it failed, and silent for {:.1f} s", now_s - l.since_s),
                   events);
    } else if (l.beats >= it->second.beats + 2) {
      events.push_back(fmt::format("a peer reported its link to rank {} broken, but rank {} beats: it stays (a failed edge)",
                                   id, id));
      it = suspects_.erase(it);
    } else {
      ++it;
    }
  }
}

void RosterHost::declare_dead(int id, const std::string& why, std::vector<std::string>& events) {
  const int64_t inc = writer_.roster().find(id)->incarnation;
  writer_.exited(id, inc);
  events.push_back(fmt::format("rank {} (incarnation {}) {}: declared dead; the others go on without it (started "
                               "again, it rejoins; if it was only stopped, it leaves by itself when it resumes)",
                               id, inc, why));
}

}  // namespace gasloc::comm
