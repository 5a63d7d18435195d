// The cost model of the simulated cluster (docs/design.md section 5): how long compute and messages
// take on each worker's virtual clock. Pure functions of their arguments, free of tensors and
// threads, so the in-process backend, the Gloo backend's link throttling and the time-budget
// local-step policy all price a round the same way.
#pragma once
#include <cstdint>
#include <vector>

namespace gasloc::comm {

// How an all-reduce is priced (network.allreduce): a ring, 2(n-1) latencies, or recursive
// halving-doubling (a tree of pair exchanges), 2 ceil(log2 n) latencies; both move 2(n-1)/n of
// the message per worker, so they differ in latency only.
enum class AllReducePattern { ring, tree };

struct NetworkModel {
  double step_time_s = 0.1;               // compute time of one inner step on an unimpeded worker
  double bandwidth_Bps = 125e6;           // bytes/s per worker (1 Gbit/s), full duplex
  double latency_s = 1e-3;                // per message
  std::vector<double> slowdown;           // per-rank factor on step_time_s; empty = all 1
  std::vector<double> bandwidth_scale;    // per-rank factor on bandwidth_Bps; empty = all 1
  int64_t simulated_message_bytes = 0;    // price every message as this many bytes (0 = actual bytes)
  int64_t parameter_message_bytes = 0;    // with the above: the run's own fp32 parameter message, so that a
                                          // message of b bytes is priced b / this of it (compressed rounds)
  AllReducePattern allreduce = AllReducePattern::ring;  // how all-reduces are priced
  // Per-link latency (docs/heterogeneity.md "Latency per link"): a link's latency is the larger of
  // its two ends' latency(rank), and between regions at least inter_region_latency_s; its bytes
  // move no faster than inter_region_Bps (0 = no cap). Empty lists: latency_s everywhere, one region.
  std::vector<double> latency_per_rank;   // seconds per message on each rank's link
  std::vector<int> region;                // each rank's region, from 0
  double inter_region_latency_s = 0.0;
  double inter_region_Bps = 0.0;

