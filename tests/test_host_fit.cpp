// Many in-process workers on one host (train/compute_gate.hpp, train/host_fit.hpp): the cores
// taken in turns, furthest-behind clock first, without changing a bit; the memory check's
// arithmetic and its refusal before a job too large starts.
#include <gtest/gtest.h>

#include <sched.h>

#include <atomic>
#include <barrier>
#include <chrono>
#include <set>
#include <thread>
#include <vector>

#include <c10/core/CPUAllocator.h>
#include <torch/torch.h>

#include "gasloc/core/cpu_block_cache.hpp"
#include "gasloc/core/cpus.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/train/compute_gate.hpp"
#include "gasloc/train/host_fit.hpp"
#include "gasloc/train/trainer.hpp"
#include "test_util.hpp"

using namespace gasloc;

TEST(ComputeGate, NeverMoreHoldersThanSlots) {
  train::ComputeGate gate(2);
  std::atomic<int> inside{0}, most{0};
  std::vector<std::thread> threads;
  for (int r = 0; r < 8; ++r)
    threads.emplace_back([&, r] {
      for (int k = 0; k < 50; ++k) {
        const train::ComputeGate::Slot slot(&gate, k + 0.01 * r, r);
        const int now = ++inside;
        int seen = most.load();
        while (now > seen && !most.compare_exchange_weak(seen, now)) {
        }
        std::this_thread::sleep_for(std::chrono::microseconds(50));
        --inside;
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_LE(most.load(), 2);
  EXPECT_EQ(gate.most_held(), most.load());
  EXPECT_GE(gate.most_held(), 1);
}

// With the one slot held, three workers queue at clocks 3, 1 and 2 (ranks 0, 1, 2); on release
// they get it in clock order: 1, 2, 0. Equal clocks go by rank.
TEST(ComputeGate, TheFurthestBehindGoesFirst) {
  train::ComputeGate gate(1);
  std::vector<int> order;
  std::mutex mu;
  std::vector<std::thread> threads;
  {
    const train::ComputeGate::Slot held(&gate, 0.0, 9);
    const std::vector<std::pair<double, int>> queue = {{3.0, 0}, {1.0, 1}, {2.0, 2}, {2.0, 3}};
    for (const auto& [clock, rank] : queue)
      threads.emplace_back([&, clock, rank] {
        const train::ComputeGate::Slot slot(&gate, clock, rank);
        std::lock_guard lk(mu);
        order.push_back(rank);
      });
    while (gate.waiting() < 4) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3, 0}));
  EXPECT_THROW(train::ComputeGate(0), Error);
}

// As many slots as CPUs: the holders, all at once, each run on one CPU, a different one each, and
// return to every CPU when they let go. One slot more than CPUs: nobody is confined.
TEST(ComputeGate, EachSlotIsACpuWhenThereAreAsManySlotsAsCpus) {
  const std::vector<int> all = usable_cpu_ids();
  const int n = static_cast<int>(all.size());
  for (const int slots : {n, n + 1}) {
    train::ComputeGate gate(slots);
    EXPECT_EQ(gate.pinned(), slots == n);
    std::barrier all_inside(slots);
    std::vector<std::vector<int>> inside(static_cast<size_t>(slots)), after(static_cast<size_t>(slots));
    std::vector<std::thread> threads;
    for (int r = 0; r < slots; ++r)
      threads.emplace_back([&, r] {
        {
          const train::ComputeGate::Slot slot(&gate, 0.0, r);
          inside[static_cast<size_t>(r)] = usable_cpu_ids();
          all_inside.arrive_and_wait();  // every slot held at once
        }
        after[static_cast<size_t>(r)] = usable_cpu_ids();
      });
    for (auto& t : threads) t.join();
    std::set<int> used;
    for (int r = 0; r < slots; ++r) {
      EXPECT_EQ(after[static_cast<size_t>(r)], all) << "slots " << slots << ", holder " << r;
      if (slots == n) {
        ASSERT_EQ(inside[static_cast<size_t>(r)].size(), 1u) << "holder " << r;
        used.insert(inside[static_cast<size_t>(r)][0]);
      } else {
        EXPECT_EQ(inside[static_cast<size_t>(r)], all) << "holder " << r;
      }
    }
    if (slots == n) EXPECT_EQ(used, std::set<int>(all.begin(), all.end()));
  }
}

// A process confined to fewer CPUs than the host has (taskset, a container's cpuset): the gate
// gets as many slots as the CPUs it may use, and so still gives each slot a CPU of its own. With
// the host's count it would get more slots than CPUs, and pin none. Checked in a thread confined
// to one CPU, which needs a host of two or more.
TEST(HostFit, ComputeSlotsAreTheCpusThisProcessMayUseNotTheHosts) {
  const std::vector<int> all = usable_cpu_ids();
  if (all.size() < 2) GTEST_SKIP() << "needs 2 or more CPUs to confine a thread to fewer";
  train::JobConfig job;
  EXPECT_EQ(train::planned_compute_slots(job, 1024), static_cast<int>(all.size()));
  std::thread confined([&] {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(all.back(), &one);
    ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
    EXPECT_EQ(train::planned_compute_slots(job, 1024), 1);
    EXPECT_TRUE(train::ComputeGate(train::planned_compute_slots(job, 1024)).pinned());
    EXPECT_EQ(train::planned_compute_slots(job, 64), 0);  // few workers: no gate
  });
  confined.join();
}

// nano (vocab 512: 164,160 parameters, `gasloc model-info --preset nano`) with 16 bytes a parameter
// of state: held by every worker, 8 of parameters and gradients, 16 of state, 40 of a round's
// buffers and 1 MiB of thread and module objects; held while it writes a checkpoint, 24 (what
// 256 GASLoC workers measured at their peak, with a margin: host_fit.cpp). 1,024 such workers, 2
// computing at once: every worker's state, and 2 workers' activations and checkpoint bytes.
TEST(HostFit, AWorkersEstimateCountsTheBuffersEveryWorkerHoldsAtOnce) {
  const auto nano = model::LlamaConfig::preset("nano");
  ASSERT_EQ(nano.num_params(), 164160);
  const auto m = train::estimated_worker_memory(nano, 8, 64, 16.0);
  EXPECT_EQ(m.state_bytes, 164160LL * (8 + 16 + 40) + (1 << 20));
  EXPECT_EQ(m.checkpoint_bytes, 164160LL * 24);
  EXPECT_EQ(train::needed_bytes(m, 1024, 2), 1024 * m.state_bytes + 2 * (m.activation_bytes + m.checkpoint_bytes));
  // What is freed and allocated again: every worker's round buffers, the slot holders' activations
  // and checkpoints.
  EXPECT_EQ(m.round_bytes, 164160LL * 40);
  EXPECT_EQ(train::reallocated_bytes(m, 1024, 2), 1024 * 164160LL * 40 + 2 * (m.activation_bytes + m.checkpoint_bytes));
  train::JobConfig job;  // the block cache's bound: the same, for the job's batch (B = 8, T = 64)
  job.data.batch_size = 8;
  job.data.seq_len = 64;
  EXPECT_EQ(train::block_cache_bytes(nano, job, 1024, 2), train::reallocated_bytes(m, 1024, 2));
}

// 10 workers of 100 MB state: 1 GB, which fits in 2 GB free and not in 1 GB (90% of it serves 9).
// Activations count once per worker computing at once: 10 MB state and 50 MB activations, 2 of
// 10 computing, make 100 + 100 MB.
TEST(HostFit, TheCheckIsTheEstimateAgainstNinetyPercentOfWhatIsFree) {
  const train::WorkerMemory state_only{100'000'000, 0};
  const std::string line = train::check_workers_fit(10, state_only, 10, 2'000'000'000);
  EXPECT_NE(line.find("about 1.00 GB for 10 workers"), std::string::npos) << line;
  EXPECT_NE(line.find("2.00 GB free"), std::string::npos) << line;
  EXPECT_NO_THROW(train::check_workers_fit(10, state_only, 10, -1));  // unknown: no check
  try {
    train::check_workers_fit(10, state_only, 10, 1'000'000'000);
    ADD_FAILURE() << "1 GB of workers in 1 GB free must be refused";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("cluster.workers"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.hint()).find("at most 9 workers"), std::string::npos) << e.hint();
  }
  EXPECT_EQ(train::needed_bytes({10'000'000, 50'000'000}, 10, 2), 200'000'000);
  EXPECT_EQ(train::needed_bytes({10'000'000, 50'000'000}, 10, 64), 600'000'000);  // no more than the workers
  EXPECT_EQ(train::needed_bytes({10'000'000, 50'000'000, 5'000'000}, 10, 2), 210'000'000);  // checkpoints in turns too
  EXPECT_GT(train::available_memory_bytes(), 0);  // Linux: /proc/meminfo has MemAvailable
}

// A freed tensor's block goes to the next tensor of the same size, never to one of another size
// and never while it is held; blocks are aligned as c10's.
TEST(CpuBlockCache, AFreedBlockGoesToTheNextTensorOfItsSize) {
  c10::Allocator* torch_own = c10::GetCPUAllocator();
  {
    const CpuBlockCache cache(1 << 20);
    EXPECT_NE(c10::GetCPUAllocator(), torch_own);
    void* first = nullptr;
    {
      const auto a = torch::full({1000}, 3.0f);
      first = a.data_ptr();
      EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % 64, 0u);
    }
    EXPECT_EQ(CpuBlockCache::stats().cached_bytes, 4000);
    const auto other_size = torch::zeros({999});
    EXPECT_NE(other_size.data_ptr(), first);
    const auto b = torch::zeros({1000});
    EXPECT_EQ(b.data_ptr(), first);  // reused, and its bytes are the new tensor's
    EXPECT_EQ(b.sum().item<float>(), 0.0f);
    const auto c = torch::ones({1000});  // b holds the cached block: c gets another
    const auto s = CpuBlockCache::stats();
    EXPECT_EQ(s.reused, 1);
    EXPECT_GE(s.allocations, 4);  // a, other_size, b, c, and any scalar torch makes on the way
    EXPECT_NE(c.data_ptr(), first);
    EXPECT_EQ(b.sum().item<float>(), 0.0f);
    EXPECT_EQ(c.sum().item<float>(), 1000.0f);
    // torch's raw interface (context == data) works with the cache's blocks too.
    const int64_t cached = CpuBlockCache::stats().cached_bytes;
    void* raw = c10::GetCPUAllocator()->raw_allocate(128);
    ASSERT_NE(raw, nullptr);
    c10::GetCPUAllocator()->raw_deallocate(raw);
    EXPECT_EQ(CpuBlockCache::stats().cached_bytes, cached + 128);
  }
  EXPECT_EQ(c10::GetCPUAllocator(), torch_own);
}

// No more than its bound is kept; beyond it a freed block goes back to the system.
TEST(CpuBlockCache, KeepsNoMoreThanItsBound) {
  const CpuBlockCache cache(10'000);
  {
    std::vector<torch::Tensor> held;
    for (int i = 0; i < 5; ++i) held.push_back(torch::empty({1000}));  // 4,000 bytes each
  }
  EXPECT_EQ(CpuBlockCache::stats().cached_bytes, 8000);
}

// Nested caches share one: the inner one's end keeps it installed; a tensor made under the cache
// and freed after its end is freed normally (ASan checks that).
TEST(CpuBlockCache, TheLastOneToGoPutsTorchsAllocatorBack) {
  c10::Allocator* torch_own = c10::GetCPUAllocator();
  torch::Tensor outlives;
  {
    const CpuBlockCache outer(1 << 20);
    c10::Allocator* cache = c10::GetCPUAllocator();
    {
      const CpuBlockCache inner(1 << 20);
      outlives = torch::arange(100, torch::kFloat);
    }
    EXPECT_EQ(c10::GetCPUAllocator(), cache);
    torch::empty({10});
  }
  EXPECT_EQ(c10::GetCPUAllocator(), torch_own);
  EXPECT_EQ(CpuBlockCache::stats().cached_bytes, 0);
  EXPECT_EQ(outlives.sum().item<float>(), 4950.0f);
  outlives = torch::Tensor();
  EXPECT_EQ(CpuBlockCache::stats().cached_bytes, 0);  // freed, not kept: no cache is installed
}

class ManyWorkers : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = test_util::temp_root("test_host_fit");
    test_util::make_byte_dataset(root_);
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(root_); }
  static inline std::filesystem::path root_;
};

