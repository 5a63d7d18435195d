#include "gasloc/comm/elastic_roster.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <sstream>

#include "gasloc/comm/store.hpp"
#include "gasloc/core/error.hpp"

namespace gasloc::comm {

namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string item;
  std::istringstream in(s);
  while (std::getline(in, item, sep))
    if (!item.empty()) out.push_back(item);
  return out;
}

int64_t parse_int(const std::string& s, const std::string& what) {
  try {
    size_t used = 0;
    const int64_t v = std::stoll(s, &used);
    if (used == s.size()) return v;
  } catch (const std::exception&) {
  }
  throw CommError(fmt::format("elastic store: '{}' in {} is not a number", s, what),
                  "another program or gasloc version wrote the job's store");
}

std::string ids_text(const std::vector<int>& ids, const std::map<int, int64_t>& inc) {
  std::string out;
  for (int id : ids) out += fmt::format("{}{}:{}", out.empty() ? "" : ",", id, inc.at(id));
  return out;
}
}  // namespace

namespace elastic_keys {
std::string roster() { return "el/roster"; }
std::string view(int64_t round, int attempt) { return fmt::format("el/view/{}.{}", round, attempt); }
std::string latest() { return "el/latest"; }
std::string up(int id) { return fmt::format("el/up/{}", id); }
std::string in(int id) { return fmt::format("el/in/{}", id); }
std::string suspect(int id) { return fmt::format("el/suspect/{}", id); }
std::string stop() { return "el/stop"; }
std::string config() { return "el/config"; }
std::string at(int id) { return fmt::format("el/at/{}", id); }
std::string resume_of(int id) { return fmt::format("el/resume/{}", id); }
std::string resume() { return "el/resume"; }
std::string behind(int id) { return fmt::format("el/behind/{}", id); }
std::string any_behind() { return "el/behind"; }
std::string files() { return "el/files"; }
std::string files_ready() { return "el/files_ready"; }
std::string finished() { return "el/finished"; }
std::string left(int id) { return fmt::format("el/left/{}", id); }
std::string all_reduce(int64_t call_id) { return fmt::format("el/ar/{}", call_id); }
std::string all_reduce_ok(int64_t call_id, int id) { return fmt::format("el/ar/{}/ok/{}", call_id, id); }
}  // namespace elastic_keys

std::string Roster::encode() const {
  std::string out;
  for (const auto& e : entries) out += fmt::format("{}:{}:{};", e.id, e.incarnation, static_cast<char>(e.state));
  return out;
}

Roster Roster::decode(const std::string& text) {
  Roster r;
  for (const auto& item : split(text, ';')) {
    const auto f = split(item, ':');
    if (f.size() != 3 || f[2].size() != 1 || std::string("smjd").find(f[2][0]) == std::string::npos)
      throw CommError(fmt::format("elastic store: roster entry '{}' is malformed", item),
                      "another program or gasloc version wrote the job's store");
    r.entries.push_back({static_cast<int>(parse_int(f[0], "the roster")), parse_int(f[1], "the roster"),
                         static_cast<RankState>(f[2][0])});
  }
  return r;
}

const RosterEntry* Roster::find(int id) const {
  for (const auto& e : entries)
    if (e.id == id) return &e;
  return nullptr;
}

std::vector<int> Roster::with(RankState s) const {
  std::vector<int> out;
  for (const auto& e : entries)
    if (e.state == s) out.push_back(e.id);
  return out;
}

std::string View::encode() const {
  return "m=" + ids_text(members, incarnation) + "|j=" + ids_text(joining, incarnation);
}

View View::decode(int64_t round, int attempt, const std::string& text) {
  View v;
  v.round = round;
  v.attempt = attempt;
  for (const auto& part : split(text, '|')) {
    if (part.size() < 2 || part[1] != '=' || (part[0] != 'm' && part[0] != 'j'))
      throw CommError(fmt::format("elastic store: view of round {} is malformed: '{}'", round, text));
    auto& ids = part[0] == 'm' ? v.members : v.joining;
    for (const auto& item : split(part.substr(2), ',')) {
      const auto f = split(item, ':');
      if (f.size() != 2) throw CommError(fmt::format("elastic store: view of round {} is malformed: '{}'", round, text));
      const int id = static_cast<int>(parse_int(f[0], "a view"));
      ids.push_back(id);
      v.incarnation[id] = parse_int(f[1], "a view");
    }
  }
  return v;
}

