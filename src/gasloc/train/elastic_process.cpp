#include "gasloc/train/elastic_process.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <thread>

#include "gasloc/algo/elastic.hpp"
#include "gasloc/comm/store.hpp"
#include "gasloc/core/error.hpp"

namespace gasloc::train {

namespace {
using comm::to_bytes;
using comm::to_text;
const char* kFilesReady = "el/files_ready";

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
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

void ElasticProcess::files_ready() { roster_.store().set(kFilesReady, to_bytes("1")); }

void ElasticProcess::wait_files_ready() {
  const double deadline = now_s() + timeout_s_;
  while (!roster_.store().check({kFilesReady})) {
    if (now_s() > deadline)
      throw CommError(fmt::format("worker {}: worker 0 did not open the run's files within {} s", roster_.id(), timeout_s_),
                      "look at rank 0's output first");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

int64_t ElasticProcess::join(Worker& w) {
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
      if (now_s() - last_news > 1.0) {
        if (roster_.read().with(comm::RankState::member).empty()) return -1;
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
      if (plan && w.heal(*plan)) {
        roster_.announce_member();
        spdlog::info("worker {} {} at round {} with worker {}'s state (step {})", me,
                     roster_.incarnation() == 0 ? "joined" : "rejoined", t, pinned->donor(me), w.steps_done());
        return w.steps_done();
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
