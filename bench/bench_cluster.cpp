// Overhead of the in-process cluster: inner-step throughput of N simulated workers (threads,
// virtual clock, a synchronizer communicating every H steps) against one worker alone, in one
// run. The cluster runs twice: with the BLAS's own thread count and with one BLAS thread per
// worker, as `gasloc train` runs it (core/blas_threads.hpp). One worker alone runs with one
// stream (OpenBLAS's own threads) and with the streams `gasloc train` plans for it
// (train.streams = 0). What the cores allow at best is measured too: one single-threaded worker
// pinned to each core, all at once (they share caches and memory bandwidth, which one core alone
// does not), with no communication.
//
//   build/bench_cluster [--preset tiny] [--workers 8] [--batch 4] [--seq 64] [--steps 30] [--algo gasloc]
//                       [--data data/default] [--threads 0] [--rounds 1]
//
// --scale 1,64,256,1024 measures the simulator's overhead at those worker counts instead: wall
// seconds per simulated inner step (every worker's steps over the cluster's wall time, after a
// warm-up round of 10 steps), with the cores shared as `gasloc train` shares them
// (cluster.compute_slots: the cores beyond 64 workers), against one worker alone, lone workers
// pinned to every core, and the same workers stepped in turn without the simulator; and the
// memory each worker took (resident set, after the warm-up round) beside train/host_fit.hpp's
// estimate. Each row runs in a process of its own, as `gasloc train` runs one cluster a process:
// 1,024 workers measured after the smaller rows in the same process were up to 1.4x slower than
// alone (what the earlier rows freed, spread over glibc's arenas, faulted in again). Gated rows
// keep freed tensors for reuse as the trainer does (core/cpu_block_cache.hpp); --block-cache both
// measures each gated row without it too, in a process of its own.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <sched.h>
#include <spawn.h>
#include <sys/wait.h>
#include <sys/resource.h>
#include <unistd.h>
#include <torch/torch.h>

#include <barrier>
#include <chrono>
#include <fstream>
#include <optional>
#include <thread>

#include "gasloc/algo/algo_config.hpp"
#include "gasloc/comm/inproc.hpp"
#include "gasloc/core/blas_threads.hpp"
#include "gasloc/core/cpu_block_cache.hpp"
#include "gasloc/core/cpus.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/train/compute_gate.hpp"
#include "gasloc/train/host_fit.hpp"
#include "gasloc/train/worker.hpp"

using namespace gasloc;