// One slot for four workers computes every step and evaluation in turn: the same bits as the
// workers computing when they like.
TEST_F(ManyWorkers, OneSlotForFourWorkersGivesTheSameBits) {
  auto request = [&](const std::string& run, const std::string& slots) {
    return test_util::nano_request(root_, run, {"train.steps=30", "train.eval_every=10", "cluster.workers=4", "algo.name=gasloc",
                                                "algo.topology=2peer", "algo.H=5", "cluster.compute_slots=" + slots});
  };
  const auto free_for_all = train::run_training(request("free", "0"));
  const auto one_slot = train::run_training(request("gated", "1"));
  EXPECT_GT(CpuBlockCache::stats().reused, 1000) << "the gated run's steps reuse freed blocks";
  ASSERT_EQ(free_for_all.train_losses.size(), 30u);
  EXPECT_EQ(one_slot.train_losses, free_for_all.train_losses);
  EXPECT_EQ(one_slot.final_val_loss, free_for_all.final_val_loss);
}

// Checkpoints written in turns (one slot for four workers: rank_loop.cpp writes in a slot) hold
// the same state: stopped at step 15 and resumed, the gated run continues with the bits of the
// run that never stopped.
TEST_F(ManyWorkers, CheckpointsWrittenInTurnsResumeBitExactly) {
  const std::vector<std::string> job = {"train.steps=30", "train.eval_every=10", "cluster.workers=4", "algo.name=gasloc",
                                        "algo.topology=2peer", "algo.H=5", "cluster.compute_slots=1"};
  const auto whole = train::run_training(test_util::nano_request(root_, "whole", job));
  auto halves = job;
  halves.push_back("train.stop_at=15");
  const auto first = train::run_training(test_util::nano_request(root_, "halves", halves));
  train::TrainRequest again;
  again.quiet = true;
  again.resume_dir = (root_ / "halves").string();
  const auto second = train::run_training(again);
  ASSERT_EQ(whole.train_losses.size(), 30u);
  ASSERT_EQ(first.train_losses.size(), 15u);
  ASSERT_EQ(second.train_losses.size(), 15u);
  for (size_t i = 0; i < 15; ++i) EXPECT_EQ(second.train_losses[i], whole.train_losses[15 + i]) << "step " << 16 + i;
  EXPECT_EQ(second.final_val_loss, whole.final_val_loss);
}

// 4,096 workers of the small preset (~25M parameters each) need terabytes: refused at the start,
// naming the key, before the others are made.
TEST_F(ManyWorkers, AJobLargerThanTheHostIsRefusedWithItsEstimate) {
  auto r = test_util::nano_request(root_, "too_large", {"model.preset=small", "cluster.workers=4096", "algo.name=gasloc"});
  try {
    train::run_training(r);
    ADD_FAILURE() << "4,096 small workers must be refused";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("cluster.workers"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("4096 workers in this process need about"), std::string::npos) << e.what();
  }
}
