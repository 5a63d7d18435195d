// The Gloo backend: ranks as threads of this process (each its own GlooCommunicator over real
// TCP on loopback, meeting at a store on an OS-assigned port), checked against exact values and
// against the in-process reference; then real processes through `gasloc launch` and
// `gasloc comm-check`; and the failures users hit: dead or silent peers, mismatched buffers,
// bad environment, a port in use. Every failure must be a CommError that names the rank, fast.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "gasloc/comm/cluster.hpp"
#include "gasloc/comm/elastic_gloo.hpp"
#include "gasloc/comm/elastic_host.hpp"
#include "gasloc/comm/elastic_roster.hpp"
#include "gasloc/comm/gloo.hpp"
#include "gasloc/comm/nccl.hpp"
#include "gasloc/comm/inproc.hpp"
#include "gasloc/comm/pair_transfer.hpp"
#include "gasloc/comm/rendezvous.hpp"
#include "gasloc/core/error.hpp"
#include "test_paths.hpp"

using namespace gasloc;
using namespace gasloc::comm;
namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Runs f(rank, comm) for n Gloo ranks as threads; returns each rank's error ("" = none).
// `tweak` may change a rank's options (timeout, world, limit) before it joins.
// `failed_ranks`, when given, receives each rank's CommError::failed_rank() (-2: no CommError).
// `job`: the job's identity, its secret too (a store host and ranks with it: sealed transfers).
std::vector<std::string> run_gloo(int n, const std::function<void(int, Communicator&)>& f, double timeout_s = 20,
                                  const std::function<void(GlooOptions&)>& tweak = {},
                                  std::vector<int>* failed_ranks = nullptr, const JobIdentity& job = {}) {
  StoreHost host("127.0.0.1", 0, timeout_s, job);
  std::vector<std::string> errors(n);
  if (failed_ranks) failed_ranks->assign(n, -2);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        GlooOptions o;
        o.rank = r;
        o.world = n;
        o.master_addr = "127.0.0.1";
        o.master_port = host.port();
        o.timeout_s = timeout_s;
        o.connect_only = true;
        o.job = job;
        if (tweak) tweak(o);
        GlooCommunicator c(o);
        f(r, c);
      } catch (const CommError& e) {
        errors[r] = e.what();
        if (failed_ranks) (*failed_ranks)[r] = e.failed_rank();
      } catch (const std::exception& e) {
        errors[r] = e.what();
        if (errors[r].empty()) errors[r] = "(empty message)";
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

void expect_no_errors(const std::vector<std::string>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

torch::Tensor integer_data(int r, int64_t numel) {
  return (torch::arange(numel, torch::kInt64).remainder(1000) * (r + 1) - 7 * r).to(torch::kFloat);
}
torch::Tensor noise_data(int r, int64_t numel) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(99 + r));
  return torch::randn({numel}, gen, torch::kFloat) * 3;
}
torch::Tensor rank_order_mean(int n, const std::function<torch::Tensor(int)>& input) {
  torch::Tensor s = input(0).clone();
  for (int r = 1; r < n; ++r) s.add_(input(r));
  return s.div_(n);
}
torch::Tensor message(int r, int round, int64_t numel) {
  return torch::arange(numel, torch::kFloat).mul_(0.5).add_(static_cast<double>(10000 * r + round));
}
std::vector<int> pair_peers(int r, int n) { return (r ^ 1) < n ? std::vector<int>{r ^ 1} : std::vector<int>{}; }
std::vector<int> ring_peers(int r, int n) {
  return n == 2 ? std::vector<int>{1 - r} : std::vector<int>{(r + n - 1) % n, (r + 1) % n};
}

