#include "gasloc/core/cpu_block_cache.hpp"

#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace gasloc {

namespace {

// c10's alignment for CPU tensors (vectorized kernels assume it). Each block starts with a
// header of this size holding the size asked for; the tensor's bytes follow it, still aligned.
constexpr size_t kAlignment = 64;
constexpr size_t kHeader = kAlignment;

size_t& size_of(void* data) { return *reinterpret_cast<size_t*>(static_cast<char*>(data) - kHeader); }

void* new_block(size_t n) {
  void* block = nullptr;
  TORCH_CHECK(posix_memalign(&block, kAlignment, kHeader + n) == 0 && block != nullptr,
              "gasloc's CPU allocator: not enough memory: you tried to allocate ", n, " bytes");
  void* data = static_cast<char*>(block) + kHeader;
  size_of(data) = n;
  return data;
}

void free_block(void* data) { std::free(static_cast<char*>(data) - kHeader); }

void give_back(void* data);

// The process's one cache. Never destroyed: a tensor may outlive every CpuBlockCache (a model
// kept after its cluster, a static), and its deleter still comes here.
class Cache final : public c10::Allocator {
 public:
  // Both forms, without `override`: LibTorch 1.x declares allocate() const, 2.3 and later not.
  c10::DataPtr allocate(size_t n) const { return const_cast<Cache*>(this)->take(n); }
  c10::DataPtr allocate(size_t n) { return take(n); }
  c10::DeleterFnPtr raw_deleter() const override { return &give_back; }
  // Pure virtual from LibTorch 2.2 on (Allocator::clone); an ordinary member before.
  void copy_data(void* dest, const void* src, size_t count) const { std::memcpy(dest, src, count); }

  void install(int64_t max_cached_bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    if (users_++ > 0) return;
    previous_ = c10::GetCPUAllocator();
    max_cached_ = max_cached_bytes;
    stats_ = {};
    caching_ = true;
    c10::SetCPUAllocator(this, kPriority);
  }

  void uninstall() {
    std::vector<void*> blocks;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--users_ > 0) return;
      c10::SetCPUAllocator(previous_, kPriority);
      caching_ = false;
      for (auto& on_cpu : free_) {
        for (auto& [size, list] : on_cpu) blocks.insert(blocks.end(), list.begin(), list.end());
        on_cpu.clear();
      }
      stats_.cached_bytes = 0;
    }
    for (void* data : blocks) free_block(data);
  }

  void put_back(void* data) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      const size_t n = size_of(data);
      if (caching_ && stats_.cached_bytes + static_cast<int64_t>(n) <= max_cached_) {
        free_[this_cpu()][n].push_back(data);
        stats_.cached_bytes += static_cast<int64_t>(n);
        return;
      }
    }
    free_block(data);
  }

  CpuBlockCache::Stats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

 private:
  // Above c10's default (0), so that a later registration at the default cannot displace it.
  static constexpr uint8_t kPriority = 1;

  c10::DataPtr take(size_t n) {
    const c10::Device cpu(c10::DeviceType::CPU);
    if (n == 0) return {nullptr, nullptr, &give_back, cpu};
    void* data = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.allocations;
      // This CPU's blocks first, the newest first: the likeliest still in this core's caches.
      const size_t here = this_cpu();
      for (size_t k = 0; k < free_.size() && !data; ++k) {
        auto& on_cpu = free_[(here + k) % free_.size()];
        auto it = on_cpu.find(n);
        if (it == on_cpu.end() || it->second.empty()) continue;
        data = it->second.back();
        it->second.pop_back();
        stats_.cached_bytes -= static_cast<int64_t>(n);
        ++stats_.reused;
      }
    }
    if (!data) data = new_block(n);
    // The context is the data itself, as raw_allocate() requires.
    return {data, data, &give_back, cpu};
  }

  size_t this_cpu() const {
    const int cpu = sched_getcpu();
    return cpu < 0 ? 0 : static_cast<size_t>(cpu) % free_.size();
  }

  std::mutex mu_;
  int users_ = 0;
  bool caching_ = false;
  int64_t max_cached_ = 0;
  c10::Allocator* previous_ = nullptr;
  // By the CPU that freed them, then by size, the newest last. Why by CPU: a block freed on one
  // core and taken on another moves its cache lines between the cores: 1,024 nano workers on 2
  // pinned slots ran 1.24x the same workers stepped in turn with one list for all, slower than
  // without a cache (1.09x), and 0.96x to 1.03x with lists by CPU (bench_cluster --scale).
  std::vector<std::unordered_map<size_t, std::vector<void*>>> free_ =
      std::vector<std::unordered_map<size_t, std::vector<void*>>>(static_cast<size_t>(std::max(1L, sysconf(_SC_NPROCESSORS_CONF))));
  CpuBlockCache::Stats stats_;
};

Cache& the_cache() {
  static Cache* cache = new Cache();
  return *cache;
}

void give_back(void* data) {
  if (data) the_cache().put_back(data);
}

}  // namespace

CpuBlockCache::CpuBlockCache(int64_t max_cached_bytes) { the_cache().install(max_cached_bytes); }
CpuBlockCache::~CpuBlockCache() { the_cache().uninstall(); }
CpuBlockCache::Stats CpuBlockCache::stats() { return the_cache().stats(); }

}  // namespace gasloc
