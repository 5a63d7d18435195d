// `gasloc comm-check`: a diagnostic that runs inside a launched process group (gasloc launch or
// torchrun) and checks the communication backend against exact expectations. Every input is a
// pure function of (rank, round), so each rank regenerates all ranks' inputs and computes the
// in-process reference itself (sum in rank order 0..n-1, then divide by n); no reference file is
// needed. Used by the tests, scripts/gpu_check.sh and as a first check of a new cluster.
//
//   gasloc launch -n 4 -- gasloc comm-check [--backend gloo] [--numel 100000] [--out DIR]
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>

#include "commands.hpp"
#include "gasloc/comm/cluster.hpp"
#include "gasloc/comm/process_group.hpp"
#include "gasloc/comm/rendezvous.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/core/secret.hpp"

namespace gasloc::app {

namespace {

// Integer-valued data: every partial sum is exact in fp32, so every backend must agree bit for bit.
torch::Tensor integer_input(int rank, int64_t numel) {
  return (torch::arange(numel, torch::kInt64).remainder(100) + rank).to(torch::kFloat);
}

torch::Tensor random_input(int rank, int64_t numel) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(1234 + rank));
  return torch::randn({numel}, gen, torch::kFloat);
}

// What rank `rank` sends in exchange round `round`: distinct per rank and round, so a message
// from the wrong peer or the wrong round cannot pass for the right one.
torch::Tensor exchange_input(int rank, int round, int64_t numel) {
  return torch::arange(numel, torch::kFloat).mul_(1e-3).add_(static_cast<double>(rank * 1000 + round));
}

// The in-process reference: sum in rank order, then divide.
torch::Tensor rank_order_mean(int world, const std::function<torch::Tensor(int)>& input) {
  torch::Tensor sum = input(0).clone();
  for (int r = 1; r < world; ++r) sum.add_(input(r));
  return sum.div_(world);
}

// 1peer pairs (0-1, 2-3, ...; with odd n the last rank sits out) and the ring (prev, next).
std::vector<int> pair_peers(int r, int n) {
  const int p = r ^ 1;
  return p < n ? std::vector<int>{p} : std::vector<int>{};
}
std::vector<int> ring_peers(int r, int n) {
  if (n == 1) return {};
  if (n == 2) return {1 - r};
  return {(r + n - 1) % n, (r + 1) % n};
}

struct CheckOptions {
  std::string backend = "gloo", out;
  int64_t numel = 100000;
  int rounds = 2;
  int die_rank = -1, mismatch_rank = -1, stall_rank = -1;
  std::string stall_at = "exchange";
  double measure_mb = 0;
  double timeout = 0;
  std::string bandwidth, job_id, secret_file;
};

double max_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return a.numel() == 0 ? 0.0 : (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
}
double checksum(const torch::Tensor& a) { return a.to(torch::kDouble).sum().item<double>(); }

// One rank's checks, each against the reference it computes itself, and its report.
class Checker {
 public:
  Checker(const CheckOptions& o, comm::ProcessGroupComm& c)
      : o_(o), c_(c), r_(c.rank()), n_(c.world()), N_(o.numel),
        report_({{"rank", r_}, {"world", n_}, {"backend", o.backend}, {"numel", N_}}) {}

  // 1. all_reduce_mean on integer-valued data: exact. 2. On random data: within fp32 rounding
  // of the rank-order sum.
  void all_reduces() {
    stall_if_asked("all_reduce");
    torch::Tensor t = integer_input(r_, N_);
    c_.all_reduce_mean(t);
    torch::Tensor ref = rank_order_mean(n_, [&](int q) { return integer_input(q, N_); });
    record("all_reduce_mean_integer", torch::equal(t, ref), max_diff(t, ref), checksum(t));
    t = random_input(r_, N_);
    c_.all_reduce_mean(t);
    ref = rank_order_mean(n_, [&](int q) { return random_input(q, N_); });
    const double d = max_diff(t, ref);
    record("all_reduce_mean_random", d <= 1e-6, d, checksum(t));
  }