std::string getenv_or(const char* k, const std::string& d) {
  const char* v = std::getenv(k);
  return v ? v : d;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Environment parsing.

namespace {
GlooOptions parse_env(std::map<std::string, std::string> env) {
  return gloo_options_from_env([&](const char* k) -> const char* {
    auto it = env.find(k);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}
std::string env_error(std::map<std::string, std::string> env) {
  try {
    parse_env(std::move(env));
  } catch (const Error& e) {
    return std::string(e.what()) + " | " + e.hint();
  }
  return "";
}
const std::map<std::string, std::string> kGoodEnv = {
    {"RANK", "1"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29555"}};
}  // namespace

TEST(GlooEnv, ReadsTorchrunVariables) {
  auto env = kGoodEnv;
  env["LOCAL_RANK"] = "1";
  env["GASLOC_COMM_TIMEOUT"] = "7.5";  // not read: the timeout comes from the job or the command line
  const auto o = parse_env(env);
  EXPECT_EQ(o.rank, 1);
  EXPECT_EQ(o.world, 4);
  EXPECT_EQ(o.master_addr, "127.0.0.1");
  EXPECT_EQ(o.master_port, 29555);
  EXPECT_EQ(o.local_rank, 1);
  EXPECT_DOUBLE_EQ(o.timeout_s, GlooOptions{}.timeout_s);
  EXPECT_DOUBLE_EQ(o.bandwidth_limit_Bps, 0);
  EXPECT_FALSE(o.connect_only);
  env["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  EXPECT_TRUE(parse_env(env).connect_only);
  EXPECT_DOUBLE_EQ(parse_bandwidth_limit("1e8", 3), 1e8);
  EXPECT_DOUBLE_EQ(parse_bandwidth_limit("2=5", 3), 0);
  EXPECT_DOUBLE_EQ(parse_bandwidth_limit("0=1e6,1=2.5e7", 1), 2.5e7);
  EXPECT_THROW(parse_bandwidth_limit("fast", 1), CommError);
}

TEST(GlooEnv, MissingVariablesAreNamedWithHowToLaunch) {
  auto e = env_error({});
  EXPECT_NE(e.find("RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT are not set"), std::string::npos) << e;
  EXPECT_NE(e.find("gasloc launch -n N"), std::string::npos) << e;
  EXPECT_NE(e.find("torchrun"), std::string::npos) << e;
  auto env = kGoodEnv;
  env.erase("MASTER_PORT");
  e = env_error(env);
  EXPECT_NE(e.find("MASTER_PORT is not set"), std::string::npos) << e;
}

TEST(GlooEnv, BadValuesAreClearErrors) {
  auto bad = [](const char* k, const char* v) {
    auto env = kGoodEnv;
    env[k] = v;
    return env_error(env);
  };
  EXPECT_NE(bad("WORLD_SIZE", "four").find("WORLD_SIZE='four' is not an integer"), std::string::npos);
  EXPECT_NE(bad("RANK", "1x").find("RANK='1x' is not an integer"), std::string::npos);
  EXPECT_EQ(bad("RANK", "4"), "");  // too large: checked at the store, so that every rank hears of it
  EXPECT_NE(bad("RANK", "-1").find("RANK=-1 must not be negative"), std::string::npos);
  EXPECT_NE(bad("WORLD_SIZE", "0").find("WORLD_SIZE=0 must be at least 1"), std::string::npos);
  EXPECT_NE(bad("MASTER_PORT", "70000").find("MASTER_PORT=70000 is outside 1..65535"), std::string::npos);
  EXPECT_NE(bad("MASTER_PORT", "0").find("MASTER_PORT=0 is outside"), std::string::npos);
  EXPECT_NE(bad("LOCAL_RANK", "a").find("LOCAL_RANK='a'"), std::string::npos);
}

TEST(GlooTokenBucket, PacesToTheRate) {
  TokenBucket unlimited;
  EXPECT_EQ(unlimited.take(1e12), 0.0);
  TokenBucket b(1e6, 0);  // 1 MB/s, no burst
  EXPECT_NEAR(b.take(5e5), 0.5, 0.01);  // half a second of debt
  // Right away, another 0.5 MB: the first debt is not repaid yet, so the wait adds up.
  EXPECT_NEAR(b.take(5e5), 1.0, 0.02);
}

// ---------------------------------------------------------------------------------------------
// Ranks as threads.

// Gloo prints a port as sin_port lies in memory (network byte order); gasloc's messages show the
// port itself.
TEST(GlooMessages, PortsThatGlooPrintsInNetworkByteOrderAreDecoded) {
  sockaddr_in in{};
  in.sin_port = htons(41235);
  const int printed = in.sin_port;  // what Gloo's Address::str() writes
  const std::string gloo = fmt::format("[../third_party/gloo/gloo/transport/tcp/pair.cc:799] connect [127.0.0.1]:{}: "
                                       "Connection refused",
                                       printed);
  EXPECT_EQ(first_line(gloo), "connect [127.0.0.1]:41235: Connection refused");
  EXPECT_EQ(backend_error(std::runtime_error(gloo + "\nException raised from ...")),
            "connect [127.0.0.1]:41235: Connection refused; Exception raised from ...");
  // IPv6, a sequence number after the port, two addresses in one message.
  sockaddr_in6 in6{};
  in6.sin6_port = htons(29500);
  EXPECT_EQ(gloo_ports_decoded(fmt::format("Read error [::1]:{}$3: Connection reset by peer; then [10.1.2.3]:{}", in6.sin6_port,
                                           in.sin_port)),
            "Read error [::1]:29500$3: Connection reset by peer; then [10.1.2.3]:41235");
  // Brackets that hold no IP address, or no port, are not Gloo's addresses.
  for (const std::string kept : {"[rank 1]:5025", "[pair.cc:12]:5025", "[127.0.0.1] no port", "[127.0.0.1]:",
                                 "[127.0.0.1]:9999999", "[127.0.0.1:5025", "connect [none]"})
    EXPECT_EQ(gloo_ports_decoded(kept), kept);
}

TEST(GlooThreads, AllReduceMeanOfIntegerDataIsExact) {
  for (int n : {2, 3, 4, 8}) {
    const int64_t N = 10007;
    std::vector<torch::Tensor> out(n);
    expect_no_errors(run_gloo(n, [&](int r, Communicator& c) {
      EXPECT_EQ(c.rank(), r);
      EXPECT_EQ(c.world(), n);
      auto t = integer_data(r, N);
      c.all_reduce_mean(t);
      out[r] = t;
    }));
    const auto ref = rank_order_mean(n, [&](int r) { return integer_data(r, N); });
    for (int r = 0; r < n; ++r) EXPECT_TRUE(out[r].defined() && torch::equal(out[r], ref)) << "n=" << n << " rank " << r;
  }
}

TEST(GlooThreads, AllReduceMeanOfRandomDataMatchesRankOrderMean) {
  for (int n : {2, 3, 4, 8}) {
    const int64_t N = 50000;
    std::vector<torch::Tensor> out(n);
    expect_no_errors(run_gloo(n, [&](int r, Communicator& c) {
      auto t = noise_data(r, N).view({100, 500});  // any shape; a non-contiguous one too
      c.all_reduce_mean(t);
      out[r] = t.reshape({-1});
      auto nc = noise_data(r, N).view({500, 100}).t();
      c.all_reduce_mean(nc);
      EXPECT_TRUE(torch::allclose(nc.t().reshape({-1}), out[r], 0, 1e-6));
    }));
    const auto ref = rank_order_mean(n, [&](int r) { return noise_data(r, N); });
    for (int r = 0; r < n; ++r) {
      ASSERT_TRUE(out[r].defined());
      EXPECT_LE((out[r] - ref).abs().max().item<double>(), 1e-6) << "n=" << n << " rank " << r;
      EXPECT_TRUE(torch::equal(out[r], out[0])) << "every rank holds the same bits";
    }
  }
}

TEST(GlooThreads, ExchangeOnPairsAndRingReturnsPeersTensorsExactly) {
  for (int n : {2, 3, 4, 8}) {
    const int64_t N = 30011;
    expect_no_errors(run_gloo(n, [&](int r, Communicator& c) {
      std::vector<torch::Tensor> recv;
      for (int round = 0; round < 4; ++round) {  // alternate graphs: the tags keep rounds apart
        const auto peers = round % 2 == 0 ? pair_peers(r, n) : ring_peers(r, n);
        c.exchange(peers, message(r, round, N), recv);
        ASSERT_EQ(recv.size(), peers.size());
        for (size_t k = 0; k < peers.size(); ++k)
          EXPECT_TRUE(torch::equal(recv[k], message(peers[k], round, N)))
              << "n=" << n << " rank " << r << " round " << round << " from " << peers[k];
      }
      const auto s = c.stats();
      EXPECT_GT(s.bytes_sent, 0);
      EXPECT_EQ(s.bytes_sent, s.bytes_received);
      EXPECT_GE(s.idle_s, 0.0);
    }));
  }
}

TEST(GlooThreads, KeptReceiveTensorsAreNotOverwritten) {
  expect_no_errors(run_gloo(2, [&](int r, Communicator& c) {
    std::vector<torch::Tensor> recv;
    c.exchange({1 - r}, message(r, 0, 100), recv);
    const torch::Tensor kept = recv[0];
    c.exchange({1 - r}, message(r, 1, 100), recv);
    EXPECT_TRUE(torch::equal(kept, message(1 - r, 0, 100)));
    EXPECT_TRUE(torch::equal(recv[0], message(1 - r, 1, 100)));
  }));
}

TEST(GlooThreads, BroadcastBarrierAndClock) {
  expect_no_errors(run_gloo(3, [&](int r, Communicator& c) {
    auto t = r == 1 ? message(1, 5, 1000) : torch::zeros({1000});
    c.broadcast(t, 1);
    EXPECT_TRUE(torch::equal(t, message(1, 5, 1000)));
    const double t0 = c.now();
    c.barrier();
    EXPECT_GE(c.now(), t0);
    c.compute(10);  // a real clock ignores it
    auto bad = torch::zeros({4});
    std::vector<torch::Tensor> recv;
    EXPECT_THROW(c.broadcast(bad, 3), CommError);     // no rank 3
    EXPECT_THROW(c.exchange({r}, bad, recv), CommError);  // not with itself
  }));
}

// The Gloo backend works on CPU tensors; anything else is refused by name, before any transfer.
TEST(GlooThreads, TensorsOnAnotherDeviceAreRefused) {
  expect_no_errors(run_gloo(2, [&](int r, Communicator& c) {
    auto meta = torch::empty({4}, torch::TensorOptions().device(torch::kMeta));
    std::vector<torch::Tensor> recv;
    for (auto* op : {"all_reduce_mean", "exchange", "broadcast"}) {
      try {
        if (op == std::string("all_reduce_mean")) c.all_reduce_mean(meta);
        else if (op == std::string("exchange")) c.exchange({1 - r}, meta, recv);
        else c.broadcast(meta, 0);
        ADD_FAILURE() << op << " accepted a meta tensor";
      } catch (const CommError& e) {
        EXPECT_NE(std::string(e.what()).find(std::string(op) + " with the Gloo backend needs tensors on cpu, got one on meta"),
                  std::string::npos)
            << e.what();
      }
    }
    auto t = torch::full({3}, static_cast<float>(r));  // still usable: nothing was sent
    c.all_reduce_mean(t);
    EXPECT_TRUE(torch::equal(t, torch::full({3}, 0.5f)));
  }));
}

// Overlapped forms (algo.overlap_steps): the same bits as the blocking ones, with a collective of
// the control channel run while they travel, as evaluations and stop checks do. `job`: with a
// secret every one of them is made of sealed pair transfers, the blocking ones beside the
// overlapped ones' on the same pairs (their own lane: pair_transfer.hpp).
namespace {
void check_overlapped_beside_blocking(int n, const JobIdentity& job) {
  const int64_t N = 30011;
  const bool sealed = !job.secret.empty();
  expect_no_errors(run_gloo(
      n,
      [&](int r, Communicator& c) {
        for (int round = 0; round < 3; ++round) {
          const auto peers = ring_peers(r, n);
          const auto send = message(r, round, N);
          std::vector<torch::Tensor> recv;
          auto pending = c.start_exchange(peers, send, recv);
          ASSERT_EQ(recv.size(), peers.size());
          auto beside = torch::full({8}, static_cast<float>(r));
          c.all_reduce_mean(beside);
          EXPECT_TRUE(torch::equal(beside, torch::full({8}, (n - 1) / 2.0f)));
          pending->wait();
          for (size_t k = 0; k < peers.size(); ++k)
            EXPECT_TRUE(torch::equal(recv[k], message(peers[k], round, N))) << "n=" << n << " rank " << r << " round " << round;
        }
        auto blocking = noise_data(r, N);
        c.all_reduce_mean(blocking);
        auto overlapped = noise_data(r, N);
        const auto before = c.stats();
        auto pending = c.start_all_reduce_mean(overlapped);
        auto beside = torch::full({8}, static_cast<float>(r));
        c.broadcast(beside, 0);
        EXPECT_TRUE(torch::equal(beside, torch::zeros({8})));
        auto beside_sum = torch::full({8}, static_cast<float>(r));
        c.all_reduce_mean(beside_sum);
        EXPECT_TRUE(torch::equal(beside_sum, torch::full({8}, (n - 1) / 2.0f)));
        pending->wait();
        EXPECT_TRUE(torch::equal(overlapped, blocking)) << "n=" << n << " rank " << r;
        if (!sealed)
          EXPECT_EQ(c.stats().bytes_sent - before.bytes_sent,
                    ring_allreduce_bytes(N * 4, n) + (r < n - 1 ? 8 * 4 : 0) + ring_allreduce_bytes(8 * 4, n));
        EXPECT_THROW(pending->wait(), CommError);  // once
      },
      20, {}, nullptr, job));
}
}  // namespace

TEST(GlooThreads, OverlappedOperationsGiveTheBlockingResults) {
  for (int n : {2, 4}) check_overlapped_beside_blocking(n, JobIdentity{});
}

// start_exchange returns before its peer has started: rank 1 starts only after rank 0's start has
// returned, which a start that completed the exchange itself would never do (it would time out).
TEST(GlooThreads, OverlappedExchangeReturnsBeforeThePeerStarts) {
  std::atomic<bool> started{false};
  expect_no_errors(run_gloo(
      2,
      [&](int r, Communicator& c) {
        std::vector<torch::Tensor> recv;
        if (r == 1)
          while (!started.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        auto pending = c.start_exchange({1 - r}, message(r, 0, 1000), recv);
        if (r == 0) started = true;
        std::vector<torch::Tensor> other;
        EXPECT_THROW(c.start_exchange({1 - r}, message(r, 1, 1000), other), CommError);  // one in flight
        EXPECT_THROW(c.exchange({1 - r}, message(r, 1, 1000), other), CommError);
        pending->wait();
        EXPECT_TRUE(torch::equal(recv[0], message(1 - r, 0, 1000)));
        c.exchange({1 - r}, message(r, 2, 1000), recv);  // usable again
        EXPECT_TRUE(torch::equal(recv[0], message(1 - r, 2, 1000)));
      },
      5));
}

// A failed overlapped exchange surfaces at wait(), naming the peer, and the group is then unusable.
TEST(GlooThreads, OverlappedExchangeFailureSurfacesAtWait) {
  const auto errors = run_gloo(
      2,
      [&](int r, Communicator& c) {
        std::vector<torch::Tensor> recv;
        if (r == 1) return;  // never sends
        auto pending = c.start_exchange({1}, message(0, 0, 100), recv);
        try {
          pending->wait();
          ADD_FAILURE() << "wait() succeeded without a peer";
        } catch (const CommError& e) {
          EXPECT_NE(std::string(e.what()).find("exchange with rank 1"), std::string::npos) << e.what();
        }
        auto t = torch::ones({3});
        c.all_reduce_mean(t);  // unusable now: throws the first error again
      },
      2);
  EXPECT_NE(errors[0].find("already failed"), std::string::npos) << errors[0];
}

// completed() turns true once the transfer has landed, without wait(); abort() of an exchange
// whose peer never comes ends its wait within a moment (not at the 20 s timeout), and wait()
// says it was aborted.
TEST(GlooThreads, OverlappedExchangeCompletesOrIsAbortedAtOnce) {
  std::atomic<bool> aborted{false};
  expect_no_errors(run_gloo(
      2,
      [&](int r, Communicator& c) {
        std::vector<torch::Tensor> recv;
        auto pending = c.start_exchange({1 - r}, message(r, 0, 1000), recv);
        const auto t0 = Clock::now();
        while (!pending->completed() && since(t0) < 10) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        EXPECT_TRUE(pending->completed());
        pending->wait();
        EXPECT_TRUE(torch::equal(recv[0], message(1 - r, 0, 1000)));
        if (r == 1) {  // never takes part in the next exchange
          while (!aborted.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
          return;
        }
        auto lonely = c.start_exchange({1}, message(0, 1, 1000), recv);
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        EXPECT_FALSE(lonely->completed());
        const auto t1 = Clock::now();
        lonely->abort();
        try {
          lonely->wait();
          ADD_FAILURE() << "an aborted exchange's wait() succeeded";
        } catch (const CommError& e) {
          EXPECT_NE(std::string(e.what()).find("aborted"), std::string::npos) << e.what();
        }
        EXPECT_LT(since(t1), 5.0);  // the timeout is 20 s: ended by the abort
        aborted = true;
      },
      20));
}

// A process rank's control channel (evaluation, metrics) is the same group, but what it sends
// and waits is not in comm(r).stats(): both backends report the algorithm's traffic alone.
TEST(GlooThreads, ControlChannelIsNotCounted) {
  StoreHost host("127.0.0.1", 0, 20);
  std::vector<std::string> errors(2);
  std::vector<CommStats> algo(2), control(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      try {
        GlooOptions o{r, 2, "127.0.0.1", host.port(), 20};
        o.connect_only = true;
        auto cluster = process_cluster(std::make_unique<GlooCommunicator>(o));
        EXPECT_EQ(cluster->local_ranks(), std::vector<int>{r});
        EXPECT_EQ(cluster->processes(), &cluster->control(r));
        EXPECT_THROW(cluster->comm(1 - r), CommError);  // not hosted here
        cluster->run([&](int rank, Communicator& c) {
          auto big = torch::ones({100000});
          cluster->control(rank).all_reduce_mean(big);
          cluster->control(rank).barrier();
          EXPECT_EQ(c.stats().bytes_sent, 0);
          auto small = torch::ones({1000});
          c.all_reduce_mean(small);
          algo[rank] = c.stats();
          control[rank] = cluster->control(rank).stats();
        });
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  expect_no_errors(errors);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(algo[r].bytes_sent, 1000 * 4) << "rank " << r;  // 2(n-1)/n of the buffer, n = 2
    EXPECT_EQ(control[r].bytes_sent, 100000 * 4) << "rank " << r;
    EXPECT_GE(algo[r].idle_s, 0.0) << "rank " << r;
  }
}

// Without a CUDA LibTorch, asking for NCCL is a configuration error that says what to do, raised
// before the launcher's variables are read.
TEST(ProcessBackends, NcclWithoutItIsAClearConfigError) {
  if (kHaveNccl) GTEST_SKIP() << "this build has the NCCL backend";
  try {
    ClusterOptions o;
    o.backend = "nccl";
    make_cluster(o);
    ADD_FAILURE() << "make_cluster accepted nccl";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("the nccl backend is not in this build"), std::string::npos) << e.what();
    EXPECT_NE(e.hint().find("gloo"), std::string::npos) << e.hint();
  }
  EXPECT_THROW(check_process_backend("mpi"), ConfigError);
  EXPECT_NO_THROW(check_process_backend("gloo"));
}

TEST(GlooThreads, MatchesTheInProcessReference) {
  const int n = 4;
  const int64_t N = 20000;
  struct Out {
    torch::Tensor ints, floats;
    std::vector<std::vector<torch::Tensor>> recv;
  };
  auto body = [&](std::vector<Out>& out) {
    return [&](int r, Communicator& c) {
      auto a = integer_data(r, N);
      c.all_reduce_mean(a);
      auto b = noise_data(r, N);
      c.all_reduce_mean(b);
      out[r].ints = a;
      out[r].floats = b;
      for (int round = 0; round < 2; ++round) {
        std::vector<torch::Tensor> recv;
        c.exchange(round == 0 ? pair_peers(r, n) : ring_peers(r, n), message(r, round, N), recv);
        out[r].recv.push_back(recv);
      }
    };
  };
  std::vector<Out> ref(n), got(n);
  InProcCluster cluster(n);
  cluster.run(body(ref));
  expect_no_errors(run_gloo(n, body(got)));
  for (int r = 0; r < n; ++r) {
    EXPECT_TRUE(torch::equal(got[r].ints, ref[r].ints)) << "rank " << r;
    EXPECT_LE((got[r].floats - ref[r].floats).abs().max().item<double>(), 1e-6) << "rank " << r;
    ASSERT_EQ(got[r].recv.size(), ref[r].recv.size());
    for (size_t k = 0; k < ref[r].recv.size(); ++k) {
      ASSERT_EQ(got[r].recv[k].size(), ref[r].recv[k].size());
      for (size_t j = 0; j < ref[r].recv[k].size(); ++j) EXPECT_TRUE(torch::equal(got[r].recv[k][j], ref[r].recv[k][j]));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// A job with a secret: every transfer sealed (pair_transfer.hpp), all-reduces and broadcasts made
// of sealed transfers. An attacker on the path is played by the transport's test hook below.

namespace {

const JobIdentity kSealedJob{"sealed-job", "test", std::string(32, '\x3c')};

// What the hook does to the sealed messages of one direction (from -> to) of one phase.
struct Tamper {
  std::atomic<int> mode{0};  // 0: nothing; 1: flip a byte of the n-th such message; 2: replace it by the first one
  int from = 1, to = 0, phase = 1, nth = 1;
  std::mutex mu;
  int seen = 0;
  std::vector<uint8_t> first;
  std::atomic<int> done{0};  // messages altered
};
Tamper g_tamper;

}  // namespace

// The transport's hook (pair_transfer.hpp): an attacker on the path, in this test program only.
extern "C" void gasloc_test_tamper_sealed(uint8_t* bytes, size_t n, int from_rank, int to_rank, int phase) {
  Tamper& t = g_tamper;
  if (t.mode.load() == 0 || from_rank != t.from || to_rank != t.to || phase != t.phase) return;
  std::lock_guard lock(t.mu);
  const int k = t.seen++;
  if (k == 0) t.first.assign(bytes, bytes + n);
  if (k != t.nth) return;
  if (t.mode.load() == 1) {
    bytes[n / 2] ^= 0x01;
  } else if (t.first.size() == n) {
    std::copy(t.first.begin(), t.first.end(), bytes);
  } else {
    return;
  }
  ++t.done;
}

namespace {
struct TamperScope {
  TamperScope(int mode, int from, int to, int phase, int nth) {
    g_tamper.from = from, g_tamper.to = to, g_tamper.phase = phase, g_tamper.nth = nth;
    g_tamper.seen = 0, g_tamper.first.clear(), g_tamper.done = 0;
    g_tamper.mode = mode;
  }
  ~TamperScope() { g_tamper.mode = 0; }
};
}  // namespace

TEST(GlooSealed, MatchesTheInProcessReferenceBitForBit) {
  const int n = 4;
  const int64_t N = 20000;
  struct Out {
    torch::Tensor ints, floats, halves, overlapped, cast;
    std::vector<std::vector<torch::Tensor>> recv;
    CommStats stats;
  };
  auto body = [&](std::vector<Out>& out) {
    return [&](int r, Communicator& c) {
      auto a = integer_data(r, N);
      c.all_reduce_mean(a);
      auto b = noise_data(r, N);
      c.all_reduce_mean(b);
      auto h = noise_data(r, 999).to(torch::kBFloat16);
      c.all_reduce_mean(h);
      auto o = noise_data(r + 7, N);
      c.start_all_reduce_mean(o)->wait();
      auto cast = noise_data(r + 3, 333);
      c.broadcast(cast, 2);
      out[r] = {a, b, h, o, cast, {}, {}};
      for (int round = 0; round < 2; ++round) {
        std::vector<torch::Tensor> recv;
        c.exchange(round == 0 ? pair_peers(r, n) : ring_peers(r, n), message(r, round, N), recv);
        out[r].recv.push_back(recv);
      }
      std::vector<torch::Tensor> recv;
      c.start_exchange(ring_peers(r, n), message(r, 5, N), recv)->wait();
      out[r].recv.push_back(recv);
      out[r].stats = c.stats();
    };
  };
  std::vector<Out> ref(n), got(n);
  InProcCluster cluster(n);
  cluster.run(body(ref));
  expect_no_errors(run_gloo(n, body(got), 20, {}, nullptr, kSealedJob));
  for (int r = 0; r < n; ++r) {
    EXPECT_TRUE(torch::equal(got[r].ints, ref[r].ints)) << "rank " << r;
    EXPECT_TRUE(torch::equal(got[r].floats, ref[r].floats)) << "rank " << r << ": the id-ordered sum must give the reference's bits";
    EXPECT_TRUE(torch::equal(got[r].halves, ref[r].halves)) << "rank " << r;
    EXPECT_TRUE(torch::equal(got[r].overlapped, ref[r].overlapped)) << "rank " << r;
    EXPECT_TRUE(torch::equal(got[r].cast, ref[r].cast)) << "rank " << r;
    ASSERT_EQ(got[r].recv.size(), ref[r].recv.size());
    for (size_t k = 0; k < ref[r].recv.size(); ++k) {
      ASSERT_EQ(got[r].recv[k].size(), ref[r].recv[k].size());
      for (size_t j = 0; j < ref[r].recv[k].size(); ++j) EXPECT_TRUE(torch::equal(got[r].recv[k][j], ref[r].recv[k][j]));
    }
    // What left: every payload with its 16-byte tag; an all-reduce sends a chunk of ceil(N / n)
    // elements to each of the n - 1 others twice, reduce-scatter and all-gather (4 all-reduces,
    // one broadcast, 4 exchanges' peers).
    const int64_t f = 4, tag = 16, chunk = (N + n - 1) / n, half_chunk = (999 + n - 1) / n;
    int64_t want = 2 * (n - 1) * (chunk * f + tag) * 3 + 2 * (n - 1) * (half_chunk * 2 + tag);  // the all-reduces
    want += (r == 2 ? n - 1 : 1) * (333 * f + tag);                           // the broadcast from rank 2
    want += static_cast<int64_t>(pair_peers(r, n).size() + 2 * ring_peers(r, n).size()) * (N * f + tag);
    EXPECT_EQ(got[r].stats.bytes_sent, want) << "rank " << r;
  }
}

// A stop check's or an evaluation's sealed all-reduce, and a sealed broadcast, while a sealed
// round is in flight: each in its own lane, so neither takes the other's messages (before the
// lanes, `gasloc launch --secret-file` with algo.overlap_steps failed at its first round with a
// size mismatch between the two).
TEST(GlooSealed, BlockingCollectivesBesideAnOverlappedOneKeepTheirBits) {
  for (int n : {2, 4}) check_overlapped_beside_blocking(n, kSealedJob);
}

TEST(GlooSealed, AnAlteredOrReplayedPayloadIsRefusedNamingTheChannelAndBlamingNoRank) {
  for (int mode : {1, 2}) {
    SCOPED_TRACE(mode == 1 ? "a flipped byte" : "a payload replayed from an earlier call");
    const TamperScope scope(mode, /*from=*/1, /*to=*/0, /*phase=*/1, /*nth=*/1);
    std::vector<int> failed;
    std::atomic<int> mixed{0};
    const auto t0 = Clock::now();
    auto errors = run_gloo(
        2,
        [&](int r, Communicator& c) {
          for (int call = 0; call < 2; ++call) {
            std::vector<torch::Tensor> recv;
            c.exchange({1 - r}, message(r, call, 4096), recv);
            // Nothing from an altered message may reach the caller.
            if (r == 0 && call == 1) mixed = 1;
          }
        },
        8.0, {}, &failed, kSealedJob);
    EXPECT_EQ(g_tamper.done.load(), 1);
    EXPECT_EQ(mixed.load(), 0) << "rank 0 used a message that did not open";
    EXPECT_NE(errors[0].find("channel 'pg 0-1 call 1'"), std::string::npos) << errors[0];
    EXPECT_NE(errors[0].find("does not open"), std::string::npos) << errors[0];
    EXPECT_EQ(failed[0], -1) << "a message that does not open is no evidence against rank 1: " << errors[0];
    EXPECT_LT(since(t0), 8.0) << "rank 0 must fail when the message is refused, not at a timeout";
  }
}

TEST(GlooSealed, AnAlteredHeaderEndsTheCallWithoutAHang) {
  // The header of rank 1's first call to rank 0 is altered: rank 0 cannot read the size it
  // announces, still moves its payload (so that rank 1 does not wait for it until a timeout),
  // and refuses the call. Rank 1 opened everything: its exchange ends normally.
  const TamperScope scope(1, /*from=*/1, /*to=*/0, /*phase=*/0, /*nth=*/0);
  std::vector<int> failed;
  std::atomic<bool> rank1_done{false};
  const auto t0 = Clock::now();
  auto errors = run_gloo(
      2,
      [&](int r, Communicator& c) {
        std::vector<torch::Tensor> recv;
        c.exchange({1 - r}, message(r, 0, 4096), recv);
        if (r == 1) {
          EXPECT_TRUE(torch::equal(recv[0], message(0, 0, 4096)));
          rank1_done = true;
        }
      },
      20.0, {}, &failed, kSealedJob);
  EXPECT_TRUE(rank1_done.load()) << errors[1];
  EXPECT_EQ(errors[1], "");
  EXPECT_NE(errors[0].find("channel 'pg 0-1 call 0': message 0 from the peer does not open"), std::string::npos)
      << errors[0];
  EXPECT_EQ(failed[0], -1);
  EXPECT_LT(since(t0), 10.0) << "no side may wait for a transfer the other never posts";
}

namespace {
// Two elastic ranks of the sealed job as threads, at gasloc store --elastic's host (by hand, on the
// real clock): `calls` exchanges each, then long enough for a report to reach the host and the
// host to act on it. What each received whole, each rank's error and the host's lines.
struct ElasticPairRun {
  StoreServer server{{"127.0.0.1", 0, false, kSealedJob}};
  c10::intrusive_ptr<c10d::Store> keys = job_keys(server.local());
  ElasticHost host{*keys, ElasticHost::Options{.world = 2, .heartbeat_timeout_s = 10, .by_hand = true}, nullptr};
  std::vector<std::vector<int>> received = std::vector<std::vector<int>>(2);
  std::vector<std::string> errors = std::vector<std::string>(2);
  std::vector<std::string> lines;

  void run(int calls) {
    std::atomic<bool> stop{false};
    std::thread tending([&] {
      const auto t0 = Clock::now();
      while (!stop.load()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        for (const auto& e : host.tend(since(t0))) lines.push_back(e.line);
      }
    });
    std::vector<std::thread> ranks;
    for (int r = 0; r < 2; ++r)
      ranks.emplace_back([&, r] {
        try {
          GlooOptions o{r, 2, "127.0.0.1", server.port(), 20};
          o.connect_only = true;
          o.job = kSealedJob;
          ElasticGlooComm c(o, /*incarnation=*/-1, /*join=*/false, /*heartbeat_timeout_s=*/10);
          for (int call = 0; call < calls; ++call) {
            c.roster().pin(call, 0);  // each round's view, as a run pins it (it tells the peer's incarnation)
            std::vector<torch::Tensor> recv;
            c.exchange({1 - r}, message(r, call, 4096), recv);
            received[r].push_back(recv[0].defined() && torch::equal(recv[0], message(1 - r, call, 4096)));
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(1500));
        } catch (const std::exception& e) {
          errors[r] = e.what();
        }
      });
    for (auto& t : ranks) t.join();
    stop = true;
    tending.join();
  }
  // Neither rank reported by the other nor declared dead by the host.
  void expect_nobody_blamed() {
    EXPECT_FALSE(keys->check({elastic_keys::suspect(1)})) << "rank 1 was reported";
    EXPECT_FALSE(keys->check({elastic_keys::suspect(0)})) << "rank 0 was reported";
    for (const auto& l : lines) {
      EXPECT_EQ(l.find("dead"), std::string::npos) << l;
      EXPECT_EQ(l.find("suspect"), std::string::npos) << l;
    }
  }
};
}  // namespace

TEST(GlooSealed, AnElasticEdgeThatDoesNotOpenIsDroppedAndItsPeerNeitherSuspectedNorDeclaredDead) {
  // Rank 1's payload to rank 0 is altered in their second call (the pair's first sealed message
  // each way is its group's hello): rank 0 drops that edge for the call, reports nobody, and the
  // pair goes on; the host judges nobody.
  ElasticPairRun job;
  const TamperScope scope(1, /*from=*/1, /*to=*/0, /*phase=*/1, /*nth=*/2);
  job.run(4);
  EXPECT_EQ(job.errors[0], "");
  EXPECT_EQ(job.errors[1], "");
  EXPECT_EQ(g_tamper.done.load(), 1);
  EXPECT_EQ(job.received[0], (std::vector<int>{1, 0, 1, 1})) << "rank 0 must drop exactly the call it could not open";
  EXPECT_EQ(job.received[1], (std::vector<int>{1, 1, 1, 1}));
  job.expect_nobody_blamed();
}

namespace {
// The hijacker: connects first to each Gloo address that a rank reads while forming the first try
// of a pair group, and holds the connection.
std::atomic<bool> g_hijack{false};
std::atomic<int> g_hijacked{0};
std::atomic<int> g_addresses_read{0};  // pair keys read that held one loopback sockaddr
std::mutex g_hijack_mu;
std::vector<int> g_hijack_fds;

// Whether something listens on 127.0.0.1:port (/proc/net/tcp: local address, state 0A = LISTEN).
bool listening_on(uint16_t port) {
  std::ifstream tcp("/proc/net/tcp");
  const std::string local = fmt::format("0100007F:{:04X}", port);
  for (std::string line; std::getline(tcp, line);)
    if (line.find(" " + local + " ") != std::string::npos && line.find(" 0A ") != std::string::npos) return true;
  return false;
}
}  // namespace

// The elastic communicator's hook (elastic_gloo.hpp), in this test program only.
extern "C" void gasloc_test_pair_key_read(const char* key, const uint8_t* value, size_t n) {
  if (!g_hijack.load() || std::string(key).find("/try") != std::string::npos || n < sizeof(sockaddr_storage)) return;
  sockaddr_in in{};
  std::memcpy(&in, value, sizeof in);
  if (in.sin_family != AF_INET || in.sin_addr.s_addr != htonl(INADDR_LOOPBACK)) return;
  ++g_addresses_read;
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&in), sizeof in) != 0) {
    ::close(fd);
    return;
  }
  // Gloo takes this connection and closes its listener; the honest peer connects after that.
  for (int k = 0; k < 500 && listening_on(ntohs(in.sin_port)); ++k) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::lock_guard lock(g_hijack_mu);
  g_hijack_fds.push_back(fd);
  ++g_hijacked;
}

TEST(GlooElastic, APairGroupHijackedWhileItFormsIsFormedAgainOnFreshPortsAndNobodyIsBlamed) {
  // Someone connects first to the pair's Gloo ports on its first try: one end's connect is
  // refused, the other "formed" its group with the intruder. Both ends try again on fresh ports,
  // every exchange arrives whole, and nobody is reported or declared dead.
  ElasticPairRun job;
  g_hijacked = 0;
  g_addresses_read = 0;
  g_hijack = true;
  job.run(3);
  g_hijack = false;
  {
    std::lock_guard lock(g_hijack_mu);
    for (int fd : g_hijack_fds) ::close(fd);
    g_hijack_fds.clear();
  }
  EXPECT_EQ(job.errors[0], "");
  EXPECT_EQ(job.errors[1], "");
  // The intruder reads a pair's address as Gloo of LibTorch 1.13 publishes it (one sockaddr per
  // pair key); torch 2.x's Gloo publishes its addresses in another layout, which it does not parse.
  if (g_addresses_read.load() == 0)
    GTEST_SKIP() << "this LibTorch's Gloo publishes no pair key holding one loopback sockaddr: the intruder cannot "
                    "find the port to connect first to (the retry is pinned on Debian's LibTorch 1.13)";
  EXPECT_GE(g_hijacked.load(), 1) << "the test's intruder connected to no pair port";
  ASSERT_TRUE(job.keys->check({"el/pg/0.0-1.0/try"})) << "the hijacked first try did not fail";
  EXPECT_EQ(to_text(job.keys->get("el/pg/0.0-1.0/try")), "1") << "the second try, on fresh ports, must form the group";
  EXPECT_EQ(job.received[0], (std::vector<int>{1, 1, 1})) << "an exchange was lost to the hijack";
  EXPECT_EQ(job.received[1], (std::vector<int>{1, 1, 1}));
  job.expect_nobody_blamed();
}

TEST(GlooThreads, BuffersOfDifferentSizesAreReportedWithBothRanks) {
  auto errors = run_gloo(2, [&](int r, Communicator& c) {
    std::vector<torch::Tensor> recv;
    c.exchange({1 - r}, torch::zeros({r == 0 ? 10 : 20}), recv);
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r].find("rank 0 sends 10 float32 elements but rank 1 sends 20 float32 elements"), std::string::npos)
        << errors[r];
    EXPECT_NE(errors[r].find("exchange with rank"), std::string::npos) << errors[r];
  }
  errors = run_gloo(3, [&](int r, Communicator& c) {
    auto t = torch::zeros({r == 2 ? 5 : 4});
    c.all_reduce_mean(t);
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(errors[r].find("all_reduce_mean on buffers that differ between ranks"), std::string::npos) << errors[r];
    EXPECT_NE(errors[r].find("rank 2 has 5 float32"), std::string::npos) << errors[r];
  }
  // A later call on the failed communicator says so instead of hanging.
  errors = run_gloo(2, [&](int r, Communicator& c) {
    std::vector<torch::Tensor> recv;
    try {
      c.exchange({1 - r}, torch::zeros({r + 1}), recv);
    } catch (const CommError&) {
    }
    c.barrier();
  });
  for (int r = 0; r < 2; ++r) EXPECT_NE(errors[r].find("already failed"), std::string::npos) << errors[r];
}

TEST(GlooThreads, SilentPeerTimesOutNamingIt) {
  // Rank 2 joins but never calls its exchange (it waits until the others gave up).
  std::atomic<int> done{0};
  std::vector<double> took(3);
  auto errors = run_gloo(
      3,
      [&](int r, Communicator& c) {
        if (r == 2) {
          while (done.load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(10));
          return;
        }
        const auto t0 = Clock::now();
        std::vector<torch::Tensor> recv;
        try {
          c.exchange(ring_peers(r, 3), message(r, 0, 1000), recv);
        } catch (...) {
          took[r] = since(t0);
          ++done;
          throw;
        }
        ++done;
      },
      2.0);
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r].find("exchange with rank 2 timed out after 2 s (rank 2 may have died"), std::string::npos)
        << errors[r];
    EXPECT_LT(took[r], 6.0);
    EXPECT_GT(took[r], 1.5);
  }
}

TEST(GlooThreads, RankThatSkipsAllReduceTimesOut) {
  std::atomic<bool> done{false};
  double took = 0;
  auto errors = run_gloo(
      2,
      [&](int r, Communicator& c) {
        if (r == 1) {
          while (!done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
          return;
        }
        const auto t0 = Clock::now();
        auto t = torch::ones({1000});
        try {
          c.all_reduce_mean(t);
        } catch (...) {
          took = since(t0);
          done = true;
          throw;
        }
        done = true;
      },
      1.5);
  EXPECT_NE(errors[0].find("rank 0: all_reduce_mean timed out after 1.5 s"), std::string::npos) << errors[0];
  EXPECT_LT(took, 5.0);
  EXPECT_EQ(errors[1], "");
}

TEST(GlooThreads, PeerThatDiesMidRunFailsTheOthersFast) {
  // Rank 2's communicator is destroyed before its exchange: its sockets close as a crashed
  // process's would, and its peers must fail with its rank, well within the timeout. Rank 0
  // waits on rank 2 first and fails on it; rank 1 waits on rank 0 first, and when rank 0 has
  // already closed its connections, rank 1's own failure is with rank 0: it must still name rank
  // 2, which failed first (rank 0's record in the store says so). Repeated, since the order in
  // which the two survivors notice varies from run to run.
  for (int rep = 0; rep < 5; ++rep) {
    std::vector<double> took(3);
    std::vector<int> failed;
    auto errors = run_gloo(
        3,
        [&](int r, Communicator& c) {
          if (r == 2) throw std::runtime_error("rank 2 died");  // leaves f: ~GlooCommunicator
          std::this_thread::sleep_for(std::chrono::milliseconds(300));
          const auto t0 = Clock::now();
          std::vector<torch::Tensor> recv;
          try {
            c.exchange(ring_peers(r, 3), message(r, 0, 100000), recv);
            c.all_reduce_mean(recv[0]);
          } catch (...) {
            took[r] = since(t0);
            throw;
          }
        },
        3.0, {}, &failed);
    for (int r = 0; r < 2; ++r) {
      EXPECT_NE(errors[r].find("rank " + std::to_string(r) + ": "), std::string::npos) << errors[r];
      EXPECT_EQ(failed[r], 2) << "rank " << r << " blames the wrong rank: " << errors[r];
      EXPECT_NE(errors[r].find("rank 2"), std::string::npos) << errors[r];
      EXPECT_LT(took[r], 5.0) << errors[r];
    }
  }
}

TEST(GlooThreads, SurvivorsNameTheRankThatFailedFirst) {
  // The cascade made certain: rank 0 fails on rank 2 and closes its connections while rank 1
  // still waits on rank 0 alone. Rank 1's own failure is with rank 0; it must blame rank 2.
  std::vector<int> failed;
  auto errors = run_gloo(
      3,
      [&](int r, Communicator& c) {
        if (r == 2) throw std::runtime_error("rank 2 died");
        std::vector<torch::Tensor> recv;
        c.exchange({r == 0 ? 2 : 0}, message(r, 0, 1000), recv);
      },
      3.0, {}, &failed);
  EXPECT_EQ(failed[0], 2) << errors[0];
  EXPECT_NE(errors[0].find("exchange with rank 2"), std::string::npos) << errors[0];
  EXPECT_EQ(failed[1], 2) << errors[1];
  EXPECT_NE(errors[1].find("the failure started at rank 2"), std::string::npos) << errors[1];
}

TEST(GlooThreads, MissingRankAndWorldMismatchAreNamed) {
  {
    StoreHost host("127.0.0.1", 0, 5);
    std::vector<std::string> errors(2);
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r)
      threads.emplace_back([&, r] {
        try {
          GlooOptions o{r, 3, "127.0.0.1", host.port(), 1.5};
          o.connect_only = true;
          GlooCommunicator c(o);
        } catch (const CommError& e) {
          errors[r] = e.what();
        }
      });
    for (auto& t : threads) t.join();
    for (int r = 0; r < 2; ++r)
      EXPECT_NE(errors[r].find("rank 2 of 3 never joined"), std::string::npos) << errors[r];
  }
  // A WORLD_SIZE mismatch stops both ranks at once (not after the 20 s timeout), with one message.
  const auto t0 = Clock::now();
  auto errors = run_gloo(2, [](int, Communicator&) {}, 20, [](GlooOptions& o) { o.world = o.rank == 1 ? 3 : 2; });
  EXPECT_NE(errors[0].find("WORLD_SIZE"), std::string::npos) << errors[0];
  EXPECT_EQ(errors[0], errors[1]);
  EXPECT_LT(since(t0), 5.0);
}

TEST(GlooThreads, RankMistakeStopsEveryRankAtOnce) {
  // One rank is started with RANK=3 in a world of 3: it joins the store, publishes the mistake,
  // and every rank stops at once with the same message instead of waiting out the timeout.
  const auto t0 = Clock::now();
  auto errors = run_gloo(3, [](int, Communicator&) {}, 20, [](GlooOptions& o) {
    if (o.rank == 2) o.rank = 3;
  });
  for (int r = 0; r < 3; ++r)
    EXPECT_NE(errors[r].find("a rank started with RANK=3 and WORLD_SIZE=3"), std::string::npos) << r << ": " << errors[r];
  EXPECT_LT(since(t0), 5.0);
}

TEST(GlooThreads, PortInUseIsReported) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof a;
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(fd, 4), 0);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const int port = ntohs(a.sin_port);
  std::string err;
  try {
    GlooCommunicator c(GlooOptions{0, 1, "127.0.0.1", port, 2.0});
  } catch (const CommError& e) {
    err = std::string(e.what()) + " | " + e.hint();
  }
  ::close(fd);
  EXPECT_NE(err.find(fmt::format(":{}: the port is already in use", port)), std::string::npos) << err;
  EXPECT_NE(err.find("--master-port"), std::string::npos) << err;
}

TEST(GlooThreads, BandwidthLimitSlowsTheLinkForBothEnds) {
  const int64_t N = 1 << 20;  // 4 MB
  std::vector<double> took(2);
  expect_no_errors(run_gloo(
      2,
      [&](int r, Communicator& c) {
        std::vector<torch::Tensor> recv;
        c.exchange({1 - r}, torch::ones({N}), recv);  // warm up (and spend the initial burst)
        c.barrier();
        const auto t0 = Clock::now();
        c.exchange({1 - r}, torch::ones({N}), recv);
        took[r] = since(t0);
      },
      20, [](GlooOptions& o) { o.bandwidth_limit_Bps = o.rank == 1 ? 20e6 : 0; }));
  // 4 MB at 20 MB/s: 0.2 s on the throttled rank, and its peer waits for it.
  for (int r = 0; r < 2; ++r) {
    EXPECT_GT(took[r], 0.15) << "rank " << r;
    EXPECT_LT(took[r], 2.0) << "rank " << r;
  }
}

// ---------------------------------------------------------------------------------------------
// Real processes.

namespace {

const std::string kGasloc = gasloc::test_paths::binary_dir().string() + "/gasloc";

struct Proc {
  pid_t pid = -1;
  std::string out_path;
};

// Starts argv with extra environment variables; stdout and stderr go to a file.
Proc spawn(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env, const std::string& out) {
  Proc p{-1, out};
  std::vector<std::string> envs;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    const std::string k = kv.substr(0, kv.find('='));
    if (!env.count(k) && k != "RANK" && k != "WORLD_SIZE" && k != "MASTER_ADDR" && k != "MASTER_PORT") envs.push_back(kv);
  }
  for (auto& [k, v] : env) envs.push_back(k + "=" + v);
  std::vector<char*> envp, args;
  for (auto& s : envs) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> a = argv;
  for (auto& s : a) args.push_back(s.data());
  args.push_back(nullptr);
  p.pid = ::fork();
  if (p.pid == 0) {
    const int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::execve(args[0], args.data(), envp.data());
    ::_exit(127);
  }
  return p;
}

// Waits for p at most timeout_s (then kills it); returns the raw wait status, or -1 on timeout.
int wait_for(const Proc& p, double timeout_s) {
  const auto t0 = Clock::now();
  for (;;) {
    int status = 0;
    if (::waitpid(p.pid, &status, WNOHANG) == p.pid) return status;
    if (since(t0) > timeout_s) {
      ::kill(p.pid, SIGKILL);
      ::waitpid(p.pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  return {std::istreambuf_iterator<char>(f), {}};
}

fs::path temp_dir(const std::string& name) {
  auto d = fs::temp_directory_path() / fmt::format("gasloc_gloo_{}_{}", name, ::getpid());
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

}  // namespace

TEST(GlooProcesses, LaunchedCommCheckMatchesExpectedValues) {
  ASSERT_TRUE(fs::exists(kGasloc)) << kGasloc;
  const auto dir = temp_dir("launch");
  const int n = 4;
  const int64_t N = 5000;
  const auto p = spawn({kGasloc, "launch", "-n", std::to_string(n), "--timeout", "20", "--", "gasloc", "comm-check",
                        "--numel", std::to_string(N), "--out", (dir / "out").string()},
                       {}, (dir / "log").string());
  const int status = wait_for(p, 50);
  const std::string log = slurp(dir / "log");
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << log;
  for (int r = 0; r < n; ++r)
    EXPECT_NE(log.find(fmt::format("[rank {}] comm-check rank {}/{}: all checks passed", r, r, n)), std::string::npos)
        << log;
  // The integer all-reduce's result is the exact mean: mean_r(i%100 + r) = i%100 + (n-1)/2.
  double expect = 0;
  for (int64_t i = 0; i < N; ++i) expect += static_cast<double>(i % 100) + (n - 1) / 2.0;
  for (int r = 0; r < n; ++r) {
    const auto j = nlohmann::json::parse(slurp(dir / "out" / fmt::format("rank{}.json", r)));
    EXPECT_TRUE(j["ok"].get<bool>()) << j.dump();
    EXPECT_EQ(j["checks"]["all_reduce_mean_integer"]["checksum"].get<double>(), expect);
    EXPECT_EQ(j["checks"]["all_reduce_mean_integer"]["max_diff"].get<double>(), 0.0);
    EXPECT_LE(j["checks"]["all_reduce_mean_random"]["max_diff"].get<double>(), 1e-6);
    EXPECT_EQ(j["checks"]["exchange_ring_round1"]["max_diff"].get<double>(), 0.0);
    EXPECT_GT(j["stats"]["bytes_sent"].get<int64_t>(), 0);
  }
  fs::remove_all(dir);
}

TEST(GlooProcesses, LaunchReportsTheRankThatDied) {
  const auto dir = temp_dir("die");
  const auto t0 = Clock::now();
  const auto p = spawn({kGasloc, "launch", "-n", "3", "--timeout", "3", "--grace", "2", "--", "gasloc", "comm-check",
                        "--numel", "1000", "--die-rank", "2"},
                       {}, (dir / "log").string());
  const int status = wait_for(p, 40);
  const std::string log = slurp(dir / "log");
  ASSERT_NE(status, -1) << "launch did not finish\n" << log;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << log;
  // Rank 2 fails first; its peers fail a few milliseconds later (or are stopped). Should both
  // exits be collected at once, the launcher still reports rank 2 with its status and output.
  EXPECT_TRUE(log.find("launch: rank 2 of 3 failed with exit status 3") != std::string::npos ||
              log.find("launch: rank 2 ended with exit status 3") != std::string::npos)
      << log;
  EXPECT_NE(log.find("  | comm-check rank 2: exiting abruptly before the exchange"), std::string::npos) << log;
  EXPECT_LT(since(t0), 25.0);
  fs::remove_all(dir);
}

TEST(GlooProcesses, PeersOfAKilledRankFailWithinTheTimeout) {
  // Three comm-check processes started directly (no launcher to stop them): rank 2 exits
  // abruptly before its exchange; ranks 0 and 1 must exit on their own with an error naming it.
  // The store speaks c10d's protocol, as torchrun's agent does (TORCHELASTIC_USE_AGENT_STORE
  // without a job token): that path keeps working beside gasloc's own store.
  const auto dir = temp_dir("peers");
  StoreHost host("127.0.0.1", 0, 30, {}, /*c10d_protocol=*/true);  // a free port, held by this test: no race
  std::vector<Proc> ps;
  const auto t0 = Clock::now();
  for (int r = 0; r < 3; ++r)
    ps.push_back(spawn({kGasloc, "comm-check", "--numel", "1000", "--timeout", "3", "--die-rank", "2"},
                       {{"RANK", std::to_string(r)},
                        {"WORLD_SIZE", "3"},
                        {"MASTER_ADDR", "127.0.0.1"},
                        {"MASTER_PORT", std::to_string(host.port())},
                        {"TORCHELASTIC_USE_AGENT_STORE", "True"}},
                       (dir / fmt::format("rank{}.log", r)).string()));
  std::vector<int> status(3);
  for (int r = 0; r < 3; ++r) status[r] = wait_for(ps[r], 40);
  const double took = since(t0);
  EXPECT_TRUE(WIFEXITED(status[2]) && WEXITSTATUS(status[2]) == 3);
  for (int r = 0; r < 2; ++r) {
    const std::string log = slurp(dir / fmt::format("rank{}.log", r));
    ASSERT_NE(status[r], -1) << "rank " << r << " hung\n" << log;
    EXPECT_TRUE(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 3) << log;  // main(): a CommError (a peer failed)
    // Its own failure is with rank 2, or with a survivor that failed on rank 2 first and closed
    // its connections: then the survivor's record names rank 2.
    EXPECT_NE(log.find(fmt::format("error: rank {}: exchange with rank ", r)), std::string::npos) << log;
    EXPECT_TRUE(log.find("exchange with rank 2 failed") != std::string::npos ||
                log.find("the failure started at rank 2") != std::string::npos)
        << log;
    EXPECT_NE(log.find("look at rank 2's output first"), std::string::npos) << log;
  }
  EXPECT_LT(took, 20.0);
  fs::remove_all(dir);
}

TEST(GlooProcesses, LaunchTimeoutGovernsAStuckRank) {
  // Rank 1 stops itself (SIGSTOP): alive, connections open, silent. launch --timeout 3 must reach
  // the ranks (before, the library's own default held rank 0 for minutes), the survivors must
  // fail within it naming rank 1, and the launcher must say so although a survivor exited first.
  const auto dir = temp_dir("stall");
  const auto t0 = Clock::now();
  const auto p = spawn({kGasloc, "launch", "-n", "3", "--timeout", "3", "--grace", "1", "--", "gasloc", "comm-check",
                        "--numel", "1000", "--stall-rank", "1"},
                       {}, (dir / "log").string());
  const int status = wait_for(p, 40);
  const std::string log = slurp(dir / "log");
  ASSERT_NE(status, -1) << "launch did not finish\n" << log;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << log;
  EXPECT_NE(log.find("timed out after 3 s"), std::string::npos) << log;
  EXPECT_NE(log.find("reports that rank 1 failed first"), std::string::npos) << log;
  EXPECT_LT(since(t0), 20.0);
  fs::remove_all(dir);
}

TEST(GlooProcesses, CommCheckOutsideALaunchSaysHowToLaunch) {
  const auto dir = temp_dir("noenv");
  const auto p = spawn({kGasloc, "comm-check"}, {}, (dir / "log").string());
  const int status = wait_for(p, 30);
  const std::string log = slurp(dir / "log");
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << log;
  EXPECT_NE(log.find("RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT are not set"), std::string::npos) << log;
  EXPECT_NE(log.find("gasloc launch -n N"), std::string::npos) << log;
  fs::remove_all(dir);
}