  // Throws ConfigError naming the field when a value is out of range, not finite, or a per-rank
  // list is neither empty nor `world` long.
  void validate(int world) const;
  // Compute time of one inner step on `rank` (step_time_s * slowdown[rank]).
  double step_time(int rank) const;
  // Bandwidth of `rank` in bytes/s (bandwidth_Bps * bandwidth_scale[rank]).
  double bandwidth(int rank) const;
  // Latency of `rank`'s own link (latency_per_rank[rank], else latency_s).
  double latency(int rank) const;
  // The link between ranks i and j: its latency (max of both ends', and of the inter-region
  // latency when their regions differ) and its bytes/s cap (inter_region_Bps between regions,
  // else infinity; each end's own bandwidth applies as well).
  double link_latency(int i, int j) const;
  double link_cap(int i, int j) const;
  // True when every link has latency_s and no cap: the closed forms below are then exact.
  bool uniform_links() const { return latency_per_rank.empty() && region.empty(); }
  // The size a message of `actual_bytes` is priced (and counted in CommStats) as. Callers pass
  // the bytes actually sent: the parameter count times the wire dtype's size (algo.wire_dtype).
  int64_t message_bytes(int64_t actual_bytes) const {
    if (simulated_message_bytes <= 0) return actual_bytes;
    if (parameter_message_bytes <= 0) return simulated_message_bytes;
    return static_cast<int64_t>(static_cast<double>(simulated_message_bytes) * static_cast<double>(actual_bytes) /
                                    static_cast<double>(parameter_message_bytes) + 0.5);
  }
};

// Seconds for workers i and j to swap P-byte messages: l + P / min(B_i / k_i, B_j / k_j). A
// worker with k simultaneous neighbours shares its bandwidth equally among them, so the slower
// end of the link (after sharing) sets the pace.
double pair_exchange_seconds(double P, double B_i, double B_j, int k_i, int k_j, double latency_s);
// Seconds of a bandwidth-optimal ring all-reduce of P bytes over n workers:
// 2(n-1) l + 2(n-1)/n * P / min_B (reduce-scatter then all-gather, each n-1 steps); 0 for n = 1.
double ring_allreduce_seconds(double P, int n, double min_B, double latency_s);
// Seconds of recursive halving-doubling (Rabenseifner's reduce-scatter then all-gather):
// 2 ceil(log2 n) l + 2(n-1)/n * P / min_B; 0 for n = 1. (A non-power-of-two n pays one more
// step each way, folded into the ceiling; its bytes are priced as the ring's.)
double tree_allreduce_seconds(double P, int n, double min_B, double latency_s);
// The all-reduce of P bytes over n workers with m's pattern.
double allreduce_seconds(const NetworkModel& m, double P, int n, double min_B);
// The all-reduce of P bytes over `members` (ranks, in the ring's order) with m's pattern and
// links: a ring pays its slowest link's latency at each of its 2(n-1) steps; recursive
// halving-doubling pays, at each of its ceil(log2 n) distances d, the slowest latency among the
// pairs (k, k xor d), twice. Bytes move at the slowest member's bandwidth or link cap among the
// links used. With uniform links it is allreduce_seconds, bit for bit.
double members_allreduce_seconds(const NetworkModel& m, double P, const std::vector<int>& members);
// Seconds of a broadcast of P bytes: l + P / min_B (a pipelined chain, whose throughput is that
// of its slowest link); 0 for n = 1.
double broadcast_seconds(double P, int n, double min_B, double latency_s);
// Bytes each worker sends (and receives) in a ring all-reduce: 2(n-1)/n * P, rounded down.
int64_t ring_allreduce_bytes(int64_t P, int n);

// Where one worker's clock lands after a communication call, and how much of that it spent
// waiting for others (CommStats::idle_s).
struct ClockUpdate {
  double end_s = 0.0;
  double idle_s = 0.0;
};

// The clocks after an exchange round: peers[i] lists worker i's neighbours (symmetric), t[i] is
// its clock at entry. Each transfer (i, j) starts at max(t_i, t_j) and takes
// pair_exchange_seconds; worker i ends at its latest transfer end and idles from t_i to its
// latest transfer start. A worker without neighbours keeps its clock.
std::vector<ClockUpdate> exchange_clocks(const NetworkModel& m, double P, const std::vector<std::vector<int>>& peers,
                                         const std::vector<double>& t);
// The same with a message size per worker: P[i] is what worker i sends each neighbour, and a
// pair's transfer is priced at the larger of its two ends' (they are equal when both ends check
// their shapes, as the backends do).
std::vector<ClockUpdate> exchange_clocks(const NetworkModel& m, const std::vector<double>& P,
                                         const std::vector<std::vector<int>>& peers, const std::vector<double>& t);
// All-reduce: starts at max t, takes allreduce_seconds with the slowest bandwidth; every clock
// ends there.
std::vector<ClockUpdate> all_reduce_clocks(const NetworkModel& m, double P, const std::vector<double>& t);
// Broadcast: starts at max t, takes broadcast_seconds with the slowest bandwidth.
std::vector<ClockUpdate> broadcast_clocks(const NetworkModel& m, double P, const std::vector<double>& t);
// Barrier: every clock becomes max t (no message cost: it synchronizes, it does not transfer).
std::vector<ClockUpdate> barrier_clocks(const std::vector<double>& t);

// Elastic rounds (docs/design.md section 10). An all-reduce over `members` (ids into t) only:
// it starts at their latest clock and takes allreduce_seconds over them with their slowest
// bandwidth; every other clock stays. Over every rank it is all_reduce_clocks.
std::vector<ClockUpdate> member_all_reduce_clocks(const NetworkModel& m, double P, const std::vector<double>& t,
                                                  const std::vector<int>& members);
// A round that fails on a death: `waiters` wait, idle, until the failure is detected at
// `detected_s` (the dead worker's clock plus the heartbeat timeout), or their own clock if later.
void wait_for_detection(std::vector<ClockUpdate>& out, const std::vector<double>& t, const std::vector<int>& waiters,
                        double detected_s);

}  // namespace gasloc::comm