ElasticRoster::ElasticRoster(c10::intrusive_ptr<c10d::Store> store, int id, int64_t incarnation, std::optional<bool> founding)
    : store_(std::move(store)), id_(id), incarnation_(incarnation), founding_(founding.value_or(incarnation == 0)) {}

Roster ElasticRoster::read() { return Roster::decode(to_text(store_->get(elastic_keys::roster()))); }

View ElasticRoster::seen(View v) {
  for (const auto& [id, inc] : v.incarnation) known_[id] = inc;
  return v;
}

int64_t ElasticRoster::incarnation_of(int id) const {
  const auto it = known_.find(id);
  return it == known_.end() ? -1 : it->second;
}

void ElasticRoster::mark_progress(int64_t round) {
  if (round <= marked_round_) return;
  marked_round_ = round;
  store_->set(elastic_keys::at(id_), to_bytes(fmt::format("{}:{}", incarnation_, round)));
}

View ElasticRoster::pin(int64_t round, int attempt) {
  mark_progress(round);
  const std::string key = elastic_keys::view(round, attempt);
  if (store_->check({key})) return seen(View::decode(round, attempt, to_text(store_->get(key))));
  const Roster r = read();
  View v;
  v.round = round;
  v.attempt = attempt;
  const bool any_behind = store_->check({elastic_keys::any_behind()});
  auto says = [&](const std::string& key, int64_t inc) {
    return store_->check({key}) && to_text(store_->get(key)) == std::to_string(inc);
  };
  for (const auto& e : r.entries) {
    if (e.state != RankState::member && e.state != RankState::joining) continue;
    // A joiner healed a moment ago is a member already, before the launcher's roster says so.
    const bool healed = says(elastic_keys::in(e.id), e.incarnation);
    // A member that resumed without a state of its own joins like a restarted rank.
    const bool behind = e.state == RankState::member && any_behind && says(elastic_keys::behind(e.id), e.incarnation);
    const bool member = e.state == RankState::member ? !behind || healed : healed;
    (member ? v.members : v.joining).push_back(e.id);
    v.incarnation[e.id] = e.incarnation;
  }
  const std::string proposed = v.encode();
  const std::string agreed = to_text(store_->compareSet(key, {}, to_bytes(proposed)));
  if (agreed == proposed) store_->set(elastic_keys::latest(), to_bytes(std::to_string(round)));
  return seen(agreed == proposed ? v : View::decode(round, attempt, agreed));
}

std::optional<View> ElasticRoster::pinned(int64_t round, int attempt) {
  const std::string key = elastic_keys::view(round, attempt);
  if (!store_->check({key})) return std::nullopt;
  return seen(View::decode(round, attempt, to_text(store_->get(key))));
}

int64_t ElasticRoster::latest_round() {
  if (!store_->check({elastic_keys::latest()})) return 0;
  return parse_int(to_text(store_->get(elastic_keys::latest())), elastic_keys::latest());
}

bool ElasticRoster::gone(int id, int64_t inc) {
  const Roster r = read();
  const RosterEntry* e = r.find(id);
  return e == nullptr || e->incarnation != inc || e->state == RankState::dead;
}

void ElasticRoster::announce_up() { store_->set(elastic_keys::up(id_), to_bytes(std::to_string(incarnation_))); }
void ElasticRoster::announce_member() { store_->set(elastic_keys::in(id_), to_bytes(std::to_string(incarnation_))); }
void ElasticRoster::announce_leave(int64_t step) {
  store_->set(elastic_keys::left(id_), to_bytes(fmt::format("{}:{}", incarnation_, step)));
}
void ElasticRoster::announce_behind() {
  store_->set(elastic_keys::behind(id_), to_bytes(std::to_string(incarnation_)));
  store_->set(elastic_keys::any_behind(), to_bytes("1"));
}
void ElasticRoster::suspect(int peer, int64_t inc) {
  store_->set(elastic_keys::suspect(peer), to_bytes(std::to_string(inc)));
}