  // 3. Exchanges: pairs then ring, `rounds` times; received tensors must be the peers' exactly.
  void exchanges() {
    if (r_ == o_.die_rank) {
      fmt::print("comm-check rank {}: exiting abruptly before the exchange (--die-rank {})\n", r_, r_);
      std::fflush(stdout);
      ::_exit(3);  // no destructors: the sockets close as if the process had crashed
    }
    stall_if_asked("exchange");
    std::vector<torch::Tensor> recv;
    for (int round = 0; round < o_.rounds; ++round)
      for (const char* kind : {"pairs", "ring"}) {
        const bool ring = kind[0] == 'r';
        const auto peers = ring ? ring_peers(r_, n_) : pair_peers(r_, n_);
        const int tag = round * 2 + (ring ? 1 : 0);
        c_.exchange(peers, exchange_input(r_, tag, N_ + (r_ == o_.mismatch_rank ? 1 : 0)), recv);
        bool ok = recv.size() == peers.size();
        double worst = 0, check = 0;
        for (size_t k = 0; ok && k < peers.size(); ++k) {
          const auto expect = exchange_input(peers[k], tag, N_);
          ok = recv[k].sizes() == expect.sizes() && torch::equal(recv[k], expect);
          if (recv[k].sizes() == expect.sizes()) worst = std::max(worst, max_diff(recv[k], expect));
          check += checksum(recv[k]);
        }
        record(fmt::format("exchange_{}_round{}", kind, round), ok, worst, check);
      }
  }

  // 4. broadcast from the last rank, then a barrier.
  void broadcast() {
    const int root = n_ - 1;
    torch::Tensor t = r_ == root ? exchange_input(root, 99, N_) : torch::zeros({N_});
    c_.broadcast(t, root);
    const torch::Tensor ref = exchange_input(root, 99, N_);
    record("broadcast", torch::equal(t, ref), max_diff(t, ref), checksum(t));
    c_.barrier();
  }

  // 5. Real link rates: rank r and rank 0 swap a buffer while the others wait (an exchange with
  //    no peers), so each rank's rate is its own link's (rank 0 must be unimpeded).
  void measure_bandwidth() {
    if (o_.measure_mb <= 0 || n_ == 1) return;
    const auto big = torch::ones({static_cast<int64_t>(o_.measure_mb * 1e6 / 4)}, torch::kFloat);
    std::vector<torch::Tensor> recv;
    for (int q = 1; q < n_; ++q) {
      const std::vector<int> peers = r_ == 0 ? std::vector<int>{q} : r_ == q ? std::vector<int>{0} : std::vector<int>{};
      c_.barrier();
      if (r_ == q) {
        // Printed once the ranks have met, so a watcher (tests/netns_launch.sh) can disturb this
        // link while its exchange is under way rather than while the ranks are still meeting.
        fmt::print("comm-check rank {}/{}: measuring the exchange rate with rank 0\n", r_, n_);
        std::fflush(stdout);
      }
      const auto t0 = std::chrono::steady_clock::now();
      c_.exchange(peers, big, recv);
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (r_ != q) continue;
      const double rate = static_cast<double>(big.numel() * 4) / dt;
      report_["bandwidth_Bps"] = rate;
      fmt::print("comm-check rank {}/{}: exchange rate with rank 0 {:.3f} MB/s ({:.1f} MB in {:.2f} s)\n", r_, n_,
                 rate / 1e6, static_cast<double>(big.numel() * 4) / 1e6, dt);
      std::fflush(stdout);
    }
  }

  // The summary line and --out's report; the exit status.
  int finish() {
    const auto s = c_.stats();
    report_["ok"] = all_ok_;
    report_["stats"] = {{"bytes_sent", s.bytes_sent}, {"bytes_received", s.bytes_received}, {"idle_s", s.idle_s}};
    if (!o_.out.empty()) {
      std::filesystem::create_directories(o_.out);
      std::ofstream(std::filesystem::path(o_.out) / fmt::format("rank{}.json", r_)) << report_.dump(2) << "\n";
    }
    fmt::print("comm-check rank {}/{}: {} (sent {} bytes, received {}, idle {:.3f} s)\n", r_, n_,
               all_ok_ ? "all checks passed" : "FAILED", s.bytes_sent, s.bytes_received, s.idle_s);
    return all_ok_ ? 0 : 1;
  }

