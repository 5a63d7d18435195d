#include "gasloc/comm/heartbeat.hpp"

#include <chrono>
#include <string>

namespace gasloc::comm {

std::string heartbeat_key(int rank) { return "hb/" + std::to_string(rank); }

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
  const auto interval = std::chrono::duration<double>(interval_s_);
  std::unique_lock lk(mu_);
  while (!stop_) {
    lk.unlock();
    try {
      store_->add(heartbeat_key(rank_), 1);
    } catch (const std::exception&) {
      // The store is gone or slow: the host judges the silence; nothing to do here.
    }
    lk.lock();
    cv_.wait_for(lk, interval, [this] { return stop_; });
  }
}

std::vector<int> HeartbeatWatch::stalled(c10d::Store& store, double now_s) {
  std::vector<int> out;
  for (int r = 0; r < world_; ++r) {
    int64_t count = 0;
    try {
      count = store.add(heartbeat_key(r), 0);
    } catch (const std::exception&) {
      continue;
    }
    if (count == 0) continue;  // never beat
    if (const auto b = restarted_.find(r); b != restarted_.end()) {
      if (b->second < 0) b->second = count;
      if (count == b->second) continue;  // the new process has not beaten yet
      restarted_.erase(b);
    }
    auto [it, fresh] = seen_.try_emplace(r, Seen{count, now_s});
    if (fresh) continue;
    if (it->second.count != count) it->second = {count, now_s};
    else if (now_s - it->second.since_s >= timeout_s_) out.push_back(r);
  }
  return out;
}

}  // namespace gasloc::comm
