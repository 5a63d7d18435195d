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

}  // namespace

Action add_comm_check(CLI::App& app) {
  struct Opts {
    std::string backend = "gloo", out;
    int64_t numel = 100000;
    int rounds = 2;
    int die_rank = -1, mismatch_rank = -1, stall_rank = -1;
    std::string stall_at = "exchange";
    double measure_mb = 0;
    double timeout = 0;
    std::string bandwidth, job_id;
  };
  auto o = std::make_shared<Opts>();
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
  app.add_option("--job-id", o->job_id, "the job token gasloc launch hands its ranks (by hand: every comm-check is one job)");
  return [o]() {
    comm::check_process_backend(o->backend);  // before the launcher's variables
    auto opts = comm::gloo_options_from_env();
    if (o->timeout < 0) throw Error(fmt::format("comm-check: --timeout {} must be positive", o->timeout));
    if (o->timeout > 0) opts.timeout_s = o->timeout;
    if (!o->job_id.empty()) {
      opts.job = {o->job_id, "gasloc launch job " + o->job_id};
      opts.agent_store = false;  // gasloc launch hosts gasloc's store
    } else {
      opts.job = {comm::derive_job_token("gasloc comm-check"), "gasloc comm-check"};
    }
    if (!o->bandwidth.empty()) opts.bandwidth_limit_Bps = comm::parse_bandwidth_limit(o->bandwidth, opts.rank);
    auto comm = comm::make_process_group(o->backend, opts);
    const int r = comm->rank(), n = comm->world();
    const int64_t N = o->numel;
    nlohmann::json report = {{"rank", r}, {"world", n}, {"backend", o->backend}, {"numel", N}};
    bool all_ok = true;
    auto record = [&](const std::string& name, bool ok, double max_diff, double checksum) {
      report["checks"][name] = {{"ok", ok}, {"max_diff", max_diff}, {"checksum", checksum}};
      all_ok = all_ok && ok;
      fmt::print("comm-check rank {}/{}: {:<24} {} (max |diff| {:.3g}, checksum {:.17g})\n", r, n, name,
                 ok ? "ok" : "MISMATCH", max_diff, checksum);
      std::fflush(stdout);
    };
    auto diff = [](const torch::Tensor& a, const torch::Tensor& b) {
      return a.numel() == 0 ? 0.0 : (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
    };
    auto sum = [](const torch::Tensor& a) { return a.to(torch::kDouble).sum().item<double>(); };

    auto stall_if_asked = [&](const char* where) {
      if (r != o->stall_rank || o->stall_at != where) return;
      fmt::print("comm-check rank {}: stopping itself before the {} (--stall-rank {})\n", r, where, r);
      std::fflush(stdout);
      ::raise(SIGSTOP);  // alive, connections open, silent: its peers must time out naming it
    };
    // 1. all_reduce_mean on integer-valued data: exact.
    stall_if_asked("all_reduce");
    torch::Tensor t = integer_input(r, N);
    comm->all_reduce_mean(t);
    torch::Tensor ref = rank_order_mean(n, [&](int q) { return integer_input(q, N); });
    record("all_reduce_mean_integer", torch::equal(t, ref), diff(t, ref), sum(t));
    // 2. all_reduce_mean on random data: within fp32 rounding of the rank-order sum.
    t = random_input(r, N);
    comm->all_reduce_mean(t);
    ref = rank_order_mean(n, [&](int q) { return random_input(q, N); });
    const double d = diff(t, ref);
    record("all_reduce_mean_random", d <= 1e-6, d, sum(t));
    // 3. Exchanges: pairs then ring, `rounds` times; received tensors must be the peers' exactly.
    if (r == o->die_rank) {
      fmt::print("comm-check rank {}: exiting abruptly before the exchange (--die-rank {})\n", r, r);
      std::fflush(stdout);
      ::_exit(3);  // no destructors: the sockets close as if the process had crashed
    }
    stall_if_asked("exchange");
    std::vector<torch::Tensor> recv;
    for (int round = 0; round < o->rounds; ++round) {
      for (const char* kind : {"pairs", "ring"}) {
        const bool ring = kind[0] == 'r';
        const auto peers = ring ? ring_peers(r, n) : pair_peers(r, n);
        const int tag = round * 2 + (ring ? 1 : 0);
        torch::Tensor send = exchange_input(r, tag, N + (r == o->mismatch_rank ? 1 : 0));
        comm->exchange(peers, send, recv);
        bool ok = recv.size() == peers.size();
        double worst = 0, check = 0;
        for (size_t k = 0; ok && k < peers.size(); ++k) {
          const auto expect = exchange_input(peers[k], tag, N);
          ok = recv[k].sizes() == expect.sizes() && torch::equal(recv[k], expect);
          if (recv[k].sizes() == expect.sizes()) worst = std::max(worst, diff(recv[k], expect));
          check += sum(recv[k]);
        }
        record(fmt::format("exchange_{}_round{}", kind, round), ok, worst, check);
      }
    }
    // 4. broadcast from the last rank.
    const int root = n - 1;
    t = r == root ? exchange_input(root, 99, N) : torch::zeros({N});
    comm->broadcast(t, root);
    ref = exchange_input(root, 99, N);
    record("broadcast", torch::equal(t, ref), diff(t, ref), sum(t));
    comm->barrier();
    // 5. Real link rates: rank r and rank 0 swap a buffer while the others wait (an exchange
    //    with no peers), so each rank's rate is its own link's (rank 0 must be unimpeded).
    if (o->measure_mb > 0 && n > 1) {
      const auto big = torch::ones({static_cast<int64_t>(o->measure_mb * 1e6 / 4)}, torch::kFloat);
      for (int q = 1; q < n; ++q) {
        const std::vector<int> peers = r == 0 ? std::vector<int>{q} : r == q ? std::vector<int>{0} : std::vector<int>{};
        comm->barrier();
        if (r == q) {
          // Printed once the ranks have met, so a watcher (tests/netns_launch.sh) can disturb this
          // link while its exchange is under way rather than while the ranks are still meeting.
          fmt::print("comm-check rank {}/{}: measuring the exchange rate with rank 0\n", r, n);
          std::fflush(stdout);
        }
        const auto t0 = std::chrono::steady_clock::now();
        comm->exchange(peers, big, recv);
        const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (r == q) {
          const double rate = static_cast<double>(big.numel() * 4) / dt;
          report["bandwidth_Bps"] = rate;
          fmt::print("comm-check rank {}/{}: exchange rate with rank 0 {:.3f} MB/s ({:.1f} MB in {:.2f} s)\n", r, n,
                     rate / 1e6, static_cast<double>(big.numel() * 4) / 1e6, dt);
          std::fflush(stdout);
        }
      }
    }
    const auto s = comm->stats();
    report["ok"] = all_ok;
    report["stats"] = {{"bytes_sent", s.bytes_sent}, {"bytes_received", s.bytes_received}, {"idle_s", s.idle_s}};
    if (!o->out.empty()) {
      std::filesystem::create_directories(o->out);
      std::ofstream(std::filesystem::path(o->out) / fmt::format("rank{}.json", r)) << report.dump(2) << "\n";
    }
    fmt::print("comm-check rank {}/{}: {} (sent {} bytes, received {}, idle {:.3f} s)\n", r, n,
               all_ok ? "all checks passed" : "FAILED", s.bytes_sent, s.bytes_received, s.idle_s);
    return all_ok ? 0 : 1;
  };
}

}  // namespace gasloc::app
