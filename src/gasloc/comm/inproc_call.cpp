#include "gasloc/comm/inproc_call.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <algorithm>
#include <limits>
#include <set>

namespace gasloc::comm::inproc {

const char* op_name(Op op) {
  switch (op) {
    case Op::AllReduceMean: return "all_reduce_mean";
    case Op::AllReduceOver: return "all_reduce_mean_over";
    case Op::Exchange: return "exchange";
    case Op::Broadcast: return "broadcast";
    case Op::Barrier: return "barrier";
  }
  return "?";
}

namespace {

// "" when rank r's tensor `a` can meet rank q's tensor `b`, else why not, naming both ranks.
std::string mismatch(const char* op, int r, const torch::Tensor& a, int q, const torch::Tensor& b) {
  if (a.numel() != b.numel()) return fmt::format("{}: rank {} sent {} elements, rank {} sent {}", op, r, a.numel(), q, b.numel());
  if (a.sizes() != b.sizes())
    return fmt::format("{}: rank {} sent shape [{}], rank {} sent shape [{}]", op, r, fmt::join(a.sizes(), ", "), q,
                       fmt::join(b.sizes(), ", "));
  if (a.scalar_type() != b.scalar_type())
    return fmt::format("{}: rank {} sent {}, rank {} sent {}", op, r, c10::toString(a.scalar_type()), q,
                       c10::toString(b.scalar_type()));
  if (a.device() != b.device()) return fmt::format("{}: rank {} sent a tensor on {}, rank {} on {}", op, r, a.device().str(), q, b.device().str());
  return {};
}

std::string undefined(const char* op, int r) { return fmt::format("{}: rank {} passed an undefined tensor", op, r); }

std::string check_all_reduce(const Call& c) {
  const auto& e = c.entries;
  for (int r = 0; r < static_cast<int>(e.size()); ++r) {
    if (!e[r].tensor.defined()) return undefined("all_reduce_mean", r);
    if (!e[r].tensor.is_floating_point())
      return fmt::format("all_reduce_mean: rank {} passed a {} tensor; only floating-point tensors can be averaged", r,
                         c10::toString(e[r].tensor.scalar_type()));
    if (auto m = mismatch("all_reduce_mean", r, e[r].tensor, 0, e[0].tensor); !m.empty()) return m;
  }
  return {};
}

std::string check_broadcast(const Call& c) {
  const auto& e = c.entries;
  const int n = static_cast<int>(e.size()), root = e[0].root;
  for (int r = 1; r < n; ++r)
    if (e[r].root != root) return fmt::format("broadcast: rank {} passed root {}, rank 0 passed root {}", r, e[r].root, root);
  if (root < 0 || root >= n) return fmt::format("broadcast: root {} is outside a world of {}", root, n);
  for (int r = 0; r < n; ++r) {
    if (!e[r].tensor.defined()) return undefined("broadcast", r);
    if (auto m = mismatch("broadcast", r, e[r].tensor, root, e[root].tensor); !m.empty()) return m;
  }
  return {};
}

// Peer lists must be valid and symmetric; the two ends of each pair must send the same shape and
// dtype (pairs may differ: the cost model prices each pair by its own message).
std::string check_exchange(const Call& c, Elastic elastic) {
  const auto& e = c.entries;
  const int n = static_cast<int>(e.size());
  for (int r = 0; r < n; ++r) {
    std::set<int> seen;
    for (int j : e[r].peers) {
      if (j < 0 || j >= n) return fmt::format("exchange: rank {} lists peer {}, outside a world of {}", r, j, n);
      if (j == r) return fmt::format("exchange: rank {} lists itself as a peer", r);
      if (!seen.insert(j).second) return fmt::format("exchange: rank {} lists peer {} twice", r, j);
      const auto& back = e[j].peers;
      if (std::find(back.begin(), back.end(), r) == back.end())
        return fmt::format("exchange: rank {} lists rank {} as a peer but rank {} does not list rank {} (its peers: [{}])",
                           r, j, j, r, fmt::join(back, ", "));
    }
    if (e[r].peers.empty()) continue;
    if (!e[r].tensor.defined()) {
      if (elastic.enabled()) continue;  // it leaves at this exchange
      return undefined("exchange", r);
    }
    for (int j : e[r].peers) {
      if (j < r || !e[j].tensor.defined()) continue;  // each pair once; a leaving peer sends nothing
      if (auto m = mismatch("exchange", r, e[r].tensor, j, e[j].tensor); !m.empty()) return m;
    }
  }
  return {};
}

// Every rank names the same members, valid and ascending; members that stay send one shape.
std::string check_all_reduce_over(const Call& c, Elastic elastic) {
  const auto& e = c.entries;
  const int n = static_cast<int>(e.size());
  if (!elastic.enabled()) return "all_reduce_mean_over: the cluster is not elastic (cluster.elastic = false)";
  const auto& members = e[0].members;
  for (int r = 1; r < n; ++r)
    if (e[r].members != members)
      return fmt::format("all_reduce_mean_over: rank {} names members [{}], rank 0 [{}]", r, fmt::join(e[r].members, ", "),
                         fmt::join(members, ", "));
  int first = -1;
  for (size_t k = 0; k < members.size(); ++k) {
    const int r = members[k];
    if (r < 0 || r >= n || (k > 0 && r <= members[k - 1]))
      return fmt::format("all_reduce_mean_over: members [{}] are not distinct ranks of 0..{} in ascending order",
                         fmt::join(members, ", "), n - 1);
    if (!e[r].tensor.defined()) continue;  // it leaves at this round
    if (!e[r].tensor.is_floating_point())
      return fmt::format("all_reduce_mean_over: rank {} passed a {} tensor", r, c10::toString(e[r].tensor.scalar_type()));
    if (first < 0) first = r;
    if (auto m = mismatch("all_reduce_mean_over", r, e[r].tensor, first, e[first].tensor); !m.empty()) return m;
  }
  return {};
}

std::string check(const Call& c, Elastic elastic) {
  const auto& e = c.entries;
  for (size_t r = 1; r < e.size(); ++r)
    if (e[r].op != e[0].op)
      return fmt::format("collective mismatch: rank 0 called {}, rank {} called {}", op_name(e[0].op), r, op_name(e[r].op));
  for (size_t r = 1; r < e.size(); ++r)
    if (e[r].counted != e[0].counted)
      return fmt::format("collective mismatch: rank {} called {} on the control channel, rank {} on the algorithm's",
                         e[0].counted ? r : 0, op_name(e[0].op), e[0].counted ? 0 : r);
  switch (e[0].op) {
    case Op::AllReduceMean: return check_all_reduce(c);
    case Op::AllReduceOver: return check_all_reduce_over(c, elastic);
    case Op::Exchange: return check_exchange(c, elastic);
    case Op::Broadcast: return check_broadcast(c);
    case Op::Barrier: return {};
  }
  return {};
}

int64_t tensor_bytes(const torch::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

// An exchange where some ranks leave (an undefined send): the others' transfers over the edges
// that remain are priced as usual; a rank that lost a peer waits until its death is detected.
std::vector<ClockUpdate> exchange_with_failures(Call& c, const NetworkModel& m, double P, Elastic elastic) {
  auto& e = c.entries;
  const int n = static_cast<int>(e.size());
  std::vector<double> t(n);
  std::vector<std::vector<int>> live(n);
  auto leaving = [&](int r) { return !e[r].peers.empty() && !e[r].tensor.defined(); };
  for (int r = 0; r < n; ++r) {
    t[r] = e[r].clock;
    if (leaving(r)) continue;
    for (int j : e[r].peers)
      if (!leaving(j)) live[r].push_back(j);
  }
  auto clocks = exchange_clocks(m, P, live, t);
  for (int r = 0; r < n; ++r) {
    c.out[r].sent = c.out[r].received = static_cast<int64_t>(P) * static_cast<int64_t>(live[r].size());
    for (int j : e[r].peers)
      if (!leaving(r) && leaving(j)) wait_for_detection(clocks, t, {r}, t[j] + elastic.heartbeat_timeout_s);
  }
  return clocks;
}

// A member all-reduce: over the members, or, when some leave, aborted at the first detection.
std::vector<ClockUpdate> all_reduce_over(Call& c, const NetworkModel& m, Elastic elastic) {
  auto& e = c.entries;
  const int n = static_cast<int>(e.size());
  std::vector<double> t(n);
  for (int r = 0; r < n; ++r) t[r] = e[r].clock;
  const auto& members = e[0].members;
  std::vector<int> staying;
  double detected = std::numeric_limits<double>::infinity();
  for (int r : members) {
    if (e[r].tensor.defined()) staying.push_back(r);
    else detected = std::min(detected, t[r] + elastic.heartbeat_timeout_s);
  }
  if (staying.size() == members.size()) {
    const torch::Tensor& x = e[members.empty() ? 0 : members.front()].tensor;
    const int64_t P = members.empty() ? 0 : m.message_bytes(tensor_bytes(x));
    for (int r : members) c.out[r].sent = c.out[r].received = ring_allreduce_bytes(P, static_cast<int>(members.size()));
    if (!members.empty()) c.result = torch::empty({x.numel()}, x.options());
    return member_all_reduce_clocks(m, static_cast<double>(P), t, members);
  }
  c.aborted = true;
  std::vector<ClockUpdate> clocks(n);
  for (int r = 0; r < n; ++r) clocks[r].end_s = t[r];
  wait_for_detection(clocks, t, staying, detected);
  return clocks;
}

void price(Call& c, const NetworkModel& m, Elastic elastic) {
  auto& e = c.entries;
  const int n = static_cast<int>(e.size());
  std::vector<double> t(n);
  for (int r = 0; r < n; ++r) t[r] = e[r].clock;
  std::vector<ClockUpdate> clocks;
  switch (e[0].op) {
    case Op::AllReduceMean: {
      const int64_t P = m.message_bytes(tensor_bytes(e[0].tensor));
      clocks = all_reduce_clocks(m, static_cast<double>(P), t);
      for (auto& o : c.out) o.sent = o.received = ring_allreduce_bytes(P, n);
      c.result = torch::empty({e[0].tensor.numel()}, e[0].tensor.options());
      break;
    }
    case Op::AllReduceOver: clocks = all_reduce_over(c, m, elastic); break;
    case Op::Exchange: {
      std::vector<std::vector<int>> peers(n);
      std::vector<double> P(n, 0.0);
      int64_t any = 0;  // a size that some rank sends (elastic runs send one size)
      bool someone_leaves = false;
      for (int r = 0; r < n; ++r) {
        peers[r] = e[r].peers;
        if (peers[r].empty()) continue;
        if (e[r].tensor.defined()) any = m.message_bytes(tensor_bytes(e[r].tensor)), P[r] = static_cast<double>(any);
        else someone_leaves = true;
      }
      if (someone_leaves) {
        clocks = exchange_with_failures(c, m, static_cast<double>(any), elastic);
        break;
      }
      clocks = exchange_clocks(m, P, peers, t);
      for (int r = 0; r < n; ++r) {
        c.out[r].sent = static_cast<int64_t>(P[r]) * static_cast<int64_t>(peers[r].size());
        c.out[r].received = 0;
        for (int j : peers[r]) c.out[r].received += static_cast<int64_t>(P[j]);
      }
      break;
    }
    case Op::Broadcast: {
      // Priced as a pipelined chain root -> root+1 -> ... (mod n): each rank but the last
      // forwards P bytes once, each rank but the root receives them once.
      const int root = e[0].root;
      const int64_t P = m.message_bytes(tensor_bytes(e[root].tensor));
      clocks = broadcast_clocks(m, static_cast<double>(P), t);
      for (int r = 0; r < n; ++r) {
        const int pos = (r - root + n) % n;
        c.out[r].sent = pos < n - 1 ? P : 0;
        c.out[r].received = pos > 0 ? P : 0;
      }
      break;
    }
    case Op::Barrier: clocks = barrier_clocks(t); break;
  }
  for (int r = 0; r < n; ++r) c.out[r].clock = clocks[r];
}

}  // namespace

void settle(Call& call, const NetworkModel& model, Elastic elastic) {
  call.error = check(call, elastic);
  if (!call.error.empty()) call.error += fmt::format(" (collective call #{})", call.seq);
  else price(call, model, elastic);
  call.ready = true;
}

}  // namespace gasloc::comm::inproc
