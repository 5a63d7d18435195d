// Overhead of the in-process cluster: inner-step throughput of N simulated workers (threads,
// virtual clock, a synchronizer communicating every H steps) against one worker alone, in one
// run. The CPU is shared by the workers, so the ideal total throughput equals one worker's;
// the gap is the per-worker cost of threads, synchronizer and clock. The cluster runs twice: with
// the BLAS's own thread count and with one BLAS thread per worker, as `gasloc train` runs it
// (core/blas_threads.hpp).
//
//   build/bench_cluster [--preset tiny] [--workers 8] [--batch 4] [--seq 64] [--steps 30] [--algo gasloc]
#include <fmt/format.h>
#include <torch/torch.h>

#include <chrono>

#include "gasloc/algo/algo_config.hpp"
#include "gasloc/comm/inproc.hpp"
#include "gasloc/core/blas_threads.hpp"
#include "gasloc/train/worker.hpp"

using namespace gasloc;

int main(int argc, char** argv) {
  std::string preset = "tiny", algo_name = "gasloc", data_dir = "data/default";
  int workers = 8;
  int64_t batch = 4, seq = 64, steps = 30;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--preset") preset = v;
    else if (k == "--workers") workers = std::stoi(v);
    else if (k == "--batch") batch = std::stoll(v);
    else if (k == "--seq") seq = std::stoll(v);
    else if (k == "--steps") steps = std::stoll(v);
    else if (k == "--algo") algo_name = v;
    else if (k == "--data") data_dir = v;
    else {
      fmt::print(stderr, "unknown option {}\n", k);
      return 2;
    }
  }
  const auto job = train::load_job("", {"model.preset=" + preset, "data.dir=" + data_dir, "data.batch_size=" + std::to_string(batch),
                                        "data.seq_len=" + std::to_string(seq), "train.steps=1000"});
  const auto ds = data::Dataset::open(job.data.dir);
  const auto mc = job.model.resolve(ds.vocab_size);
  // Seconds for `steps` inner steps of every worker of an n-worker cluster.
  auto time_cluster = [&](int n, const std::string& name) {
    algo::AlgoConfig a;
    a.name = name;
    a.H = 10;
    a.topology = n >= 3 ? "2peer" : "complete";
    comm::InProcCluster cluster(n);
    std::vector<std::unique_ptr<train::Worker>> ws;
    for (int r = 0; r < n; ++r)
      ws.push_back(std::make_unique<train::Worker>(job, mc, ds, cluster.comm(r), algo::make_synchronizer(a, n, job.train.seed)));
    cluster.run([&](int r, comm::Communicator&) { ws[r]->step(); });  // warm-up
    const auto t0 = std::chrono::steady_clock::now();
    cluster.run([&](int r, comm::Communicator&) {
      for (int64_t s = 1; s < steps; ++s) ws[r]->step();
    });
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  const double tokens = static_cast<double>(batch * seq * (steps - 1));
  const double t1 = time_cluster(1, "none");
  const double tn = time_cluster(workers, algo_name);
  double tn1 = 0;
  bool blas_control = false;
  {
    const BlasThreads one(1);
    blas_control = one.active();
    tn1 = time_cluster(workers, algo_name);
  }
  const double tps1 = tokens / t1, tpsn = tokens * workers / tn, tpsn1 = tokens * workers / tn1;
  fmt::print("bench_cluster: preset {} ({:.2f}M params), B={} T={}, {} timed steps per worker, torch threads {}\n", preset,
             mc.num_params() / 1e6, batch, seq, steps - 1, torch::get_num_threads());
  fmt::print("| setup | tokens/s (all workers) | vs one worker |\n| --- | --- | --- |\n");
  fmt::print("| 1 worker alone | {:.0f} | 1.00 |\n", tps1);
  fmt::print("| {} workers, {} (H = 10, 2peer), in-process, BLAS's own thread count | {:.0f} | {:.2f} |\n", workers,
             algo_name, tpsn, tpsn / tps1);
  fmt::print("| {} workers, {} (H = 10, 2peer), in-process, 1 BLAS thread each{} | {:.0f} | {:.2f} |\n", workers, algo_name,
             blas_control ? "" : " (no BLAS thread control: same as above)", tpsn1, tpsn1 / tps1);
  fmt::print("one BLAS thread per worker: {:.2f}x the cluster's throughput with the BLAS's own thread count\n",
             tpsn1 / tpsn);
  return 0;
}
