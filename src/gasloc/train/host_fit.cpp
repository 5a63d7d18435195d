// Whether a job's in-process workers fit on this host; see host_fit.hpp.
#include "gasloc/train/host_fit.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "gasloc/core/cpus.hpp"
#include "gasloc/core/error.hpp"

namespace gasloc::train {

namespace {
// Beyond this many workers of one process, their threads calling OpenBLAS at once go past what
// Debian's build serves (compute_gate.hpp); below it, today's free-for-all is kept.
constexpr int kUngatedWorkers = 64;
// A worker's thread (the stack it touches) and its model's module objects.
constexpr int64_t kFixedBytes = 1 << 20;
// What every worker holds at once, though briefly, since it is not gated: a round's buffers (the
// message, what arrives, the outer step's temporaries). glibc keeps what was freed
// (model/fused.cpp keep_freed_memory), and so does the block cache of gated workers
// (core/cpu_block_cache.hpp), so the peak stays resident.
constexpr double kRoundBytesPerParam = 40;
// What a worker holds while it writes a checkpoint (its serialized bytes): beyond 64 in-process
// workers only the compute slots' holders write at once (rank_loop.cpp), below it every worker.
constexpr double kCheckpointBytesPerParam = 24;
// Measured: 256 nano GASLoC-1peer workers (vocab 1,024: 229,376 parameters; `gasloc train`, 20
// steps, H = 10, an evaluation and a checkpoint every 10) peaked at 13.5 MB each (2peer 13.6,
// DiLoCo 13.0) with checkpoints written in slots, and at 16.5 and 17.7 MB each (21 steps, the
// final checkpoint only) with every worker writing at once; parameters, gradients and state made
// 5.5 of it: a round's buffers about 31 bytes a parameter, a checkpoint's about 18. The constants
// above keep a margin over both. With the block cache (428191b) the same 2peer job peaked at
// 11.2 MB each, and 1,024 of them at 10.5 MB each.
}  // namespace

WorkerMemory estimated_worker_memory(const model::LlamaConfig& mc, int64_t batch_size, int64_t seq_len,
                                     double state_bytes_per_param) {
  const double P = static_cast<double>(mc.num_params());
  const double C = static_cast<double>(mc.dim), F = static_cast<double>(mc.ffn_hidden());
  const double T = static_cast<double>(seq_len), tokens = static_cast<double>(batch_size) * T;
  const double per_token_layer = 10 * C + 3 * F + static_cast<double>(mc.n_heads) * T;
  const double activations = 4 * tokens * (static_cast<double>(mc.n_layers) * per_token_layer + 3 * static_cast<double>(mc.vocab_size));
  return {static_cast<int64_t>(P * (8 + state_bytes_per_param + kRoundBytesPerParam)) + kFixedBytes,
          static_cast<int64_t>(activations), static_cast<int64_t>(P * kCheckpointBytesPerParam),
          static_cast<int64_t>(P * kRoundBytesPerParam)};
}

int64_t needed_bytes(const WorkerMemory& m, int64_t workers, int64_t concurrent) {
  return workers * m.state_bytes + std::min(workers, concurrent) * (m.activation_bytes + m.checkpoint_bytes);
}

int64_t reallocated_bytes(const WorkerMemory& m, int64_t workers, int64_t concurrent) {
  return workers * m.round_bytes + std::min(workers, concurrent) * (m.activation_bytes + m.checkpoint_bytes);
}

int64_t block_cache_bytes(const model::LlamaConfig& mc, const JobConfig& job, int64_t workers, int64_t concurrent) {
  // The optimizer and algorithm state is not reallocated: its size does not matter here.
  return reallocated_bytes(estimated_worker_memory(mc, job.data.batch_size, job.data.seq_len, 0.0), workers, concurrent);
}

int64_t available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream s(line);
    std::string key;
    int64_t kb = 0;
    if (s >> key >> kb && key == "MemAvailable:") return kb * 1024;
  }
  return -1;
}

std::string check_workers_fit(int64_t workers, const WorkerMemory& m, int64_t concurrent, int64_t available) {
  const double need = static_cast<double>(needed_bytes(m, workers, concurrent));
  const double per_worker = need / static_cast<double>(std::max<int64_t>(1, workers));
  const std::string line = fmt::format("memory: about {:.2f} GB for {} workers ({:.1f} MB of state and buffers each, "
                                       "{:.1f} MB of activations and checkpoint bytes for each of the {} computing at once); {} free",
                                       need / 1e9, workers, m.state_bytes / 1e6,
                                       static_cast<double>(m.activation_bytes + m.checkpoint_bytes) / 1e6,
                                       std::min(workers, concurrent),
                                       available < 0 ? std::string("unknown") : fmt::format("{:.2f} GB", available / 1e9));
  if (available >= 0 && need > 0.9 * static_cast<double>(available))
    throw ConfigError(fmt::format("config key 'cluster.workers': {} workers in this process need about {:.2f} GB "
                                  "(parameters, gradients, optimizer and algorithm state, a round's buffers, and one "
                                  "batch's activations and a checkpoint's bytes for each worker computing at once), more "
                                  "than 90% of the {:.2f} GB this host has free",
                                  workers, need / 1e9, available / 1e9),
                      fmt::format("run at most {} workers here, a smaller model (model.preset; `gasloc model-info` prints "
                                  "its size) or batch, or spread them over hosts with gasloc launch",
                                  std::max<int64_t>(1, static_cast<int64_t>(0.9 * static_cast<double>(available) / per_worker))));
  return line;
}

int planned_compute_slots(const JobConfig& job, int local_workers) {
  if (job.cluster.backend != "inproc") return 0;
  if (job.cluster.compute_slots > 0) return static_cast<int>(job.cluster.compute_slots);
  if (local_workers <= kUngatedWorkers) return 0;
  return usable_cpus();
}

}  // namespace gasloc::train