int64_t ElasticRoster::request_stop(int64_t step) {
  const std::string agreed = to_text(store_->compareSet(elastic_keys::stop(), {}, to_bytes(std::to_string(step))));
  return parse_int(agreed, elastic_keys::stop());
}

std::optional<int64_t> ElasticRoster::stop_step() {
  if (!store_->check({elastic_keys::stop()})) return std::nullopt;
  return parse_int(to_text(store_->get(elastic_keys::stop())), elastic_keys::stop());
}

RosterWriter::RosterWriter(c10d::Store& store, int world) : store_(store) {
  for (int id = 0; id < world; ++id) roster_.entries.push_back({id, -1, RankState::dead});
  publish();
}

void RosterWriter::started(int id, int64_t incarnation, bool member) {
  auto& e = roster_.entries.at(static_cast<size_t>(id));
  e.incarnation = incarnation;
  e.state = member ? RankState::member : RankState::starting;
  publish();
}

void RosterWriter::exited(int id, int64_t incarnation) {
  auto& e = roster_.entries.at(static_cast<size_t>(id));
  if (e.incarnation != incarnation || e.state == RankState::dead) return;
  e.state = RankState::dead;
  publish();
}

std::vector<int> RosterWriter::poll() {
  std::vector<int> healed;
  bool changed = false;
  // An announcement counts only for the incarnation running now: an older one's is stale.
  auto announced = [&](const std::string& key, int64_t inc) {
    if (!store_.check({key})) return false;
    return to_text(store_.get(key)) == std::to_string(inc);
  };
  for (auto& e : roster_.entries) {
    if (e.state == RankState::starting && announced(elastic_keys::up(e.id), e.incarnation)) {
      e.state = RankState::joining;
      changed = true;
    }
    if (e.state == RankState::joining && announced(elastic_keys::in(e.id), e.incarnation)) {
      e.state = RankState::member;
      healed.push_back(e.id);
      changed = true;
    }
  }
  if (changed) publish();
  prune_rounds();
  return healed;
}

int64_t RosterWriter::prune_rounds() {
  int64_t floor = -1;
  for (const auto& e : roster_.entries) {
    if (e.state != RankState::member) continue;
    const std::string key = elastic_keys::at(e.id);
    if (!store_.check({key})) return 0;
    const auto f = split(to_text(store_.get(key)), ':');
    if (f.size() != 2 || parse_int(f[0], key) != e.incarnation) return 0;  // not yet said by this incarnation
    const int64_t round = parse_int(f[1], key);
    floor = floor < 0 ? round : std::min(floor, round);
  }
  int64_t deleted = 0;
  for (; pruned_below_ < floor - kKeptRounds; ++pruned_below_) {
    const int64_t r = pruned_below_;
    for (int a = 0; a < kAttemptsPerRound; ++a)
      if (!store_.deleteKey(elastic_keys::view(r, a))) break;
      else ++deleted;
    for (int64_t a = 0; a < kAttemptsPerRound; ++a) {
      const int64_t call = r * kAttemptsPerRound + a;
      if (!store_.deleteKey(elastic_keys::all_reduce(call))) break;
      ++deleted;
      for (const auto& e : roster_.entries) deleted += store_.deleteKey(elastic_keys::all_reduce_ok(call, e.id)) ? 1 : 0;
    }
  }
  return deleted;
}

std::vector<std::pair<int, int64_t>> RosterWriter::take_suspects() {
  std::vector<std::pair<int, int64_t>> out;
  for (const auto& e : roster_.entries) {
    const std::string key = elastic_keys::suspect(e.id);
    if (!store_.check({key})) continue;
    const std::string inc = to_text(store_.get(key));
    store_.deleteKey(key);
    out.emplace_back(e.id, parse_int(inc, key));
  }
  return out;
}

void RosterWriter::publish() { store_.set(elastic_keys::roster(), to_bytes(roster_.encode())); }

}  // namespace gasloc::comm
