// Torch's CPU tensors' memory, kept when freed for the next tensor of the same size.
//
// Why: an in-process cluster of hundreds of workers runs as many threads, and glibc spreads
// threads over its arenas (8 per core): a block freed by one worker's step goes back to its
// arena, the next worker to compute allocates from another, and every step faults in pages the
// kernel had to hand over again (24 to 69 page faults per worker step at 256 and 1,024 nano
// workers: bench_cluster --scale). Workers of one cluster train one model shape, so the sizes
// recur: with a cache of freed blocks by CPU and size, shared by all threads, a worker's step
// reuses what the previous step on its CPU freed (3 faults a step).
//
// The cache changes where a tensor's bytes live, never what they are: torch::empty's bytes are
// unspecified with either allocator, and every block handed out is one nobody else holds. The
// trainer installs it only for clusters whose workers share the cores (train/compute_gate.hpp).
#pragma once

#include <cstdint>

namespace gasloc {

// While at least one CpuBlockCache lives, torch's CPU allocator is the cache: blocks of up to
// `max_cached_bytes` in all are kept when freed. The last one to go puts the previous allocator
// back and frees what is cached; tensors allocated meanwhile stay valid and are freed normally.
// Install it before the threads that compute start and let it go after they stopped: torch's
// allocator table is not meant to change under running threads.
class CpuBlockCache {
 public:
  explicit CpuBlockCache(int64_t max_cached_bytes);
  ~CpuBlockCache();
  CpuBlockCache(const CpuBlockCache&) = delete;
  CpuBlockCache& operator=(const CpuBlockCache&) = delete;

  struct Stats {
    int64_t allocations = 0;  // non-empty blocks handed out since the cache was installed
    int64_t reused = 0;       // of them, those taken from the cache
    int64_t cached_bytes = 0;  // held now, free, for reuse
  };
  static Stats stats();
};

}  // namespace gasloc