namespace {

// Resident set of this process, bytes.
int64_t resident_bytes() {
  std::ifstream in("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  in >> pages >> resident;
  return resident * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

// This process's CPU seconds (user, system) and minor page faults so far.
struct Usage {
  double user = 0, sys = 0;
  int64_t faults = 0;
};
Usage usage() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto secs = [](const timeval& t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6; };
  return {secs(u.ru_utime), secs(u.ru_stime), static_cast<int64_t>(u.ru_minflt)};
}

// Seconds for `timed` steps of each of `lanes` x `per_lane` workers without the simulator: a
// thread per lane (the caller sets one LibTorch and one BLAS thread) steps its `per_lane` workers
// in turn, one step each per pass, after `warmup` steps each; `pin`: lane c runs on the c-th CPU
// this process may use. No communication, no gate, no clock. The slowest lane's seconds: the
// lanes start together.
double lone_workers_seconds(const train::JobConfig& job, const model::LlamaConfig& mc, const data::Dataset& ds, int lanes,
                            int per_lane, int64_t warmup, int64_t timed, bool pin) {
  std::barrier start(lanes);
  const std::vector<int> cpus = usable_cpu_ids();
  std::vector<double> secs(static_cast<size_t>(lanes));
  std::vector<std::thread> threads;
  for (int c = 0; c < lanes; ++c)
    threads.emplace_back([&, c] {
      if (pin) {
        cpu_set_t one_cpu;
        CPU_ZERO(&one_cpu);
        CPU_SET(cpus[static_cast<size_t>(c) % cpus.size()], &one_cpu);
        sched_setaffinity(0, sizeof(one_cpu), &one_cpu);
      }
      // Algorithm `none` never communicates, so its workers step outside the cluster's run().
      comm::InProcCluster cluster(per_lane);
      algo::AlgoConfig a;
      a.name = "none";
      std::vector<std::unique_ptr<train::Worker>> ws;
      for (int r = 0; r < per_lane; ++r)
        ws.push_back(std::make_unique<train::Worker>(job, mc, ds, cluster.comm(r), algo::make_synchronizer(a, 1, job.train.seed)));
      for (int64_t s = 0; s < warmup; ++s)
        for (auto& w : ws) w->step();
      start.arrive_and_wait();
      const auto t0 = std::chrono::steady_clock::now();
      for (int64_t s = 0; s < timed; ++s)
        for (auto& w : ws) w->step();
      secs[static_cast<size_t>(c)] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    });
  for (auto& t : threads) t.join();
  return *std::max_element(secs.begin(), secs.end());
}

// The --scale table: n workers of GASLoC-1peer (H = 10) for `steps` steps each, the first round
// (10 steps) a warm-up that allocates what a round holds, one LibTorch and one BLAS thread each
// and the cores shared as the trainer plans. Against references measured just before the row: one
// such worker alone (n workers take at best n / cores times its step), what the cores allow when
// all are busy (one lone worker pinned to each core, all at once: they share caches and memory
// bandwidth), and, beyond one worker a core, the same workers without the simulator (n / cores
// of them stepped in turn on each pinned core: what n models' memory costs on this machine,
// whatever runs them). `header`: prints the table's head; `rows`: measures and prints the rows,
// gated ones with the trainer's block cache if `block_cache`.
int scale_table(const train::JobConfig& job, const model::LlamaConfig& mc, const data::Dataset& ds, const std::vector<int>& ns,
                int64_t steps, int64_t forced_slots, bool header, bool rows, bool block_cache = true) {
  constexpr int64_t kRound = 10, kReferenceSteps = 200;
  if (steps <= kRound) throw Error(fmt::format("--scale needs --steps above {} (the first round is a warm-up)", kRound));
  torch::set_num_threads(1);
  const BlasThreads one(1);
  const int cores = usable_cpus();
  double one_step = 1e30, cores_step = 1e30;
  if (header) {
    fmt::print("bench_cluster --scale: preset {} ({:.3f}M params), B={} T={}, {} timed steps per worker after a warm-up "
               "round of {}, {} cores, one thread of everything per worker, each row a process of its own\n",
               job.model.preset.str(), mc.num_params() / 1e6, job.data.batch_size, job.data.seq_len, steps - kRound, kRound,
               cores);
    fmt::print("| workers | compute slots | block cache | wall s per simulated inner step | vs the ideal (one worker's step / {0} cores) | "
               "vs what the cores allow ({0} pinned lone workers at once) | vs the same workers without the simulator (stepped "
               "in turn on {0} pinned threads) | cores busy in user code | system share of CPU "
               "time | page faults per step | resident MB per worker | estimate MB per worker | one worker's step (s) | "
               "{0} pinned lone workers' step (s) |\n"
               "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
               cores);
    std::fflush(stdout);
  }
  if (!rows) return 0;
  for (const int n : ns) {
    one_step = std::min(one_step, lone_workers_seconds(job, mc, ds, 1, 1, kRound, kReferenceSteps, false) / kReferenceSteps);
    cores_step = std::min(cores_step, lone_workers_seconds(job, mc, ds, cores, 1, kRound, kReferenceSteps, true) /
                                          (kReferenceSteps * static_cast<double>(cores)));
    // The same n workers without the simulator: n / cores stepped in turn on each pinned core.
    double in_turn_step = 0.0;
    if (n > cores) {
      const int per_lane = (n + cores - 1) / cores;
      const int64_t passes = std::max<int64_t>(3, kReferenceSteps / per_lane);
      in_turn_step = lone_workers_seconds(job, mc, ds, cores, per_lane, 1, passes, true) /
                     (static_cast<double>(passes) * per_lane * cores);
    }
    train::JobConfig j = job;
    j.cluster.workers = n;
    j.cluster.compute_slots = forced_slots;
    const int slots = n > 1 ? train::planned_compute_slots(j, n) : 0;
    std::optional<train::ComputeGate> gate;
    if (slots > 0) gate.emplace(slots);
    std::optional<CpuBlockCache> cache;
    if (gate && block_cache) cache.emplace(train::block_cache_bytes(mc, j, n, slots));
    algo::AlgoConfig a;
    a.name = n == 1 ? "none" : "gasloc";
    a.H = kRound;
    a.topology = "1peer";
    const int64_t before = resident_bytes();
    comm::InProcCluster cluster(n, comm::NetworkModel{}, 3600.0);
    std::vector<std::unique_ptr<train::Worker>> ws;
    for (int r = 0; r < n; ++r) {
      ws.push_back(std::make_unique<train::Worker>(j, mc, ds, cluster.comm(r), algo::make_synchronizer(a, n, job.train.seed)));
      ws.back()->share_cores(gate ? &*gate : nullptr);
    }
    cluster.run([&](int r, comm::Communicator&) {
      for (int64_t s = 0; s < kRound; ++s) ws[r]->step();
    });
    const double per_worker_mb = static_cast<double>(resident_bytes() - before) / n / 1e6;
    const double state = static_cast<double>(ws[0]->optimizer_state_bytes() + ws[0]->sync_state_bytes()) / ws[0]->numel();
    const auto m = train::estimated_worker_memory(mc, j.data.batch_size, j.data.seq_len, state);
    const double estimate_mb = static_cast<double>(train::needed_bytes(m, n, slots > 0 ? slots : n)) / n / 1e6;
    const Usage u0 = usage();
    const auto t0 = std::chrono::steady_clock::now();
    cluster.run([&](int r, comm::Communicator&) {
      for (int64_t s = kRound; s < steps; ++s) ws[r]->step();
    });
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const Usage u1 = usage();
    const double worker_steps = static_cast<double>(n) * static_cast<double>(steps - kRound);
    const double per_step = wall / worker_steps;
    const int busy = std::min(n, cores);
    fmt::print("| {} | {} | {} | {:.5f} | {:.2f} | {:.2f} | {} | {:.2f} | {:.0f}% | {:.0f} | {:.1f} | {:.1f} | {:.5f} | {:.5f} |\n", n,
               slots > 0 ? fmt::format("{}", slots) : "no gate", cache ? "yes" : "no", per_step, per_step / (one_step / busy),
               per_step / (n >= cores ? cores_step : one_step / busy),
               in_turn_step > 0 ? fmt::format("{:.2f}", per_step / in_turn_step) : "-", (u1.user - u0.user) / wall,
               100 * (u1.sys - u0.sys) / std::max(1e-9, (u1.user - u0.user) + (u1.sys - u0.sys)),
               static_cast<double>(u1.faults - u0.faults) / worker_steps, per_worker_mb, estimate_mb, one_step,
               cores_step * cores);
    std::fflush(stdout);
  }
  return 0;
}

// Runs this program again with its arguments and `--scale-row n`: one row of the --scale table in
// a process of its own, printing to this one's output.
void run_row_process(int argc, char** argv, int n, bool block_cache) {
  std::vector<std::string> args(argv, argv + argc);
  args.insert(args.end(), {"--scale-row", std::to_string(n), "--row-block-cache", block_cache ? "1" : "0"});
  std::vector<char*> cargs;
  for (auto& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  pid_t pid = 0;
  if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, cargs.data(), environ) != 0)
    throw Error(fmt::format("--scale: could not start the process for {} workers", n));
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw Error(fmt::format("--scale: the row of {} workers failed (status {})", n, status));
}

}  // namespace

