// The in-process backend: exact collectives, the virtual clock against hand-computed times,
// failure propagation (no hangs), and scale. Clock tolerances are 1e-12 s (sums of a few
// doubles); tensor results are compared bitwise.
#include <gtest/gtest.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <stdexcept>
#include <thread>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gasloc/comm/inproc.hpp"
#include "gasloc/comm/network_model.hpp"
#include "gasloc/core/error.hpp"

using namespace gasloc;
using namespace gasloc::comm;

namespace {

constexpr double kTol = 1e-12;

// Rank r's deterministic random tensor. A private generator: worker threads call this at the
// same time, and the global one (torch::manual_seed) would interleave their draws.
torch::Tensor random_for(int r, int64_t numel = 1000, torch::ScalarType dtype = torch::kFloat32) {
  auto gen = at::detail::createCPUGenerator(1000 + r);
  return torch::randn({numel}, gen).to(dtype);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Runs f on every rank; each rank's CommError message (or "" if none) is collected, and run()'s
// own exception is swallowed (the caller checks it separately when it matters).
std::vector<std::string> comm_errors(InProcCluster& cluster, const std::function<void(int, Communicator&)>& f) {
  std::vector<std::string> msgs(cluster.world());
  try {
    cluster.run([&](int r, Communicator& c) {
      try {
        f(r, c);
      } catch (const CommError& e) {
        msgs[r] = e.what();
        throw;
      }
    });
  } catch (const std::exception&) {
  }
  return msgs;
}

}  // namespace

// ---- cost model -----------------------------------------------------------------------------

TEST(NetworkModel, CostFunctionsMatchDesign) {
  EXPECT_NEAR(pair_exchange_seconds(4000, 125e6, 125e6, 1, 1, 1e-3), 1e-3 + 4000 / 125e6, kTol);
  // The slower end after sharing sets the pace: min(100/2, 80/1) = 50.
  EXPECT_NEAR(pair_exchange_seconds(1000, 100, 80, 2, 1, 0.5), 0.5 + 1000.0 / 50, kTol);
  EXPECT_EQ(ring_allreduce_seconds(1000, 1, 100, 1), 0.0);
  EXPECT_NEAR(ring_allreduce_seconds(1000, 4, 100, 0.01), 6 * 0.01 + 1.5 * 1000 / 100, kTol);
  EXPECT_EQ(ring_allreduce_bytes(4000, 4), 6000);
  EXPECT_EQ(ring_allreduce_bytes(4000, 3), 5333);  // 2*2/3*4000 rounded down
  EXPECT_EQ(ring_allreduce_bytes(4000, 1), 0);
  EXPECT_THROW(pair_exchange_seconds(1, 1, 1, 0, 1, 0), CommError);
}

TEST(NetworkModel, PerRankFactorsAndValidation) {
  NetworkModel m;
  m.slowdown = {1, 2.5};
  m.bandwidth_scale = {0.1, 1};
  m.validate(2);
  EXPECT_NEAR(m.step_time(1), 0.25, kTol);
  EXPECT_NEAR(m.bandwidth(0), 12.5e6, 1e-3);
  EXPECT_EQ(m.message_bytes(40), 40);
  m.simulated_message_bytes = 7;
  EXPECT_EQ(m.message_bytes(40), 7);

  auto field_error = [](NetworkModel bad, int world) -> std::string {
    try {
      bad.validate(world);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  };
  NetworkModel bad;
  bad.bandwidth_Bps = 0;
  EXPECT_NE(field_error(bad, 2).find("bandwidth_Bps"), std::string::npos);
  bad = {};
  bad.latency_s = -1;
  EXPECT_NE(field_error(bad, 2).find("latency_s"), std::string::npos);
  bad = {};
  bad.slowdown = {1, 1, 1};
  EXPECT_NE(field_error(bad, 2).find("slowdown"), std::string::npos);
  bad = {};
  bad.bandwidth_scale = {1, 0};
  EXPECT_NE(field_error(bad, 2).find("bandwidth_scale[1]"), std::string::npos);
  bad = {};
  bad.simulated_message_bytes = -1;
  EXPECT_NE(field_error(bad, 2).find("simulated_message_bytes"), std::string::npos);
  EXPECT_THROW(InProcCluster(2, bad), ConfigError);
  EXPECT_THROW(InProcCluster(0), ConfigError);
  EXPECT_THROW(InProcCluster(2, {}, 0.0), ConfigError);
}

// ---- exact collectives ----------------------------------------------------------------------

TEST(InProc, AllReduceMeanOfRanksIsExactAndIdenticalEverywhere) {
  for (int n : {1, 2, 3, 4, 8}) {
    InProcCluster cluster(n);
    std::vector<torch::Tensor> out(n), rnd(n);
    cluster.run([&](int r, Communicator& c) {
      EXPECT_EQ(c.rank(), r);
      EXPECT_EQ(c.world(), n);
      out[r] = torch::full({3, 5}, static_cast<float>(r));
      c.all_reduce_mean(out[r]);
      rnd[r] = random_for(r);
      c.all_reduce_mean(rnd[r]);
    });
    // Rank-order sum written by hand: the reference the backend must match bit for bit.
    torch::Tensor expected = random_for(0);
    for (int r = 1; r < n; ++r) expected += random_for(r);
    expected /= n;
    for (int r = 0; r < n; ++r) {
      EXPECT_TRUE(torch::equal(out[r], torch::full({3, 5}, (n - 1) / 2.0f))) << "n=" << n << " rank " << r;
      EXPECT_EQ(out[r].sizes(), (std::vector<int64_t>{3, 5}));
      EXPECT_TRUE(torch::equal(rnd[r], expected)) << "n=" << n << " rank " << r;
      EXPECT_TRUE(torch::equal(rnd[r], rnd[0])) << "n=" << n << " rank " << r;
    }
  }
}

TEST(InProc, AllReduceMeanSumsBf16InFp32) {
  // As the Gloo backend does: the sum in fp32, the mean rounded to bf16 once.
  const int n = 3;
  InProcCluster cluster(n);
  std::vector<torch::Tensor> out(n);
  cluster.run([&](int r, Communicator& c) {
    out[r] = random_for(r, 257, torch::kBFloat16);
    c.all_reduce_mean(out[r]);
  });
  torch::Tensor expected = random_for(0, 257, torch::kBFloat16).to(torch::kFloat);
  for (int r = 1; r < n; ++r) expected += random_for(r, 257, torch::kBFloat16).to(torch::kFloat);
  expected = (expected / n).to(torch::kBFloat16);
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(out[r].scalar_type(), torch::kBFloat16);
    EXPECT_TRUE(torch::equal(out[r], expected)) << "rank " << r;
  }
}

TEST(InProc, ExchangeInPairsOddAndEven) {
  for (int n : {2, 5, 6}) {
    InProcCluster cluster(n);
    std::vector<std::vector<torch::Tensor>> recv(n);
    std::vector<torch::Tensor> sent(n);
    cluster.run([&](int r, Communicator& c) {
      sent[r] = random_for(r, 100);
      const int partner = r ^ 1;  // odd n: the last rank sits out with no peers
      std::vector<int> peers;
      if (partner < n) peers.push_back(partner);
      c.exchange(peers, sent[r], recv[r]);
    });
    for (int r = 0; r < n; ++r) {
      const int partner = r ^ 1;
      if (partner >= n) {
        EXPECT_TRUE(recv[r].empty());
        continue;
      }
      ASSERT_EQ(recv[r].size(), 1u);
      EXPECT_TRUE(torch::equal(recv[r][0], random_for(partner, 100))) << "n=" << n << " rank " << r;
      EXPECT_NE(recv[r][0].data_ptr(), sent[partner].data_ptr()) << "recv must be a copy";
    }
  }
}

TEST(InProc, ExchangeOnARingReceivesBothNeighboursInPeerOrder) {
  for (int n : {3, 4, 5}) {
    InProcCluster cluster(n);
    std::vector<std::vector<torch::Tensor>> recv(n);
    cluster.run([&](int r, Communicator& c) {
      std::vector<torch::Tensor> stale(7);  // recv is resized to the peer count
      c.exchange({(r + n - 1) % n, (r + 1) % n}, random_for(r, 64).view({8, 8}), stale);
      recv[r] = stale;
    });
    for (int r = 0; r < n; ++r) {
      ASSERT_EQ(recv[r].size(), 2u);
      EXPECT_TRUE(torch::equal(recv[r][0], random_for((r + n - 1) % n, 64).view({8, 8}))) << "n=" << n << " rank " << r;
      EXPECT_TRUE(torch::equal(recv[r][1], random_for((r + 1) % n, 64).view({8, 8}))) << "n=" << n << " rank " << r;
    }
  }
}

TEST(InProc, BroadcastCopiesTheRoot) {
  const int n = 4, root = 2;
  InProcCluster cluster(n);
  std::vector<torch::Tensor> t(n);
  cluster.run([&](int r, Communicator& c) {
    t[r] = random_for(r, 50);
    c.broadcast(t[r], root);
  });
  for (int r = 0; r < n; ++r) EXPECT_TRUE(torch::equal(t[r], random_for(root, 50))) << "rank " << r;
  // A chain from the root: each rank but the last forwards P, each but the root receives it.
  EXPECT_EQ(cluster.stats(root).bytes_sent, 200);
  EXPECT_EQ(cluster.stats(root).bytes_received, 0);
  EXPECT_EQ(cluster.stats(1).bytes_sent, 0);  // last in the chain 2 -> 3 -> 0 -> 1
  EXPECT_EQ(cluster.stats(1).bytes_received, 200);
}

// ---- virtual clock --------------------------------------------------------------------------

TEST(InProcClock, PairExchangeLateArrival) {
  NetworkModel m;  // 0.1 s/step, 125e6 B/s, 1 ms latency
  InProcCluster cluster(2, m);
  cluster.run([](int r, Communicator& c) {
    c.compute(r == 0 ? 1 : 3);
    std::vector<torch::Tensor> recv;
    c.exchange({1 - r}, torch::zeros({1000}), recv);  // P = 4000 bytes
  });
  const double end = 0.3 + 1e-3 + 4000 / 125e6;
  EXPECT_NEAR(cluster.clock(0), end, kTol);
  EXPECT_NEAR(cluster.clock(1), end, kTol);
  EXPECT_NEAR(cluster.stats(0).idle_s, 0.2, kTol);
  EXPECT_NEAR(cluster.stats(1).idle_s, 0.0, kTol);
  EXPECT_EQ(cluster.stats(0).bytes_sent, 4000);
  EXPECT_EQ(cluster.stats(1).bytes_received, 4000);
}

TEST(InProcClock, PairsOfOneCallMaySendDifferentSizesEachPricedByItsOwn) {
  // Pairs (0, 1) and (2, 3) in one exchange, 1000 and 3000 floats; rank 4 lists nobody. A pair's
  // two ends must agree (a mismatch inside a pair is still refused).
  NetworkModel m;
  InProcCluster cluster(5, m);
  cluster.run([](int r, Communicator& c) {
    std::vector<torch::Tensor> recv;
    if (r == 4) return c.exchange({}, torch::zeros({7}), recv);
    c.exchange({r ^ 1}, torch::zeros({r < 2 ? 1000 : 3000}), recv);
    EXPECT_EQ(recv.at(0).numel(), r < 2 ? 1000 : 3000);
  });
  for (int r = 0; r < 4; ++r) {
    const double bytes = r < 2 ? 4000 : 12000;
    EXPECT_NEAR(cluster.clock(r), 1e-3 + bytes / 125e6, kTol) << r;
    EXPECT_EQ(cluster.stats(r).bytes_sent, static_cast<int64_t>(bytes));
    EXPECT_EQ(cluster.stats(r).bytes_received, static_cast<int64_t>(bytes));
  }
  EXPECT_EQ(cluster.clock(4), 0.0);
  EXPECT_EQ(cluster.stats(4).bytes_sent, 0);
  InProcCluster bad(2, m);
  EXPECT_THROW(bad.run([](int r, Communicator& c) {
    std::vector<torch::Tensor> recv;
    c.exchange({1 - r}, torch::zeros({r == 0 ? 10 : 11}), recv);
  }), CommError);
}

TEST(InProcClock, TreeAllReducePaysLogarithmicLatencies) {
  // network.allreduce = tree: 2 ceil(log2 n) latencies, the ring's bytes. n = 4: 4 latencies
  // (the ring pays 6); n = 5: 6 (the ring 8); n = 1,024 on 50 ms links: 1 s against 102.3 s.
  for (int n : {4, 5}) {
    NetworkModel m;
    m.allreduce = AllReducePattern::tree;
    InProcCluster cluster(n, m);
    cluster.run([](int, Communicator& c) {
      auto t = torch::ones({1000});
      c.all_reduce_mean(t);
    });
    const double latencies = n == 4 ? 4 : 6, share = 2.0 * (n - 1) / n;
    for (int r = 0; r < n; ++r) {
      EXPECT_NEAR(cluster.clock(r), latencies * 1e-3 + share * 4000 / 125e6, kTol) << n;
      EXPECT_EQ(cluster.stats(r).bytes_sent, ring_allreduce_bytes(4000, n));
    }
  }
  EXPECT_NEAR(tree_allreduce_seconds(0, 1024, 1, 0.05), 1.0, 1e-12);
  EXPECT_NEAR(ring_allreduce_seconds(0, 1024, 1, 0.05), 102.3, 1e-9);
  EXPECT_EQ(tree_allreduce_seconds(1e6, 1, 1, 0.05), 0.0);
}

TEST(InProcClock, RingAllReduce) {
  NetworkModel m;
  InProcCluster cluster(4, m);
  cluster.run([](int r, Communicator& c) {
    c.compute(r);  // clocks 0, 0.1, 0.2, 0.3
    auto t = torch::ones({1000});
    c.all_reduce_mean(t);
    EXPECT_NEAR(c.now(), 0.3 + 6 * 1e-3 + 1.5 * 4000 / 125e6, kTol);
  });
  for (int r = 0; r < 4; ++r) {
    EXPECT_NEAR(cluster.clock(r), 0.3 + 6 * 1e-3 + 1.5 * 4000 / 125e6, kTol);
    EXPECT_NEAR(cluster.stats(r).idle_s, 0.3 - 0.1 * r, kTol);
    EXPECT_EQ(cluster.stats(r).bytes_sent, 6000);
    EXPECT_EQ(cluster.stats(r).bytes_received, 6000);
  }
}

TEST(InProcClock, SlowLinkSlowsOnlyItsPair) {
  NetworkModel m;
  m.bandwidth_scale = {1, 0.1, 1, 1};
  InProcCluster cluster(4, m);
  cluster.run([](int r, Communicator& c) {
    std::vector<torch::Tensor> recv;
    c.exchange({r ^ 1}, torch::zeros({1000}), recv);
  });
  EXPECT_NEAR(cluster.clock(0), 1e-3 + 4000 / 12.5e6, kTol);
  EXPECT_NEAR(cluster.clock(1), 1e-3 + 4000 / 12.5e6, kTol);
  EXPECT_NEAR(cluster.clock(2), 1e-3 + 4000 / 125e6, kTol);
  EXPECT_NEAR(cluster.clock(3), 1e-3 + 4000 / 125e6, kTol);
  for (int r = 0; r < 4; ++r) EXPECT_NEAR(cluster.stats(r).idle_s, 0.0, kTol);
}

TEST(InProcClock, SlowWorkerMakesItsPartnerIdle) {
  NetworkModel m;
  m.slowdown = {2, 1};
  InProcCluster cluster(2, m);
  cluster.run([](int r, Communicator& c) {
    for (int s = 0; s < 5; ++s) c.compute(1);
    EXPECT_NEAR(c.now(), r == 0 ? 1.0 : 0.5, kTol);
    std::vector<torch::Tensor> recv;
    c.exchange({1 - r}, torch::zeros({1000}), recv);
  });
  EXPECT_NEAR(cluster.clock(0), 1.0 + 1e-3 + 4000 / 125e6, kTol);
  EXPECT_NEAR(cluster.clock(1), 1.0 + 1e-3 + 4000 / 125e6, kTol);
  EXPECT_NEAR(cluster.stats(0).idle_s, 0.0, kTol);
  EXPECT_NEAR(cluster.stats(1).idle_s, 0.5, kTol);
}

TEST(InProcClock, RingOfTwoPeersHalvesBandwidth) {
  NetworkModel m;
  InProcCluster cluster(4, m);
  cluster.run([](int r, Communicator& c) {
    if (r == 0) c.compute(1);  // rank 0 arrives at 0.1, the others at 0
    std::vector<torch::Tensor> recv;
    c.exchange({(r + 3) % 4, (r + 1) % 4}, torch::zeros({1000}), recv);
  });
  const double d = 1e-3 + 4000 / (125e6 / 2);  // k = 2 on both ends
  // Ranks 1 and 3 neighbour rank 0: their later transfer starts at 0.1.
  EXPECT_NEAR(cluster.clock(0), 0.1 + d, kTol);
  EXPECT_NEAR(cluster.clock(1), 0.1 + d, kTol);
  EXPECT_NEAR(cluster.clock(3), 0.1 + d, kTol);
  EXPECT_NEAR(cluster.clock(2), d, kTol);
  EXPECT_NEAR(cluster.stats(0).idle_s, 0.0, kTol);
  EXPECT_NEAR(cluster.stats(1).idle_s, 0.1, kTol);
  EXPECT_NEAR(cluster.stats(2).idle_s, 0.0, kTol);
  EXPECT_EQ(cluster.stats(2).bytes_sent, 8000);
}

TEST(InProcClock, SimulatedMessageBytesPriceMessages) {
  NetworkModel m;
  m.simulated_message_bytes = 1'000'000'000;
  InProcCluster cluster(2, m);
  cluster.run([](int r, Communicator& c) {
    std::vector<torch::Tensor> recv;
    c.exchange({1 - r}, torch::zeros({4}), recv);
  });
  EXPECT_NEAR(cluster.clock(0), 1e-3 + 1e9 / 125e6, kTol);
  EXPECT_EQ(cluster.stats(1).bytes_sent, 1'000'000'000);
}

TEST(InProcClock, BroadcastBarrierAndNoPeersAndRunsCarryOver) {
  NetworkModel m;
  InProcCluster cluster(3, m);
  cluster.run([](int r, Communicator& c) {
    c.compute(r);  // 0, 0.1, 0.2
    c.barrier();
    EXPECT_NEAR(c.now(), 0.2, kTol);
    std::vector<torch::Tensor> recv(3);
    c.exchange({}, torch::Tensor(), recv);  // nobody has neighbours: clocks stay
    EXPECT_TRUE(recv.empty());
    EXPECT_NEAR(c.now(), 0.2, kTol);
  });
  EXPECT_NEAR(cluster.stats(0).idle_s, 0.2, kTol);
  cluster.run([](int r, Communicator& c) {
    if (r == 1) c.compute(1);
    auto t = torch::zeros({1000});
    c.broadcast(t, 0);
  });
  for (int r = 0; r < 3; ++r) EXPECT_NEAR(cluster.clock(r), 0.3 + 1e-3 + 4000 / 125e6, kTol);
  EXPECT_NEAR(cluster.stats(0).idle_s, 0.3, kTol);
}

// The control channel (evaluation, metrics) is matched with the algorithm's calls but costs no
// virtual time and no counted bytes: the clocks and stats are those of the algorithm's calls alone.
TEST(InProcClock, ControlChannelCostsNothingAndIsNotCounted) {
  NetworkModel m;
  InProcCluster cluster(3, m);
  cluster.run([&](int r, Communicator& c) {
    Communicator& ctl = cluster.control(r);
    c.compute(r);  // 0, 0.1, 0.2
    auto t = torch::full({1000}, static_cast<float>(r));
    ctl.all_reduce_mean(t);  // exact, like the algorithm's
    EXPECT_TRUE(torch::equal(t, torch::full({1000}, 1.0f)));
    ctl.barrier();
    auto b = r == 2 ? torch::ones({10}) : torch::zeros({10});
    ctl.broadcast(b, 2);
    EXPECT_TRUE(torch::equal(b, torch::ones({10})));
    EXPECT_NEAR(c.now(), 0.1 * r, kTol) << "the control channel moved rank " << r << "'s clock";
    c.barrier();  // the algorithm's barrier still prices the wait
    EXPECT_NEAR(c.now(), 0.2, kTol);
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(cluster.stats(r).bytes_sent, 0) << "rank " << r;
    EXPECT_EQ(cluster.control(r).stats().bytes_sent, 0) << "rank " << r;
  }
  EXPECT_NEAR(cluster.stats(0).idle_s, 0.2, kTol);  // the algorithm's barrier only
}

// ---- errors ---------------------------------------------------------------------------------

TEST(InProcErrors, ControlAndAlgorithmCallsDoNotMix) {
  InProcCluster cluster(2, {}, 5.0);
  auto msgs = comm_errors(cluster, [&](int r, Communicator& c) {
    auto t = torch::zeros({4});
    if (r == 1) cluster.control(r).all_reduce_mean(t);
    else c.all_reduce_mean(t);
  });
  for (auto& m : msgs) EXPECT_NE(m.find("rank 1 called all_reduce_mean on the control channel, rank 0 on the algorithm's"), std::string::npos) << m;
}

TEST(InProcErrors, MismatchedSizesAreNamed) {
  InProcCluster cluster(3, {}, 5.0);
  auto msgs = comm_errors(cluster, [](int r, Communicator& c) {
    auto t = torch::zeros({r == 2 ? 1000 : 999});
    c.all_reduce_mean(t);
  });
  for (int r = 0; r < 3; ++r) EXPECT_NE(msgs[r].find("all_reduce_mean: rank 2 sent 1000 elements, rank 0 sent 999"), std::string::npos) << msgs[r];
  EXPECT_THROW(cluster.run([](int, Communicator&) {}), CommError);  // a failed cluster stays failed
}

TEST(InProcErrors, MismatchedOperationsAndAsymmetricPeers) {
  {
    InProcCluster cluster(3, {}, 5.0);
    auto msgs = comm_errors(cluster, [](int r, Communicator& c) {
      auto t = torch::zeros({4});
      std::vector<torch::Tensor> recv;
      if (r == 1) c.exchange({}, t, recv);
      else c.all_reduce_mean(t);
    });
    for (auto& m : msgs) EXPECT_NE(m.find("rank 0 called all_reduce_mean, rank 1 called exchange"), std::string::npos) << m;
  }
  {
    InProcCluster cluster(3, {}, 5.0);
    auto msgs = comm_errors(cluster, [](int r, Communicator& c) {
      std::vector<torch::Tensor> recv;
      const std::vector<std::vector<int>> peers = {{1, 2}, {0}, {}};
      c.exchange(peers[r], torch::zeros({4}), recv);
    });
    for (auto& m : msgs) EXPECT_NE(m.find("exchange: rank 0 lists rank 2 as a peer but rank 2 does not list rank 0"), std::string::npos) << m;
  }
  {
    InProcCluster cluster(2, {}, 5.0);
    auto msgs = comm_errors(cluster, [](int r, Communicator& c) {
      auto t = torch::zeros({4}, r == 0 ? torch::kFloat32 : torch::kFloat64);
      c.broadcast(t, 0);
    });
    for (auto& m : msgs) EXPECT_NE(m.find("broadcast: rank 1 sent Double, rank 0 sent Float"), std::string::npos) << m;
  }
}

TEST(InProcErrors, ThrowingWorkerFailsTheOthersPromptly) {
  InProcCluster cluster(4, {}, 2.0);
  std::vector<std::string> msgs(4);
  std::mutex mu;
  const auto t0 = std::chrono::steady_clock::now();
  bool rethrew_original = false;
  try {
    cluster.run([&](int r, Communicator& c) {
      auto t = torch::ones({10});
      c.all_reduce_mean(t);  // everyone gets through one call
      if (r == 2) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the others are blocked by now
        throw std::runtime_error("boom");
      }
      try {
        c.all_reduce_mean(t);
      } catch (const CommError& e) {
        std::lock_guard lk(mu);
        msgs[r] = e.what();
      }
      c.barrier();  // later calls fail at once too
    });
  } catch (const CommError&) {
    FAIL() << "run() rethrew a CommError, not the original exception";
  } catch (const std::runtime_error& e) {
    rethrew_original = std::string(e.what()) == "boom";
  }
  EXPECT_TRUE(rethrew_original);
  EXPECT_LT(seconds_since(t0), 1.0);  // well under the 2 s timeout
  for (int r : {0, 1, 3}) EXPECT_NE(msgs[r].find("all_reduce_mean: rank 2 failed: boom"), std::string::npos) << msgs[r];
}

TEST(InProcErrors, MissingPeerTimesOut) {
  InProcCluster cluster(3, {}, 0.5);
  std::atomic<int> failed{0};
  std::vector<std::string> msgs(3);
  const auto t0 = std::chrono::steady_clock::now();
  std::string run_error;
  try {
    cluster.run([&](int r, Communicator& c) {
      if (r == 2) {  // alive but never calls: waits (boundedly) until the others gave up
        for (int i = 0; i < 1000 && failed.load() < 2; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
        return;
      }
      std::vector<torch::Tensor> recv;
      try {
        c.exchange({1 - r}, torch::zeros({4}), recv);
      } catch (const CommError& e) {
        msgs[r] = e.what();
      }
      ++failed;
    });
  } catch (const CommError& e) {
    run_error = e.what();
  }
  const double elapsed = seconds_since(t0);
  EXPECT_GE(elapsed, 0.5);
  EXPECT_LT(elapsed, 5.0);
  EXPECT_NE(run_error.find("timed out after 0.5 s waiting for rank 2 to enter exchange"), std::string::npos) << run_error;
  for (int r : {0, 1}) {
    EXPECT_NE(msgs[r].find("exchange: "), std::string::npos) << msgs[r];
    EXPECT_NE(msgs[r].find("waiting for rank 2"), std::string::npos) << msgs[r];
  }
}

// A process stopped (Ctrl+Z, SIGSTOP) while a rank waits for a peer continues when resumed: the
// timeout counts time the process ran. A helper process stops this one for 3 s while rank 0
// waits, continues it, and half a second later lets rank 1 enter (through a pipe, so rank 1
// enters only after the stop); counted on the wall clock, rank 0 would time out (2 s) as soon as
// it runs again.
TEST(InProcErrors, StoppedProcessDoesNotTimeOutWhenContinued) {
  int go[2];
  ASSERT_EQ(pipe(go), 0);
  const pid_t parent = getpid();
  const pid_t helper = fork();
  ASSERT_GE(helper, 0);
  if (helper == 0) {  // only async-signal-safe calls after fork in a threaded process
    usleep(300000);
    kill(parent, SIGSTOP);
    usleep(3000000);
    kill(parent, SIGCONT);
    usleep(500000);
    const char x = 'x';
    _exit(write(go[1], &x, 1) == 1 ? 0 : 1);
  }
  close(go[1]);
  InProcCluster cluster(2, {}, 2.0);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<torch::Tensor> got(2);
  cluster.run([&](int r, Communicator& c) {
    if (r == 1) {
      char x = 0;
      ASSERT_EQ(read(go[0], &x, 1), 1);
    }
    std::vector<torch::Tensor> recv;
    c.exchange({1 - r}, torch::full({4}, static_cast<float>(r)), recv);
    got[r] = recv.at(0);
  });
  int status = 0;
  ASSERT_EQ(waitpid(helper, &status, 0), helper);
  close(go[0]);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_GE(seconds_since(t0), 3.5);  // the stop happened while rank 0 waited
  EXPECT_TRUE(torch::equal(got[0], torch::full({4}, 1.0f)));
  EXPECT_TRUE(torch::equal(got[1], torch::full({4}, 0.0f)));
}

TEST(InProcErrors, RankThatReturnsEarlyFailsTheOthersAtOnce) {
  InProcCluster cluster(3, {}, 30.0);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    cluster.run([&](int r, Communicator& c) {
      if (r != 1) c.barrier();
    });
    FAIL() << "run() should throw";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 returned from the worker function without entering barrier"), std::string::npos)
        << e.what();
  }
  EXPECT_LT(seconds_since(t0), 5.0);
}

// ---- scale ----------------------------------------------------------------------------------

TEST(InProc, SixtyFourWorkers) {
  const int n = 64;
  InProcCluster cluster(n);
  std::vector<torch::Tensor> mean(n);
  std::vector<std::vector<torch::Tensor>> recv(n);
  cluster.run([&](int r, Communicator& c) {
    auto t = torch::full({1000}, static_cast<float>(r));
    c.exchange({r ^ 1}, t, recv[r]);
    c.all_reduce_mean(t);
    mean[r] = t;
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(recv[r].size(), 1u);
    EXPECT_TRUE(torch::equal(recv[r][0], torch::full({1000}, static_cast<float>(r ^ 1)))) << "rank " << r;
    EXPECT_TRUE(torch::equal(mean[r], torch::full({1000}, 31.5f))) << "rank " << r;
  }
}

TEST(InProcClock, LatencyPerLinkAndRegionsPriceEachLink) {
  // Worker 1's link has 50 ms: its pair pays it, the other pair 1 ms. Then two regions {0, 1} and
  // {2, 3} joined by 100 ms, 10 Mbit/s links: a pair inside a region is priced as before, a pair
  // across pays the inter-region latency and moves its 4000 bytes at 1.25e6 B/s.
  {
    NetworkModel m;
    m.latency_per_rank = {1e-3, 0.05, 1e-3, 1e-3};
    InProcCluster cluster(4, m);
    cluster.run([](int r, Communicator& c) {
      std::vector<torch::Tensor> recv;
      c.exchange({r ^ 1}, torch::zeros({1000}), recv);
    });
    EXPECT_NEAR(cluster.clock(0), 0.05 + 4000 / 125e6, kTol);
    EXPECT_NEAR(cluster.clock(1), 0.05 + 4000 / 125e6, kTol);
    EXPECT_NEAR(cluster.clock(2), 1e-3 + 4000 / 125e6, kTol);
  }
  NetworkModel regions;
  regions.region = {0, 0, 1, 1};
  regions.inter_region_latency_s = 0.1;
  regions.inter_region_Bps = 1.25e6;
  for (int across : {1, 2}) {
    InProcCluster cluster(4, regions);
    cluster.run([&](int r, Communicator& c) {
      std::vector<torch::Tensor> recv;
      c.exchange({r ^ across}, torch::zeros({1000}), recv);
    });
    const double want = across == 1 ? 1e-3 + 4000 / 125e6 : 0.1 + 4000 / 1.25e6;
    for (int r = 0; r < 4; ++r) EXPECT_NEAR(cluster.clock(r), want, kTol) << "partner r ^ " << across;
  }
  // All-reduces over the two regions, 4000 bytes, 1.5 x 4000 moved per worker at the cap:
  // ring: links 0-1, 1-2, 2-3, 3-0; two cross, so each of its 6 steps pays 100 ms;
  // tree: distance 1 pairs (0, 1), (2, 3) stay inside (1 ms), distance 2 pairs cross (100 ms),
  // each twice.
  const double bytes = 1.5 * 4000 / 1.25e6;
  EXPECT_NEAR(members_allreduce_seconds(regions, 4000, {0, 1, 2, 3}), 6 * 0.1 + bytes, 1e-12);
  regions.allreduce = AllReducePattern::tree;
  EXPECT_NEAR(members_allreduce_seconds(regions, 4000, {0, 1, 2, 3}), 2 * (1e-3 + 0.1) + bytes, 1e-12);
  InProcCluster cluster(4, regions);
  cluster.run([](int, Communicator& c) {
    auto t = torch::ones({1000});
    c.all_reduce_mean(t);
  });
  for (int r = 0; r < 4; ++r) EXPECT_NEAR(cluster.clock(r), 2 * (1e-3 + 0.1) + bytes, kTol);
  // Members inside one region pay no inter-region price.
  EXPECT_NEAR(members_allreduce_seconds(regions, 4000, {2, 3}), 2 * 1e-3 + 4000 / 125e6, 1e-12);
}

TEST(InProcClock, UniformLinksPriceAllReducesByTheClosedForms) {
  // Bit for bit: the per-link path must not move any clock of a run without per-link settings.
  for (auto pattern : {AllReducePattern::ring, AllReducePattern::tree}) {
    NetworkModel m;
    m.allreduce = pattern;
    m.bandwidth_scale = {1, 0.5, 1, 1, 0.25, 1, 1, 1, 1};
    for (int n = 1; n <= 9; ++n) {
      std::vector<int> members;
      double min_B = m.bandwidth(0);
      for (int r = 0; r < n; ++r) members.push_back(r), min_B = std::min(min_B, m.bandwidth(r));
      EXPECT_EQ(members_allreduce_seconds(m, 12345, members), allreduce_seconds(m, 12345, n, min_B)) << n;
    }
  }
}

TEST(InProcClock, ThousandWorkersInFourRegions) {
  // 1,024 workers in four regions of 256, 5 ms inside, 80 ms between, no bytes: the tree pays
  // 8 distances inside (1..128) and 2 across (256, 512), each twice: 2 (8 x 5 + 2 x 80) ms = 0.4 s;
  // the ring's 2046 steps each pay the 80 ms of its slowest link: 163.68 s.
  NetworkModel m;
  m.latency_s = 5e-3;
  m.inter_region_latency_s = 0.08;
  std::vector<int> members;
  for (int r = 0; r < 1024; ++r) m.region.push_back(r / 256), members.push_back(r);
  EXPECT_NEAR(members_allreduce_seconds(m, 0, members), 163.68, 1e-9);
  m.allreduce = AllReducePattern::tree;
  EXPECT_NEAR(members_allreduce_seconds(m, 0, members), 0.4, 1e-12);
}
