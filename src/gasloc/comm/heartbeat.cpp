#include "gasloc/comm/heartbeat.hpp"

#include <optional>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <string>

#include "gasloc/core/error.hpp"

namespace gasloc::comm {

std::string heartbeat_key(int rank) { return "hb/" + std::to_string(rank); }

void check_heartbeat_timeout(double seconds, const std::string& what, bool zero_turns_off) {
  if (zero_turns_off && seconds == 0) return;
  if (std::isfinite(seconds) && seconds >= kMinHeartbeatTimeoutS) return;
  throw ConfigError(fmt::format("{} {:g} is not a heartbeat timeout: ranks beat every {:g} s, and a timeout under {:g} s "
                                "(four beats) would take a late beat on a busy host for a death",
                                what, seconds, kHeartbeatIntervalS, kMinHeartbeatTimeoutS),
                    fmt::format("give {:g} s or more, e.g. 10{}", kMinHeartbeatTimeoutS, zero_turns_off ? ", or 0 to turn the check off" : ""));
}

double HostClock::forgive(double now_s) {
  const double gap = last_s_ < 0 ? 0.0 : now_s - last_s_;
  last_s_ = now_s;
  return gap > max_gap_s_ ? gap - max_gap_s_ : 0.0;
}

Heartbeat::Heartbeat(c10::intrusive_ptr<c10d::Store> store, int rank, double interval_s)
    : store_(std::move(store)), rank_(rank), interval_s_(interval_s) {
  thread_ = std::thread([this] { loop(); });
}

Heartbeat::~Heartbeat() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Heartbeat::loop() {
  using Clock = std::chrono::steady_clock;
  const auto interval = std::chrono::duration<double>(interval_s_);
  std::optional<Clock::time_point> failing_since;
  std::unique_lock lk(mu_);
  while (!stop_) {
    lk.unlock();
    try {
      store_->add(heartbeat_key(rank_), 1);
      if (failing_since)
        spdlog::info("rank {}: heartbeats reach the store again after {:.1f} s", rank_,
                     std::chrono::duration<double>(Clock::now() - *failing_since).count());
      failing_since.reset();
    } catch (const std::exception& e) {
      // The host judges the silence; this side keeps trying (a new connection each time), so
      // that a host that was only paused or slow hears from this rank as soon as it can.
      if (!failing_since) {
        failing_since = Clock::now();
        spdlog::warn("rank {}: a heartbeat did not reach the store ({}); retrying every {:g} s", rank_, e.what(), interval_s_);
      }
    }
    lk.lock();
    cv_.wait_for(lk, interval, [this] { return stop_; });
  }
}

std::vector<int> HeartbeatWatch::stalled(c10d::Store& store, double now_s) {
  const double forgiven = clock_.forgive(now_s);
  for (auto& [r, seen] : seen_) seen.since_s += forgiven;
  std::vector<int> out;
  for (int r = 0; r < world_; ++r) {
    int64_t count = 0;
    try {
      count = store.add(heartbeat_key(r), 0);
    } catch (const std::exception&) {
      continue;
    }
    if (count == 0 && !seen_.count(r)) continue;  // never beat, and not watched from its admission
    if (const auto b = restarted_.find(r); b != restarted_.end()) {
      if (b->second < 0) b->second = count;
      if (count == b->second) continue;  // the new process has not beaten yet
      restarted_.erase(b);
    }
    auto [it, fresh] = seen_.try_emplace(r, Seen{count, now_s});
    if (fresh) continue;
    if (it->second.count != count) it->second = {count, now_s};
    else if (timeout_s_ > 0 && now_s - it->second.since_s >= timeout_s_) out.push_back(r);
  }
  return out;
}

void HeartbeatWatch::watch_from(c10d::Store& store, int rank, double now_s) {
  restarted_.erase(rank);
  reports_.erase(rank);
  int64_t count = 0;
  try {
    count = store.add(heartbeat_key(rank), 0);
  } catch (const std::exception&) {
    count = -1;  // unread: the next look that reads it counts as a beat
  }
  seen_[rank] = {count, now_s};
}

void HeartbeatWatch::reported(int rank, int64_t inc) {
  if (reports_.count(rank) && reports_[rank].inc == inc) return;  // the first report stands
  // Its counter is taken at the next look (the last one read may be older than the report).
  reports_[rank] = Report{inc, std::nullopt};
}

HeartbeatWatch::Reports HeartbeatWatch::settle_reports(double now_s, const std::function<bool(int, int64_t)>& current) {
  Reports out;
  for (auto it = reports_.begin(); it != reports_.end();) {
    const auto [rank, report] = *it;
    const auto seen = seen_.find(rank);
    if (!current(rank, report.inc)) {
      it = reports_.erase(it);
    } else if (seen == seen_.end()) {
      ++it;  // not judged yet: it has not beaten since it started
    } else if (now_s - seen->second.since_s >= suspect_silence_s()) {
      out.gone.emplace_back(rank, now_s - seen->second.since_s);
      it = reports_.erase(it);
    } else if (!report.count) {
      it->second.count = seen->second.count;
      ++it;
    } else if (seen->second.count >= *report.count + 2) {
      out.beating.push_back(rank);
      it = reports_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

}  // namespace gasloc::comm