int main(int argc, char** argv) {
  std::string preset = "tiny", algo_name = "gasloc", data_dir = "data/default";
  int workers = 8;
  int64_t batch = 4, seq = 64, steps = 30, threads = 0;
  int rounds = 1;
  std::vector<int> scale;
  int64_t slots = 0;
  int scale_row = 0;
  std::string block_cache = "on";
  bool row_block_cache = true;
  CLI::App app{"Inner-step throughput of an in-process cluster of N workers against one worker alone, in one run"};
  app.add_option("--preset", preset, "model preset")->capture_default_str();
  app.add_option("--workers", workers, "workers of the cluster")->check(CLI::Range(1, 256))->capture_default_str();
  app.add_option("--batch", batch, "sequences per step and worker")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--seq", seq, "tokens per sequence")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--steps", steps, "steps per worker (the first is a warm-up)")->check(CLI::Range(2, 1000000))->capture_default_str();
  app.add_option("--algo", algo_name, "synchronizer of the cluster (gasloc, diloco, ...)")->capture_default_str();
  app.add_option("--data", data_dir, "prepared dataset (its tokenizer sets the vocabulary)")->capture_default_str();
  app.add_option("--threads", threads, "LibTorch intra-op threads for the one-worker run (0 = its default)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--rounds", rounds, "alternations of one worker and the cluster (the fastest of each reported)")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  app.add_option("--scale", scale, "worker counts for the simulator's overhead table (e.g. 1,64,256,1024), instead of the rest")
      ->delimiter(',')
      ->check(CLI::Range(1, 4096));
  app.add_option("--slots", slots, "--scale: cluster.compute_slots for every row but the first (0: the trainer's plan)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--block-cache", block_cache, "--scale: gated rows with the trainer's cache of freed tensors (on), without (off), or each both ways")
      ->check(CLI::IsMember({"on", "off", "both"}))
      ->capture_default_str();
  app.add_option("--row-block-cache", row_block_cache, "--scale-row: with the block cache (1) or without (0)");
  app.add_option("--scale-row", scale_row, "--scale: measure and print only the row of this many workers (each row's process)")
      ->check(CLI::Range(1, 4096));
  CLI11_PARSE(app, argc, argv);
  try {
  const auto job = train::load_job("", {"model.preset=" + preset, "data.dir=" + data_dir, "data.batch_size=" + std::to_string(batch),
                                        "data.seq_len=" + std::to_string(seq), "train.steps=1000"});
  const auto ds = data::Dataset::open(job.data.dir);
  const auto mc = job.model.resolve(ds.vocab_size);
  // Seconds for `steps` inner steps of every worker of an n-worker cluster (workers with `streams`
  // batch streams each).
  auto time_cluster = [&](int n, const std::string& name, int64_t streams = 1) {
    train::JobConfig j = job;
    j.train.streams = streams;
    algo::AlgoConfig a;
    a.name = name;
    a.H = 10;
    a.topology = n >= 3 ? "2peer" : "complete";
    comm::InProcCluster cluster(n);
    std::vector<std::unique_ptr<train::Worker>> ws;
    for (int r = 0; r < n; ++r)
      ws.push_back(std::make_unique<train::Worker>(j, mc, ds, cluster.comm(r), algo::make_synchronizer(a, n, job.train.seed)));
    cluster.run([&](int r, comm::Communicator&) { ws[r]->step(); });  // warm-up
    const auto t0 = std::chrono::steady_clock::now();
    cluster.run([&](int r, comm::Communicator&) {
      for (int64_t s = 1; s < steps; ++s) ws[r]->step();
    });
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  // Seconds for `steps` inner steps of `cores` lone workers at once, each pinned to its own core.
  auto time_pinned = [&](int cores) { return lone_workers_seconds(job, mc, ds, cores, 1, 1, steps - 1, true); };
  if (scale_row > 0) return scale_table(job, mc, ds, {scale_row}, steps, slots, false, true, row_block_cache);
  if (!scale.empty()) {
    scale_table(job, mc, ds, scale, steps, slots, true, false);
    train::JobConfig planned = job;
    planned.cluster.compute_slots = slots;
    for (const int n : scale) {
      const bool gated = n > 1 && train::planned_compute_slots(planned, n) > 0;
      if (block_cache != "off" || !gated) run_row_process(argc, argv, n, true);
      if (block_cache != "on" && gated) run_row_process(argc, argv, n, false);
    }
    return 0;
  }
  const double tokens = static_cast<double>(batch * seq * (steps - 1));
  const int64_t planned = train::planned_streams(0, "cpu", batch, 1, usable_cpus());
  const int default_threads = torch::get_num_threads();
  const int one_threads = threads > 0 ? static_cast<int>(threads) : default_threads;
  // One worker and the cluster with one BLAS thread each alternate `rounds` times and the fastest
  // of each is kept: on a shared machine other work only ever slows a run, and alternating
  // exposes both to it alike.
  std::vector<double> t1s, t1plans, tn1s, tcores, tpinned;
  bool blas_control = false;
  const int cores = usable_cpus();
  for (int r = 0; r < rounds; ++r) {
    torch::set_num_threads(one_threads);
    t1s.push_back(time_cluster(1, "none"));
    {
      const BlasThreads plan_blas(planned > 1 ? 1 : 0);  // the trainer's plan: streams are the threads
      t1plans.push_back(time_cluster(1, "none", planned));
    }
    {
      // One core's work: one worker with one thread of everything, pinned to the first CPU this
      // process may use (its thread inherits this thread's affinity). `cores` times this is what
      // the cores can do at best.
      cpu_set_t all, one_cpu;
      sched_getaffinity(0, sizeof(all), &all);
      CPU_ZERO(&one_cpu);
      CPU_SET(usable_cpu_ids().front(), &one_cpu);
      sched_setaffinity(0, sizeof(one_cpu), &one_cpu);
      torch::set_num_threads(1);
      const BlasThreads single(1);
      tcores.push_back(time_cluster(1, "none"));
      sched_setaffinity(0, sizeof(all), &all);
      tpinned.push_back(time_pinned(cores));
    }
    torch::set_num_threads(default_threads);  // the cluster's workers are the threads
    const BlasThreads one(1);
    blas_control = one.active();
    tn1s.push_back(time_cluster(workers, algo_name));
  }
  const double tn = time_cluster(workers, algo_name);
  const double t1 = *std::min_element(t1s.begin(), t1s.end()), tn1 = *std::min_element(tn1s.begin(), tn1s.end());
  const double tps1 = tokens / t1, tpsn = tokens * workers / tn, tpsn1 = tokens * workers / tn1;
  const double tps_core = tokens / *std::min_element(tcores.begin(), tcores.end());
  const double tps_plan = tokens / *std::min_element(t1plans.begin(), t1plans.end());
  const double tps_pinned = tokens * cores / *std::min_element(tpinned.begin(), tpinned.end());
  fmt::print("bench_cluster: preset {} ({:.2f}M params), B={} T={}, {} timed steps per worker, torch threads {} (one worker: {})\n",
             preset, mc.num_params() / 1e6, batch, seq, steps - 1, default_threads, one_threads);
  fmt::print("| setup | tokens/s (all workers) | vs one worker |\n| --- | --- | --- |\n");
  fmt::print("| 1 worker alone, train.streams = 1 (OpenBLAS's own threads) | {:.0f} | 1.00 |\n", tps1);
  fmt::print("| 1 worker alone, train.streams = 0 (auto: {} streams, 1 BLAS thread each) | {:.0f} | {:.2f} |\n", planned, tps_plan,
             tps_plan / tps1);
  fmt::print("| 1 worker alone on one core (1 LibTorch and 1 BLAS thread, pinned to the first CPU this process may use) | {:.0f} | {:.2f} |\n", tps_core,
             tps_core / tps1);
  fmt::print("| {} lone workers at once, each pinned to its own core, 1 thread of everything | {:.0f} | {:.2f} |\n", cores,
             tps_pinned, tps_pinned / tps1);
  fmt::print("| {} workers, {} (H = 10, 2peer), in-process, BLAS's own thread count | {:.0f} | {:.2f} |\n", workers,
             algo_name, tpsn, tpsn / tps1);
  fmt::print("| {} workers, {} (H = 10, 2peer), in-process, 1 BLAS thread each{} | {:.0f} | {:.2f} |\n", workers, algo_name,
             blas_control ? "" : " (no BLAS thread control: same as above)", tpsn1, tpsn1 / tps1);
  fmt::print("one BLAS thread per worker: {:.2f}x the cluster's throughput with the BLAS's own thread count\n",
             tpsn1 / tpsn);
  fmt::print("{} workers, 1 BLAS thread each: {:.0f}% of {} cores x one core's worker alone ({:.0f} tokens/s); {:.0f}% of {} "
             "pinned lone workers at once ({:.0f} tokens/s), what the cores allow when all are busy\n",
             workers, 100 * tpsn1 / (cores * tps_core), cores, cores * tps_core, 100 * tpsn1 / tps_pinned, cores, tps_pinned);
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_cluster: {}\n", e.what());
    return 1;
  }
  return 0;
}
