#include "gasloc/algo/membership.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "gasloc/core/error.hpp"
#include "gasloc/core/rng.hpp"

namespace gasloc::algo {

namespace {
std::string entry(size_t i) { return fmt::format("faults.kill[{}]", i); }
}  // namespace

std::vector<FaultEvent> draw_churn(int workers, const Churn& churn, int64_t horizon_rounds) {
  std::vector<FaultEvent> out;
  if (churn.mean_rounds <= 0) return out;
  // Geometric gaps of mean m: P(fail in a round) = 1/m, drawn by inversion from one counter stream per id.
  const double p = std::min(1.0, 1.0 / churn.mean_rounds);
  for (int id = 0; id < workers; ++id) {
    const uint64_t stream = mix64(churn.seed ^ mix64(0xc4a11ULL + static_cast<uint64_t>(id)));
    uint64_t k = 0;
    for (int64_t start = 0;;) {
      const double u = (static_cast<double>(random_u64(stream, k++) >> 11) + 0.5) / 9007199254740992.0;
      const auto gap = p >= 1.0 ? 0 : static_cast<int64_t>(std::floor(std::log(u) / std::log1p(-p)));
      const int64_t round = start + gap;
      if (round >= horizon_rounds) break;
      out.push_back({id, round, churn.restart_after_rounds});
      if (churn.restart_after_rounds <= 0) break;
      start = round + churn.restart_after_rounds + 1;  // counted from the round after it rejoined
    }
  }
  return out;
}

Membership::Membership(int workers, std::vector<FaultEvent> events, Churn churn, int64_t horizon_rounds,
                       std::optional<RestartAll> restart_all, Arrivals arrivals)
    : workers_(workers), restart_all_(restart_all), arrivals_(std::move(arrivals)) {
  if (workers < 1) throw ConfigError(fmt::format("membership: the world must have >= 1 worker, got {}", workers));
  for (const auto& [id, round] : arrivals_) {
    if (id < 0 || id >= workers || round < 0)
      throw ConfigError(fmt::format("membership: worker {} cannot arrive at round {} in a world of {}", id, round, workers));
    if (restart_all_)
      throw ConfigError("faults.restart_all prices a job that restarts every worker; it cannot add workers",
                        "resume on as many workers as the run was saved by");
  }
  for (size_t i = 0; i < events.size(); ++i) {
    const auto& e = events[i];
    if (e.id < 0 || e.id >= workers)
      throw ConfigError(fmt::format("{}.id is {} but the cluster has {} worker(s), ids 0..{}", entry(i), e.id, workers, workers - 1),
                        "name a worker of this cluster");
    if (e.round < 0) throw ConfigError(fmt::format("{}.round is {}; rounds count from 0", entry(i), e.round));
    if (e.restart_after_rounds < 0)
      throw ConfigError(fmt::format("{}.restart_after_rounds is {}; use 0 for a worker that never comes back, or >= 1",
                                    entry(i), e.restart_after_rounds));
  }
  for (const auto& e : draw_churn(workers, churn, horizon_rounds)) events.push_back(e);
  std::erase_if(events, [&](const FaultEvent& e) {
    const auto a = arrivals_.find(e.id);
    return a != arrivals_.end() && e.round <= a->second;
  });
  std::stable_sort(events.begin(), events.end(),
                   [](const FaultEvent& a, const FaultEvent& b) { return a.round != b.round ? a.round < b.round : a.id < b.id; });
  // A worker dies again only once it is back: after its rejoin round (and never after no restart).
  for (int id = 0; id < workers; ++id) {
    int64_t free_from = 0;
    for (const auto& e : events) {
      if (e.id != id) continue;
      if (e.round < free_from)
        throw ConfigError(fmt::format("faults: worker {} is killed at round {} while it is dead or rejoining (it is back "
                                      "as a member from round {})",
                                      id, e.round, free_from == INT64_MAX ? std::string("never") : std::to_string(free_from)),
                          "kill a worker again only after restart_after_rounds + 1 rounds");
      free_from = e.restart_after_rounds > 0 ? e.round + e.restart_after_rounds + 1 : INT64_MAX;
    }
  }
  events_ = std::move(events);
  if (restart_all_) return;  // nobody leaves
  // Every round needs a survivor to carry the model (and to heal the joiners).
  int64_t last = 0;
  for (const auto& e : events_) last = std::max(last, e.round + e.restart_after_rounds + 1);
  for (const auto& [id, round] : arrivals_) last = std::max(last, round + 1);
  for (int64_t r = 0; r <= last; ++r)
    if (view(r).survivors().empty())
      throw ConfigError(fmt::format("faults leave no worker alive after round {}", r),
                        "kill fewer workers at once, or restart them sooner");
}

bool Membership::fails_at(int64_t round) const {
  return std::any_of(events_.begin(), events_.end(), [&](const FaultEvent& e) { return e.round == round; });
}

Membership::State Membership::state(int id, int64_t round) const {
  if (restart_all_) return State::member;
  if (const auto a = arrivals_.find(id); a != arrivals_.end() && round <= a->second)
    return round < a->second ? State::dead : State::joining;
  State s = State::member;
  for (const auto& e : events_) {
    if (e.id != id || e.round > round) continue;
    if (e.round == round) return State::dying;
    if (e.restart_after_rounds <= 0) s = State::dead;
    else if (round < e.round + e.restart_after_rounds) s = State::dead;
    else if (round == e.round + e.restart_after_rounds) s = State::joining;
    else s = State::member;
  }
  return s;
}

View Membership::view(int64_t round) const {
  View v;
  v.round = round;
  for (int id = 0; id < workers_; ++id) {
    switch (state(id, round)) {
      case State::dying: v.dying.push_back(id); [[fallthrough]];
      case State::member: v.members.push_back(id); break;
      case State::joining: v.joining.push_back(id); break;
      case State::dead: break;
    }
  }
  return v;
}

View Membership::retry(const View& v, int attempt) const {
  if (attempt > 1)
    throw CommError(fmt::format("round {}: the all-reduce's retry over the survivors was aborted too (a second death in one round)",
                                v.round));
  View s = v;
  s.members = v.survivors();
  s.dying.clear();
  return s;
}

bool Membership::computes(int id, int64_t round) const {
  const State s = state(id, round);
  return s == State::member || s == State::dying;
}

std::optional<HealPlan> heal_plan(const View& v, int id) {
  if (v.joining.empty()) return std::nullopt;
  HealPlan p;
  if (v.is_joining(id)) {
    p.peers = {v.donor(id)};
    p.receives = true;
    return p;
  }
  for (int j : v.joining)
    if (v.donor(j) == id) p.peers.push_back(j);
  return p;
}

}  // namespace gasloc::algo