 private:
  void record(const std::string& name, bool ok, double diff, double sum) {
    report_["checks"][name] = {{"ok", ok}, {"max_diff", diff}, {"checksum", sum}};
    all_ok_ = all_ok_ && ok;
    fmt::print("comm-check rank {}/{}: {:<24} {} (max |diff| {:.3g}, checksum {:.17g})\n", r_, n_, name,
               ok ? "ok" : "MISMATCH", diff, sum);
    std::fflush(stdout);
  }
  void stall_if_asked(const char* where) {
    if (r_ != o_.stall_rank || o_.stall_at != where) return;
    fmt::print("comm-check rank {}: stopping itself before the {} (--stall-rank {})\n", r_, where, r_);
    std::fflush(stdout);
    ::raise(SIGSTOP);  // alive, connections open, silent: its peers must time out naming it
  }

  const CheckOptions& o_;
  comm::ProcessGroupComm& c_;
  int r_, n_;
  int64_t N_;
  nlohmann::json report_;
  bool all_ok_ = true;
};

// The rank's process group from the launcher's variables and the options.
std::unique_ptr<comm::ProcessGroupComm> join(const CheckOptions& o) {
  comm::check_process_backend(o.backend);  // before the launcher's variables
  auto opts = comm::gloo_options_from_env();
  if (o.timeout < 0) throw Error(fmt::format("comm-check: --timeout {} must be positive", o.timeout));
  if (o.timeout > 0) opts.timeout_s = o.timeout;
  if (!o.job_id.empty()) {
    opts.job = {o.job_id, "--job-id " + o.job_id, {}};
    opts.agent_store = false;  // gasloc launch or gasloc store hosts gasloc's store
  } else {
    opts.job = {comm::derive_job_token("gasloc comm-check"), "gasloc comm-check", {}};
  }
  if (!o.secret_file.empty()) opts.job.secret = read_secret_file(o.secret_file);
  if (!o.bandwidth.empty()) opts.bandwidth_limit_Bps = comm::parse_bandwidth_limit(o.bandwidth, opts.rank);
  return comm::make_process_group(o.backend, opts);
}

}  // namespace

Action add_comm_check(CLI::App& app) {
  auto o = std::make_shared<CheckOptions>();
  app.add_option("--backend", o->backend, "gloo or nccl")->capture_default_str();
  app.add_option("--numel", o->numel, "elements per buffer")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--rounds", o->rounds, "exchange rounds (pairs then ring each round)")->capture_default_str();
  app.add_option("--out", o->out, "write DIR/rank<r>.json with every check and checksum");
  app.add_option("--timeout", o->timeout, "communication timeout in seconds (default 60; gasloc launch --timeout sets it)");
  app.add_option("--bandwidth-limit", o->bandwidth,
                 "throttle this rank's link: BYTES_PER_S for every rank, or RANK=BYTES_PER_S,... (gasloc launch passes it)");
  app.add_option("--die-rank", o->die_rank, "fault injection: this rank exits abruptly (status 3) before its first exchange");
  app.add_option("--measure-bandwidth", o->measure_mb,
                 "then measure each rank's real exchange rate: rank r swaps MB megabytes with rank 0, one rank at a time");
  app.add_option("--stall-rank", o->stall_rank, "fault injection: this rank stops itself (SIGSTOP) before its first exchange");
  app.add_option("--mismatch-rank", o->mismatch_rank, "fault injection: this rank exchanges one element more than the others");
  app.add_option("--stall-at", o->stall_at, "with --stall-rank: stop before the first all_reduce or the first exchange")
      ->check(CLI::IsMember({"all_reduce", "exchange"}))
      ->capture_default_str();
  app.add_option("--job-id", o->job_id, "the job token gasloc launch hands its ranks, or a gasloc store's --job-id (otherwise every comm-check is one job)");
  app.add_option("--secret-file", o->secret_file,
                 "the job's secret (as cluster.secret_file; gasloc launch --secret-file passes it on)");
  return [o]() {
    const auto comm = join(*o);
    Checker check(*o, *comm);
    check.all_reduces();
    check.exchanges();
    check.broadcast();
    check.measure_bandwidth();
    return check.finish();
  };
}

}  // namespace gasloc::app
