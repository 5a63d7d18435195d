// Whether a job's in-process workers fit on this host: the memory they need against what it has
// free, and how many of them compute at once (compute_gate.hpp). Checked at the run's start,
// before the workers are made, so that a job too large is refused with its estimate instead of
// being killed by the kernel's OOM killer an hour in.
#pragma once
#include <cstdint>
#include <string>

#include "gasloc/model/llama.hpp"
#include "gasloc/train/job_config.hpp"

namespace gasloc::train {

// One worker's memory, estimated from the model's shape and the job's batch.
struct WorkerMemory {
  // Held for the whole run: parameters, gradients, `state_bytes_per_param` of optimizer and
  // algorithm state, a fixed part for its thread and model objects, and the buffers every worker
  // holds at once at a round's end (40 bytes a parameter, measured: host_fit.cpp).
  int64_t state_bytes = 0;
  // Held while it steps: the activations autograd keeps for one batch (fp32: per token and layer
  // the block's inputs, projections, attention weights over the sequence and the SwiGLU's three
  // widths; per token the logits three times: values, softmax, gradient). Freed after the step,
  // so only the workers computing at once hold them.
  int64_t activation_bytes = 0;
  // Held while it writes a checkpoint: the serialized bytes (24 bytes a parameter, measured).
  // Workers that share the cores write in turns (rank_loop.cpp), so, like the activations, only
  // those computing at once hold them.
  int64_t checkpoint_bytes = 0;
  // Of state_bytes, the round's buffers: freed after each round and allocated again at the next.
  int64_t round_bytes = 0;
};
WorkerMemory estimated_worker_memory(const model::LlamaConfig& mc, int64_t batch_size, int64_t seq_len,
                                     double state_bytes_per_param);
// `workers` workers' state, and the activations and checkpoint bytes of the `concurrent` of them
// that compute at once.
int64_t needed_bytes(const WorkerMemory& m, int64_t workers, int64_t concurrent);
// What `workers` workers free and allocate again, step after step and round after round: every
// worker's round buffers, and the activations and checkpoint bytes of the `concurrent` of them
// that compute at once. A cache of freed blocks (core/cpu_block_cache.hpp) never needs more.
int64_t reallocated_bytes(const WorkerMemory& m, int64_t workers, int64_t concurrent);
// The bound of that cache for `workers` workers of `job`'s batch: their reallocated_bytes.
int64_t block_cache_bytes(const model::LlamaConfig& mc, const JobConfig& job, int64_t workers, int64_t concurrent);
// MemAvailable of /proc/meminfo, in bytes; -1 where it cannot be read.
int64_t available_memory_bytes();
// Refuses, naming cluster.workers and the estimate, workers that would need more than 90% of
// `available` bytes (no check when available < 0). Returns the line the run prints.
std::string check_workers_fit(int64_t workers, const WorkerMemory& m, int64_t concurrent, int64_t available);
// How many in-process workers compute at once: cluster.compute_slots, or for 0 the CPUs this
// process may use (core/cpus.hpp) when there are more than 64 local workers; 0: no gate.
int planned_compute_slots(const JobConfig& job, int local_workers);

}  // namespace gasloc::train
