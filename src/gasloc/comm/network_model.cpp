#include "gasloc/comm/network_model.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <string>

#include "gasloc/core/error.hpp"

namespace gasloc::comm {

namespace {

[[noreturn]] void bad_field(const std::string& field, const std::string& why) {
  throw ConfigError("network model: " + field + " " + why, "fix '" + field + "' in the network settings");
}

void check_positive(const std::string& field, double v) {
  if (!std::isfinite(v) || v <= 0) bad_field(field, "must be a finite number > 0, got " + std::to_string(v));
}

void check_non_negative(const std::string& field, double v) {
  if (!std::isfinite(v) || v < 0) bad_field(field, "must be a finite number >= 0, got " + std::to_string(v));
}

void check_per_rank(const std::string& field, const std::vector<double>& v, int world) {
  if (!v.empty() && static_cast<int>(v.size()) != world)
    bad_field(field, "has " + std::to_string(v.size()) + " entries; it needs one per rank (" + std::to_string(world) +
                         ") or none");
  for (size_t r = 0; r < v.size(); ++r) check_positive(field + "[" + std::to_string(r) + "]", v[r]);
}

// The per-rank factor of a list that may be empty (= 1 everywhere).
double factor(const std::vector<double>& v, int rank, const char* field) {
  if (v.empty()) return 1.0;
  if (rank < 0 || rank >= static_cast<int>(v.size()))
    throw CommError(std::string("network model: no ") + field + " entry for rank " + std::to_string(rank));
  return v[rank];
}

double max_of(const std::vector<double>& t) { return t.empty() ? 0.0 : *std::max_element(t.begin(), t.end()); }

double min_bandwidth(const NetworkModel& m, int n) {
  double b = m.bandwidth(0);
  for (int r = 1; r < n; ++r) b = std::min(b, m.bandwidth(r));
  return b;
}

// Every worker starts at max t and ends `seconds` later.
std::vector<ClockUpdate> synchronized(const std::vector<double>& t, double seconds) {
  const double start = max_of(t);
  std::vector<ClockUpdate> out(t.size());
  for (size_t i = 0; i < t.size(); ++i) out[i] = {start + seconds, start - t[i]};
  return out;
}

}  // namespace

void NetworkModel::validate(int world) const {
  if (world < 1) throw ConfigError("network model: world must be >= 1, got " + std::to_string(world));
  check_non_negative("step_time_s", step_time_s);
  check_positive("bandwidth_Bps", bandwidth_Bps);
  check_non_negative("latency_s", latency_s);
  check_per_rank("slowdown", slowdown, world);
  check_per_rank("bandwidth_scale", bandwidth_scale, world);
  if (simulated_message_bytes < 0)
    bad_field("simulated_message_bytes", "must be >= 0, got " + std::to_string(simulated_message_bytes));
  if (!latency_per_rank.empty() && static_cast<int>(latency_per_rank.size()) != world)
    bad_field("latency_per_rank", "has " + std::to_string(latency_per_rank.size()) + " entries; it needs one per rank (" +
                                      std::to_string(world) + ") or none");
  for (size_t r = 0; r < latency_per_rank.size(); ++r) check_non_negative("latency_per_rank[" + std::to_string(r) + "]", latency_per_rank[r]);
  if (!region.empty() && static_cast<int>(region.size()) != world)
    bad_field("region", "has " + std::to_string(region.size()) + " entries; it needs one per rank (" + std::to_string(world) +
                            ") or none");
  for (size_t r = 0; r < region.size(); ++r)
    if (region[r] < 0) bad_field("region[" + std::to_string(r) + "]", "must be >= 0, got " + std::to_string(region[r]));
  check_non_negative("inter_region_latency_s", inter_region_latency_s);
  check_non_negative("inter_region_Bps", inter_region_Bps);
}

double NetworkModel::step_time(int rank) const { return step_time_s * factor(slowdown, rank, "slowdown"); }

double NetworkModel::bandwidth(int rank) const { return bandwidth_Bps * factor(bandwidth_scale, rank, "bandwidth_scale"); }

double NetworkModel::latency(int rank) const {
  if (latency_per_rank.empty()) return latency_s;
  if (rank < 0 || rank >= static_cast<int>(latency_per_rank.size()))
    throw CommError("network model: no latency_per_rank entry for rank " + std::to_string(rank));
  return latency_per_rank[rank];
}

namespace {
bool cross_region(const NetworkModel& m, int i, int j) {
  if (m.region.empty()) return false;
  const int n = static_cast<int>(m.region.size());
  if (i < 0 || i >= n || j < 0 || j >= n)
    throw CommError("network model: no region entry for rank " + std::to_string(i < 0 || i >= n ? i : j));
  return m.region[i] != m.region[j];
}
}  // namespace

double NetworkModel::link_latency(int i, int j) const {
  const double own = std::max(latency(i), latency(j));
  return cross_region(*this, i, j) ? std::max(own, inter_region_latency_s) : own;
}

double NetworkModel::link_cap(int i, int j) const {
  return cross_region(*this, i, j) && inter_region_Bps > 0 ? inter_region_Bps : std::numeric_limits<double>::infinity();
}

double pair_exchange_seconds(double P, double B_i, double B_j, int k_i, int k_j, double latency_s) {
  if (k_i < 1 || k_j < 1)
    throw CommError("pair_exchange_seconds: neighbour counts must be >= 1, got " + std::to_string(k_i) + " and " +
                    std::to_string(k_j));
  return latency_s + P / std::min(B_i / k_i, B_j / k_j);
}

double ring_allreduce_seconds(double P, int n, double min_B, double latency_s) {
  if (n <= 1) return 0.0;
  return 2.0 * (n - 1) * latency_s + 2.0 * (n - 1) / n * P / min_B;
}

double tree_allreduce_seconds(double P, int n, double min_B, double latency_s) {
  if (n <= 1) return 0.0;
  const int steps = std::bit_width(static_cast<unsigned>(n - 1));  // ceil(log2 n)
  return 2.0 * steps * latency_s + 2.0 * (n - 1) / n * P / min_B;
}

double allreduce_seconds(const NetworkModel& m, double P, int n, double min_B) {
  return m.allreduce == AllReducePattern::tree ? tree_allreduce_seconds(P, n, min_B, m.latency_s)
                                               : ring_allreduce_seconds(P, n, min_B, m.latency_s);
}

double members_allreduce_seconds(const NetworkModel& m, double P, const std::vector<int>& members) {
  const int n = static_cast<int>(members.size());
  if (n <= 1) return 0.0;
  double min_B = m.bandwidth(members.front());
  for (int r : members) min_B = std::min(min_B, m.bandwidth(r));
  if (m.uniform_links()) return allreduce_seconds(m, P, n, min_B);
  auto use = [&](int a, int b, double& latency) {
    latency = std::max(latency, m.link_latency(members[a], members[b]));
    min_B = std::min(min_B, m.link_cap(members[a], members[b]));
  };
  double latency_steps = 0.0;  // the sum of every step's slowest latency
  if (m.allreduce == AllReducePattern::ring) {
    double slowest = 0.0;
    for (int k = 0; k < n; ++k) use(k, (k + 1) % n, slowest);
    latency_steps = 2.0 * (n - 1) * slowest;
  } else {
    for (int d = 1; d < n; d *= 2) {
      double slowest = 0.0;
      for (int k = 0; k < n; ++k)
        if ((k ^ d) < n) use(k, k ^ d, slowest);
        else use(k, k % d, slowest);  // a non-power-of-two n: the rank without a partner at d folds into one that has one
      latency_steps += 2.0 * slowest;
    }
  }
  return latency_steps + 2.0 * (n - 1) / n * P / min_B;
}

double broadcast_seconds(double P, int n, double min_B, double latency_s) {
  if (n <= 1) return 0.0;
  return latency_s + P / min_B;
}

int64_t ring_allreduce_bytes(int64_t P, int n) {
  if (n <= 1) return 0;
  return 2 * static_cast<int64_t>(n - 1) * P / n;
}

std::vector<ClockUpdate> exchange_clocks(const NetworkModel& m, double P, const std::vector<std::vector<int>>& peers,
                                         const std::vector<double>& t) {
  return exchange_clocks(m, std::vector<double>(t.size(), P), peers, t);
}

std::vector<ClockUpdate> exchange_clocks(const NetworkModel& m, const std::vector<double>& P,
                                         const std::vector<std::vector<int>>& peers, const std::vector<double>& t) {
  const int n = static_cast<int>(t.size());
  if (static_cast<int>(peers.size()) != n || static_cast<int>(P.size()) != n)
    throw CommError("exchange_clocks: " + std::to_string(peers.size()) + " peer lists and " + std::to_string(P.size()) +
                    " message sizes for " + std::to_string(n) + " clocks");
  std::vector<ClockUpdate> out(n);
  for (int i = 0; i < n; ++i) {
    out[i].end_s = t[i];
    if (peers[i].empty()) continue;
    const int k_i = static_cast<int>(peers[i].size());
    double latest_start = t[i], latest_end = t[i];
    for (int j : peers[i]) {
      if (j < 0 || j >= n) throw CommError("exchange_clocks: rank " + std::to_string(i) + " lists peer " + std::to_string(j));
      const int k_j = static_cast<int>(peers[j].size());
      const double start = std::max(t[i], t[j]);
      latest_start = std::max(latest_start, start);
      const double cap = m.link_cap(i, j);
      latest_end = std::max(latest_end, start + pair_exchange_seconds(std::max(P[i], P[j]), std::min(m.bandwidth(i), cap * k_i),
                                                                      std::min(m.bandwidth(j), cap * k_j), k_i, k_j,
                                                                      m.link_latency(i, j)));
    }
    out[i] = {latest_end, latest_start - t[i]};
  }
  return out;
}

std::vector<ClockUpdate> all_reduce_clocks(const NetworkModel& m, double P, const std::vector<double>& t) {
  const int n = static_cast<int>(t.size());
  if (n == 0) return {};
  std::vector<int> everyone(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) everyone[r] = r;
  return synchronized(t, members_allreduce_seconds(m, P, everyone));
}

std::vector<ClockUpdate> broadcast_clocks(const NetworkModel& m, double P, const std::vector<double>& t) {
  const int n = static_cast<int>(t.size());
  if (n == 0) return {};
  if (m.uniform_links()) return synchronized(t, broadcast_seconds(P, n, min_bandwidth(m, n), m.latency_s));
  // The chain 0 -> 1 -> ... -> n-1: its slowest link's latency, its slowest link's bytes.
  double latency = 0.0, min_B = min_bandwidth(m, n);
  for (int r = 0; r + 1 < n; ++r) latency = std::max(latency, m.link_latency(r, r + 1)), min_B = std::min(min_B, m.link_cap(r, r + 1));
  return synchronized(t, broadcast_seconds(P, n, min_B, latency));
}

std::vector<ClockUpdate> barrier_clocks(const std::vector<double>& t) { return synchronized(t, 0.0); }

std::vector<ClockUpdate> member_all_reduce_clocks(const NetworkModel& m, double P, const std::vector<double>& t,
                                                  const std::vector<int>& members) {
  if (members.size() == t.size()) return all_reduce_clocks(m, P, t);
  std::vector<ClockUpdate> out(t.size());
  for (size_t i = 0; i < t.size(); ++i) out[i].end_s = t[i];
  if (members.empty()) return out;
  double start = t[members.front()];
  for (int r : members) start = std::max(start, t[r]);
  const double end = start + members_allreduce_seconds(m, P, members);
  for (int r : members) out[r] = {end, start - t[r]};
  return out;
}

void wait_for_detection(std::vector<ClockUpdate>& out, const std::vector<double>& t, const std::vector<int>& waiters,
                        double detected_s) {
  for (int r : waiters) {
    if (detected_s <= out[r].end_s) continue;
    out[r].idle_s += detected_s - out[r].end_s;
    out[r].end_s = detected_s;
  }
}

}  // namespace gasloc::comm
