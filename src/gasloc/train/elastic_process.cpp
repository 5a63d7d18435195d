#include "gasloc/train/elastic_process.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <thread>

#include "gasloc/algo/membership.hpp"
#include "gasloc/comm/store.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/core/interrupt.hpp"

namespace gasloc::train {

namespace {
using comm::to_bytes;
using comm::to_text;
namespace keys = comm::elastic_keys;

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Polls `ready` every 20 ms until it returns true. Throws CommError naming `what` after
// timeout_s, or at once when the user asks to stop (SIGTERM, Ctrl+C): a rank that waits for
// others has nothing to save yet.
template <class F>
void await(F&& ready, int id, double timeout_s, const std::string& what) {
  const double deadline = now_s() + timeout_s;
  while (!ready()) {
    if (interrupt_requested())
      throw CommError(fmt::format("worker {}: interrupted while it waited for {}", id, what), "nothing was lost: it had not started");
    if (now_s() > deadline)
      throw CommError(fmt::format("worker {}: waited {} s for {}", id, timeout_s, what), "look at the other ranks' output first");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::vector<int64_t> parse_steps(const std::string& text, const std::string& key) {
  std::vector<int64_t> out;
  const auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("steps") || !j["steps"].is_array())
    throw CommError(fmt::format("elastic store: '{}' holds '{}'", key, text), "another program or gasloc version wrote the job's store");
  for (const auto& v : j["steps"]) out.push_back(v.get<int64_t>());
  return out;
}

// The resume step given what each rank can load: `asked`, else the step the most ranks can load,
// the newest on a tie.
nlohmann::json decide_resume(const std::map<int, std::vector<int64_t>>& held, std::optional<int64_t> asked) {
  std::map<int64_t, int> loaders;
  for (const auto& [id, steps] : held)
    for (int64_t s : steps) ++loaders[s];
  int64_t step = asked.value_or(-1);
  if (!asked)
    for (const auto& [s, n] : loaders)  // ascending: a later step with as many loaders wins
      if (step < 0 || n >= loaders[step]) step = s;
  nlohmann::json held_json = nlohmann::json::object();
  for (const auto& [id, steps] : held) held_json[std::to_string(id)] = steps;
  return {{"step", step}, {"held", held_json}};
}
}  // namespace

ElasticProcess::ElasticProcess(comm::ElasticRoster& roster, int world, int64_t steps_per_round, double timeout_s)
    : roster_(roster), views_(world, roster), steps_per_round_(std::max<int64_t>(steps_per_round, 1)), timeout_s_(timeout_s) {}

void ElasticProcess::agree(const nlohmann::json& shared) {
  const std::string mine = shared.dump();
  const std::string run = to_text(roster_.store().compareSet(comm::elastic_keys::config(), {}, to_bytes(mine)));
  if (run == mine) return;
  const auto theirs = nlohmann::json::parse(run, nullptr, false);
  std::string diffs;
  for (auto& [sec, values] : shared.items())
    for (auto& [key, v] : values.items()) {
      const nlohmann::json r = theirs.is_object() && theirs.contains(sec) ? theirs[sec].value(key, nlohmann::json()) : nlohmann::json();
      if (r != v) diffs += fmt::format("{}{}.{} is {} here but {} in the running job", diffs.empty() ? "" : "; ", sec, key, v.dump(), r.dump());
    }
  throw ConfigError(fmt::format("worker {} cannot join: {}", roster_.id(), diffs.empty() ? "its settings differ" : diffs),
                    "start it with the running job's job file and --set options, and the same prepared dataset");
}

ElasticProcess::Resume ElasticProcess::agree_resume(const std::vector<int64_t>& loadable, std::optional<int64_t> asked) {
  auto& store = roster_.store();
  const int me = roster_.id();
  store.set(keys::resume_of(me), to_bytes(nlohmann::json({{"inc", roster_.incarnation()}, {"steps", loadable}}).dump()));
  await(
      [&] {
        if (store.check({keys::resume()})) return true;
        // Every member's list: a member that died before it said is out of the roster by now.
        std::map<int, std::vector<int64_t>> held;
        const comm::Roster r = roster_.read();
        for (int id : r.with(comm::RankState::member)) {
          const std::string key = keys::resume_of(id);
          if (!store.check({key})) return false;
          const std::string text = to_text(store.get(key));
          const auto j = nlohmann::json::parse(text, nullptr, false);
          if (j.is_discarded() || !j.is_object() || j.value("inc", int64_t{-1}) != r.find(id)->incarnation) return false;
          held[id] = parse_steps(text, key);
        }
        store.compareSet(keys::resume(), {}, to_bytes(decide_resume(held, asked).dump()));
        return true;
      },
      me, timeout_s_, "every rank to say which checkpoints it holds (resuming)");
  const std::string text = to_text(store.get(keys::resume()));
  const auto d = nlohmann::json::parse(text, nullptr, false);
  if (d.is_discarded() || !d.contains("step") || !d.contains("held"))
    throw CommError(fmt::format("elastic store: '{}' holds '{}'", keys::resume(), text));
  Resume out;
  out.step = d["step"].get<int64_t>();
  std::string held;
  for (const auto& [id, steps] : d["held"].items()) {
    const auto v = steps.get<std::vector<int64_t>>();
    (std::find(v.begin(), v.end(), out.step) != v.end() ? out.loaders : out.healers).push_back(std::stoi(id));
    out.newer_dropped = out.newer_dropped || (!v.empty() && v.front() > out.step);
    held += fmt::format("{}rank {}: {}", held.empty() ? "" : "; ", id, v.empty() ? std::string("none") : fmt::format("{}", fmt::join(v, ", ")));
  }
  std::sort(out.loaders.begin(), out.loaders.end());
  std::sort(out.healers.begin(), out.healers.end());
  if (out.loaders.empty())
    throw CheckpointError(fmt::format("no rank of the elastic job can load step {} (committed steps held: {})", out.step, held),
                          "resume a step that a rank holds with --resume-step, or start a new run");
  out.heal = std::find(loadable.begin(), loadable.end(), out.step) == loadable.end();
  heals_ = out.heal;
  if (heals_) roster_.announce_behind();
  return out;
}

int64_t ElasticProcess::agreed_resume_step() {
  auto& store = roster_.store();
  await([&] { return store.check({keys::resume()}); }, roster_.id(), timeout_s_, "the resumed job's agreed step");
  const auto d = nlohmann::json::parse(to_text(store.get(keys::resume())), nullptr, false);
  if (d.is_discarded() || !d.contains("step")) throw CommError(fmt::format("elastic store: '{}' is malformed", keys::resume()));
  return d["step"].get<int64_t>();
}

bool ElasticProcess::claim_files() {
  auto& store = roster_.store();
  const std::string me = fmt::format("{}:{}", roster_.id(), roster_.incarnation());
  bool mine = false;
  await(
      [&] {
        if (store.check({keys::files_ready()})) return true;
        const std::string holder = to_text(store.compareSet(keys::files(), {}, to_bytes(me)));
        if (holder == me) return mine = true;
        const auto colon = holder.find(':');
        int id = -1;
        int64_t inc = -1;
        try {
          id = std::stoi(holder.substr(0, colon));
          inc = std::stoll(holder.substr(colon + 1));
        } catch (const std::exception&) {
          throw CommError(fmt::format("elastic store: '{}' holds '{}'", keys::files(), holder));
        }
        // Its holder died before it was done: the files are this rank's to open.
        if (roster_.gone(id, inc) && to_text(store.compareSet(keys::files(), to_bytes(holder), to_bytes(me))) == me) {
          spdlog::warn("worker {}: worker {} (incarnation {}) ended before it opened the run's files; worker {} opens them",
                       roster_.id(), id, inc, roster_.id());
          return mine = true;
        }
        return false;
      },
      roster_.id(), timeout_s_, "a rank to open the run's files");
  return mine;
}

void ElasticProcess::files_ready() { roster_.store().set(keys::files_ready(), to_bytes("1")); }

void ElasticProcess::finished(int64_t step) { roster_.store().set(keys::finished(), to_bytes(std::to_string(step))); }

int64_t ElasticProcess::join(Worker& w) {
  return join([&w](const algo::HealPlan& plan) { return w.heal(plan); }, [&w] { return w.steps_done(); });
}

int64_t ElasticProcess::join(const std::function<bool(const algo::HealPlan&)>& heal,
                             const std::function<int64_t()>& steps_done) {
  const int me = roster_.id();
  // Views pinned before this announcement cannot list it: start looking at the newest of those.
  int64_t t = roster_.latest_round();
  roster_.announce_up();
  double last_news = now_s();
  for (;;) {
    const auto pinned = views_.pinned(t);
    // A resumed job's first round is not round 0: rounds below the newest pinned one that never
    // were are stepped over.
    if (!pinned && roster_.latest_round() > t) {
      ++t;
      continue;
    }
    if (!pinned) {
      // The job may have ended (no member left), or stalled.
      if (interrupt_requested())
        throw CommError(fmt::format("worker {}: interrupted while it waited to join", me), "nothing was lost: it held no state of its own");
      if (now_s() - last_news > 1.0) {
        if (roster_.read().with(comm::RankState::member).empty()) {
          if (roster_.store().check({keys::finished()})) return -1;
          throw CommError(fmt::format("worker {}: no member of the job is left to give it a state (they all ended before "
                                      "the last step)",
                                      me),
                          "resume the job from its checkpoints: gasloc train --resume RUN under gasloc launch --elastic");
        }
        if (now_s() - last_news > timeout_s_)
          throw CommError(fmt::format("worker {}: no round began for {} s while it waited to join", me, timeout_s_),
                          "the running ranks may be stuck; look at their output");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    last_news = now_s();
    if (pinned->is_joining(me)) {
      const auto plan = algo::heal_plan(*pinned, me);
      if (plan && heal(*plan)) {
        roster_.announce_member();
        spdlog::info("worker {} {} at round {} with worker {}'s state (step {})", me,
                     heals_ ? "caught up" : roster_.incarnation() == 0 ? "joined" : "rejoined", t, pinned->donor(me),
                     steps_done());
        return steps_done();
      }
      spdlog::warn("worker {}: its donor for round {} failed during the transfer; waiting for the next round", me, t);
    }
    ++t;
  }
}

bool ElasticProcess::should_stop(int64_t step, bool stop_requested) {
  if (stop_requested && !proposed_ && !stop_at_) {
    proposed_ = true;
    // Two rounds ahead, rounded to a round's end: every rank is within a round of this one.
    const int64_t ahead = (step / steps_per_round_ + 2) * steps_per_round_;
    stop_at_ = roster_.request_stop(ahead);
  }
  if (!stop_at_) stop_at_ = roster_.stop_step();
  if (!stop_at_) return false;
  if (step > *stop_at_)
    spdlog::warn("worker {}: the agreed stop step {} was already behind it (step {}); it stops now", roster_.id(), *stop_at_, step);
  return step >= *stop_at_;
}

EvalResult ElasticProcess::evaluate(Worker& w, const std::vector<data::Batch>& val) const {
  EvalResult r;
  r.val_loss = w.evaluate(val);
  r.worker_val_loss = {r.val_loss};
  r.members = {roster_.id()};
  r.reporter = roster_.id();
  r.reports = true;  // every elastic rank writes its own line
  r.virtual_time_s = w.clock();
  return r;
}

}  // namespace gasloc::train
