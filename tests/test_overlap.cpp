// Overlapped rounds (algo.overlap_steps, algo.overlap; docs/design.md section 11) and what came
// with them: the asynchronous communicator forms and their virtual clock, the priced evaluation
// and train.eval_model = local, per-worker compute utilization. Each variant is pinned to a
// hand-written reference of its update; the clock to the round price H s + max(0, C - tau s).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <map>

#include "gasloc/algo/algo_config.hpp"
#include "gasloc/algo/algorithms.hpp"
#include "gasloc/algo/local_steps.hpp"
#include "gasloc/comm/inproc.hpp"
#include "gasloc/core/config.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/data/dataset.hpp"
#include "gasloc/train/checkpoint.hpp"
#include "gasloc/train/meeting.hpp"
#include "gasloc/train/metrics.hpp"
#include "gasloc/train/trainer.hpp"
#include "gasloc/train/worker.hpp"
#include "test_util.hpp"

using namespace gasloc;

namespace {

class Overlap : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = test_util::temp_root("test_overlap");
    data_ = test_util::make_byte_dataset(root_);
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(root_); }

  struct ClusterRun {
    std::vector<torch::Tensor> params;
    std::vector<double> clock, idle, compute;
  };
  // n workers of the nano job with the synchronizer of `a` for `steps` steps, on `net`.
  static ClusterRun run(int n, const algo::AlgoConfig& a, int64_t steps, std::vector<std::string> extra = {}) {
    extra.push_back("train.steps=" + std::to_string(steps));
    const auto job = test_util::nano_job(data_, extra);
    const auto ds = data::Dataset::open(job.data.dir);
    const auto mc = job.model.resolve(ds.vocab_size);
    const auto net = job.network.model(n);
    comm::InProcCluster cluster(n, net);
    std::vector<std::unique_ptr<train::Worker>> workers;
    for (int r = 0; r < n; ++r)
      workers.push_back(std::make_unique<train::Worker>(job, mc, ds, cluster.comm(r),
                                                        algo::make_synchronizer(a, n, job.train.seed, &net)));
    cluster.run([&](int r, comm::Communicator&) {
      for (int64_t s = 0; s < steps; ++s) workers[r]->step();
    });
    ClusterRun out;
    for (int r = 0; r < n; ++r) {
      out.params.push_back(workers[r]->params().data().clone());
      out.clock.push_back(cluster.clock(r));
      out.idle.push_back(cluster.stats(r).idle_s);
      out.compute.push_back(cluster.stats(r).compute_s);
    }
    return out;
  }

  static inline std::filesystem::path root_, data_;
};

algo::AlgoConfig cfg(const std::string& name, const std::string& form, const std::string& topo, int64_t H, int64_t tau,
                     const std::string& variant, double eta = 0.7, double mu = 0.9, double alpha = 1.0) {
  algo::AlgoConfig a;
  a.name = name;
  a.form = form;
  a.topology = topo;
  a.H = H;
  a.overlap_steps = tau;
  a.overlap = variant;
  a.outer_lr = eta;
  a.outer_momentum = mu;
  a.gossip_step = alpha;
  return a;
}

// Every outer method's configurations, with the world each runs on (2peer on 3 workers, 1peer on 2).
struct Method {
  std::string name, form, topo;
  int n;
  double mu, alpha;
};
const std::vector<Method>& methods() {
  static const std::vector<Method> m = {
      {"diloco", "anchor", "2peer", 3, 0.9, 1.0},          {"gasloc", "anchor", "1peer", 2, 0.9, 1.0},
      {"gasloc", "anchor", "2peer", 3, 0.9, 1.0},          {"gasloc", "mix_after", "1peer", 2, 0.9, 1.0},
      {"gasloc", "mix_after", "2peer", 3, 0.9, 1.0},       {"gasloc", "accelerated", "1peer", 2, 0.6, 0.8},
      {"gasloc", "accelerated", "2peer", 3, 0.6, 0.8},     {"local_dadam", "anchor", "1peer", 2, 0.9, 1.0},
      {"local_dadam", "anchor", "2peer", 3, 0.9, 1.0}};
  return m;
}
algo::AlgoConfig of(const Method& m, int64_t H, int64_t tau, const std::string& variant) {
  return cfg(m.name, m.name == "gasloc" ? m.form : "anchor", m.topo, H, tau, variant, 0.7, m.name == "local_dadam" ? 0.9 : m.mu,
             m.alpha);
}
std::string label(const Method& m) { return m.name + " " + m.form + " " + m.topo; }

}  // namespace

// tau = 0 is the blocking round: both variants give the bits and the clocks of a run that never
// heard of overlap, for every outer method.
TEST_F(Overlap, ZeroStepsIsTheBlockingRoundBitForBit) {
  for (const Method& m : methods()) {
    SCOPED_TRACE(label(m));
    const auto today = run(m.n, of(m, 4, 0, "eager"), 10);
    const auto delayed = run(m.n, of(m, 4, 0, "delayed"), 10);
    for (int r = 0; r < m.n; ++r) {
      EXPECT_TRUE(torch::equal(today.params[r], delayed.params[r])) << "rank " << r;
      EXPECT_EQ(today.clock[r], delayed.clock[r]);
    }
    // ... and overlap does change them: the comparison can fail.
    const auto overlapped = run(m.n, of(m, 4, 2, "delayed"), 10);
    EXPECT_FALSE(torch::equal(today.params[0], overlapped.params[0]));
  }
}

namespace {
// Section 11's update, written out in doubles on three-entry buffers: workers start at
// theta0(r); each step adds step_delta(r, k) to phi as a local step would; rounds of H steps
// with tau overlapped steps; the mix is the mean over the workers (1peer on 2 workers and 2peer
// on 3 are both the complete average). Returns phi per rank after every step (the run ends with
// the flight landed).
using Vec = std::vector<double>;
Vec theta0(int r) { return {1.0 + r, -0.5 * r, 0.25}; }
double step_delta(int r, int64_t k, int i) { return 0.01 * (r + 1) * (i + 1) - 0.013 * static_cast<double>(k % 5) * (i - 1) + 0.002 * r * k; }

struct Reference {
  std::string kind;  // "anchor" (DiLoCo too), "mix_after", "accelerated", "local_dadam"
  double eta, mu, alpha;
  bool eager;

  std::vector<std::vector<Vec>> run(int n, int64_t H, int64_t tau, int64_t steps) const {
    std::vector<Vec> theta(n), b(n, Vec(3, 0.0)), phi(n), u_prev(n), sent(n, Vec(3)), base(n, Vec(3)), b_next(n, Vec(3, 0.0));
    for (int r = 0; r < n; ++r) theta[r] = phi[r] = u_prev[r] = theta0(r);
    bool flying = false;
    std::vector<std::vector<Vec>> out(n);
    auto merge = [&] {
      for (int i = 0; i < 3; ++i) {
        double m = 0;
        for (int r = 0; r < n; ++r) m += sent[r][i] / n;
        for (int r = 0; r < n; ++r) {
          double next;
          if (kind == "anchor") {
            const double d = theta[r][i] - m;
            b[r][i] = mu * b[r][i] + d;
            next = theta[r][i] - eta * (d + mu * b[r][i]);
          } else if (kind == "mix_after") {
            b[r][i] = b_next[r][i];
            next = m;
          } else if (kind == "accelerated") {
            const double u = sent[r][i];
            next = u - alpha * (u - m) + mu * (u - u_prev[r][i]);
            u_prev[r][i] = u;
          } else {
            next = m;
          }
          theta[r][i] = next;
          phi[r][i] = next + (phi[r][i] - base[r][i]);
        }
      }
      flying = false;
    };
    auto send = [&] {
      for (int r = 0; r < n; ++r)
        for (int i = 0; i < 3; ++i) {
          const double p = phi[r][i], th = theta[r][i];
          double x = p, e = p;
          if (kind == "anchor") {
            e = th - eta * (mu * mu * b[r][i] + (1 + mu) * (th - p));
          } else if (kind == "mix_after") {
            b_next[r][i] = mu * b[r][i] + (th - p);
            x = e = th - eta * ((th - p) + mu * b_next[r][i]);
          } else if (kind == "accelerated") {
            x = th + eta * (p - th);
            e = x + mu * (x - u_prev[r][i]);
          }
          sent[r][i] = x;
          base[r][i] = eager ? e : p;
          if (eager) phi[r][i] = e;
        }
      flying = true;
    };
    for (int64_t k = 1; k <= steps; ++k) {
      for (int r = 0; r < n; ++r)
        for (int i = 0; i < 3; ++i) phi[r][i] += step_delta(r, k, i);
      const int64_t in_round = (k - 1) % H + 1;
      if (flying && in_round == tau) merge();
      if (in_round == H) send();
      if (k == steps && flying) merge();
      for (int r = 0; r < n; ++r) out[r].push_back(phi[r]);
    }
    return out;
  }
};

// The synchronizer of `a` driven the same way (no optimizer: the buffer is the model).
std::vector<std::vector<Vec>> drive(const algo::AlgoConfig& a, int n, int64_t steps) {
  std::vector<std::vector<Vec>> out(n);
  comm::InProcCluster cluster(n);
  cluster.run([&](int r, comm::Communicator& c) {
    const auto t0 = theta0(r);
    FlatParams fp({{"w", torch::tensor(std::vector<float>(t0.begin(), t0.end()))}});
    auto sync = algo::make_synchronizer(a, n, 5);
    sync->init(fp);
    for (int64_t k = 1; k <= steps; ++k) {
      {
        torch::NoGradGuard no_grad;
        for (int i = 0; i < 3; ++i) fp.data()[i] += step_delta(r, k, i);
      }
      sync->after_step(k, fp, c);
      if (k == steps) sync->flush(fp, c);
      Vec v;
      for (int i = 0; i < 3; ++i) v.push_back(fp.data()[i].item<double>());
      out[r].push_back(v);
    }
  });
  return out;
}
}  // namespace

// With tau > 0 each variant is section 11's update, step by step over 3 rounds, for every outer
// method; float32 against doubles: 1e-5.
TEST_F(Overlap, EachVariantIsTheWrittenOutUpdateOverThreeRounds) {
  const int64_t H = 4, tau = 2, steps = 3 * H + tau;  // the third round's merge lands inside the run
  for (const Method& m : methods())
    for (const bool eager : {true, false}) {
      SCOPED_TRACE(label(m) + (eager ? " eager" : " delayed"));
      const auto a = of(m, H, tau, eager ? "eager" : "delayed");
      const std::string kind = m.name == "local_dadam" ? "local_dadam" : m.name == "diloco" ? "anchor" : m.form;
      const Reference ref{kind, a.outer_lr, a.outer_momentum, a.gossip_step, eager};
      const auto want = ref.run(m.n, H, tau, steps);
      const auto got = drive(a, m.n, steps);
      for (int r = 0; r < m.n; ++r)
        for (int64_t k = 0; k < steps; ++k)
          for (int i = 0; i < 3; ++i)
            ASSERT_NEAR(got[r][k][i], want[r][k][i], 1e-5) << "rank " << r << " step " << k + 1 << " entry " << i;
    }
  // The variants differ between a send and its merge (at step H: E_i against phi_sent), so the test
  // tells them apart. Here, where a step does not depend on the point it is taken at, they agree
  // again after each merge; in training they differ through the tau steps' gradients.
  const Reference eager{"anchor", 0.7, 0.9, 1.0, true}, delayed{"anchor", 0.7, 0.9, 1.0, false};
  EXPECT_GT(std::abs(eager.run(2, H, tau, steps)[0][H - 1][0] - delayed.run(2, H, tau, steps)[0][H - 1][0]), 1e-3);
}

// A run that ends while an exchange travels lands it: the final model holds the last round.
TEST_F(Overlap, TheLastRoundLandsWhenTheRunEndsInFlight) {
  const auto a = cfg("gasloc", "anchor", "1peer", 4, 2, "eager");
  const Reference ref{"anchor", 0.7, 0.9, 1.0, true};
  const auto want = ref.run(2, 4, 2, 8);  // ends at a send
  const auto got = drive(a, 2, 8);
  for (int r = 0; r < 2; ++r)
    for (int i = 0; i < 3; ++i) EXPECT_NEAR(got[r].back()[i], want[r].back()[i], 1e-5);
}

// The clock of an overlapped transfer: started at the rank's clock, it ends C later on the link;
// compute that covers it leaves no idle time, and a shorter compute waits exactly the excess.
TEST(OverlapClock, AHiddenTransferCostsNothingALongerOneItsExcess) {
  comm::NetworkModel net;
  net.step_time_s = 0.1;
  net.latency_s = 0.0;
  net.bandwidth_Bps = 4000.0;  // 1000 floats = 4000 bytes: C = 1 s for a pair exchange
  for (const int tau : {12, 7}) {
    SCOPED_TRACE("tau " + std::to_string(tau));
    comm::InProcCluster cluster(2, net);
    cluster.run([&](int r, comm::Communicator& c) {
      const auto send = torch::full({1000}, static_cast<float>(r));
      std::vector<torch::Tensor> recv;
      auto pending = c.start_exchange({1 - r}, send, recv);
      c.compute(tau);
      pending->wait();
      EXPECT_EQ(recv.at(0)[0].item<float>(), static_cast<float>(1 - r));
    });
    const double C = 1.0, hidden = 0.1 * tau;
    for (int r = 0; r < 2; ++r) {
      EXPECT_NEAR(cluster.clock(r), std::max(C, hidden), 1e-12);
      EXPECT_NEAR(cluster.stats(r).idle_s, std::max(0.0, C - hidden), 1e-12);
      EXPECT_NEAR(cluster.stats(r).compute_s, hidden, 1e-12);
      EXPECT_EQ(cluster.stats(r).bytes_sent, 4000);
    }
  }
  // The blocking exchange pays all of C on the clock: the same call, not overlapped.
  comm::InProcCluster blocking(2, net);
  blocking.run([&](int r, comm::Communicator& c) {
    std::vector<torch::Tensor> recv;
    c.exchange({1 - r}, torch::zeros({1000}), recv);
    c.compute(7);
  });
  EXPECT_NEAR(blocking.clock(0), 1.7, 1e-12);
}

// Pending::completed() on the virtual clock: not before the link's end (C = 1 s), then yes; an
// abort before that makes wait() throw and charges nothing, an abort after it changes nothing.
TEST(OverlapClock, CompletedFollowsTheLinksEndAndAbortDropsOnlyAnUnfinishedOne) {
  comm::NetworkModel net;
  net.step_time_s = 0.1;
  net.latency_s = 0.0;
  net.bandwidth_Bps = 4000.0;  // 1000 floats: C = 1 s
  comm::InProcCluster cluster(2, net);
  cluster.run([&](int r, comm::Communicator& c) {
    std::vector<torch::Tensor> recv;
    auto pending = c.start_exchange({1 - r}, torch::full({1000}, static_cast<float>(r)), recv);
    c.compute(9);  // 0.9 s
    EXPECT_FALSE(pending->completed());
    if (r == 0) {
      pending->abort();
      EXPECT_THROW(pending->wait(), CommError);
      return;
    }
    c.compute(1);  // 1.0 s: landed
    EXPECT_TRUE(pending->completed());
    pending->abort();  // too late: nothing to stop
    pending->wait();
    EXPECT_EQ(recv.at(0)[0].item<float>(), 0.0f);
  });
  EXPECT_NEAR(cluster.stats(0).idle_s, 0.0, 1e-12);
  EXPECT_NEAR(cluster.clock(1), 1.0, 1e-12);
}

TEST(OverlapClock, AnAllReduceOverlapsTheSameWay) {
  comm::NetworkModel net;
  net.step_time_s = 0.1;
  net.latency_s = 0.0;
  net.bandwidth_Bps = 4000.0;
  comm::InProcCluster cluster(2, net);
  cluster.run([&](int r, comm::Communicator& c) {
    auto t = torch::full({1000}, static_cast<float>(2 * r));
    auto pending = c.start_all_reduce_mean(t);
    c.compute(3);
    pending->wait();
    EXPECT_EQ(t[0].item<float>(), 1.0f);
  });
  // A ring all-reduce of P over 2: 2 (n-1)/n P / B = 1 s; 0.3 s of it hidden.
  EXPECT_NEAR(cluster.clock(0), 1.0, 1e-12);
  EXPECT_NEAR(cluster.stats(0).idle_s, 0.7, 1e-12);
}

// One operation in flight per worker: another collective of the algorithm's before wait() is a
// named error, not a silent reorder.
TEST(OverlapClock, ACollectiveWhileOneIsInFlightIsRefused) {
  comm::InProcCluster cluster(2);
  try {
    cluster.run([&](int r, comm::Communicator& c) {
      std::vector<torch::Tensor> recv;
      auto pending = c.start_exchange({1 - r}, torch::zeros({4}), recv);
      c.barrier();
    });
    ADD_FAILURE() << "expected a CommError";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("in flight"), std::string::npos) << e.what();
  }
}

// The base class's form (what the process backends use): performed at the start, complete, and
// a failure surfaces at wait(), not at the start.
TEST(OverlapClock, TheDefaultFormIsCompleteAtStartAndFailsAtWait) {
  comm::SingleRank one;
  std::vector<torch::Tensor> recv = {torch::ones({1})};
  auto ok = one.start_exchange({}, torch::zeros({4}), recv);
  EXPECT_TRUE(recv.empty());  // already done before wait()
  ok->wait();
  auto bad = one.start_exchange({3}, torch::zeros({4}), recv);
  EXPECT_THROW(bad->wait(), CommError);
}

// Through the workers: a DiLoCo round whose all-reduce fits in tau steps costs H s, no idle
// time; with tau = 0 every round pays its C. Utilization is 1 then.
TEST_F(Overlap, TheClockPricesARoundAsComputePlusTheExcess) {
  // An all-reduce of 20000 priced bytes over 2 workers at 40000 B/s: C = 2 (n-1)/n P / B = 0.5 s a round.
  const std::vector<std::string> net = {"network.step_time_s=0.1", "network.latency_s=0",
                                        "network.simulated_model_bytes=20000", "network.bandwidth_gbit=0.00032"};
  // tau = 3 hides 0.3 s of it, tau = 5 all of it.
  const int64_t H = 6, rounds = 3, steps = rounds * H;
  for (const auto& [tau, idle_per_round] : std::vector<std::pair<int64_t, double>>{{0, 0.0}, {3, 0.2}, {5, 0.0}}) {
    SCOPED_TRACE("tau " + std::to_string(tau));
    const auto got = run(2, cfg("diloco", "anchor", "2peer", H, tau, "eager"), steps, net);
    const double comm = tau == 0 ? rounds * 0.5 : (rounds - 1) * idle_per_round;
    // The last round lands at the run's end: what is not hidden of it is waited for in full.
    const double last = tau == 0 ? 0.0 : 0.5;
    for (int r = 0; r < 2; ++r) {
      EXPECT_NEAR(got.compute[r], steps * 0.1, 1e-9);
      EXPECT_NEAR(got.clock[r], steps * 0.1 + comm + last, 1e-9);
      if (tau > 0) EXPECT_NEAR(got.idle[r], comm + last, 1e-9);
    }
  }
}

namespace {
train::TrainRequest request(const std::filesystem::path& root, const std::string& dir, std::vector<std::string> extra) {
  train::TrainRequest r;
  r.quiet = true;
  r.overrides = {"model.preset=nano", "data.dir=" + (root / "data").string(), "data.seq_len=32", "data.batch_size=4",
                 "data.val_batches=2", "train.steps=40", "train.eval_every=10", "train.checkpoint_every=0",
                 "train.log_every=5", "optim.lr=0.003", "optim.warmup_steps=5", "train.threads=1", "cluster.workers=2",
                 "algo.H=5", "algo.overlap_steps=3", "train.run_dir=" + (root / dir).string()};
  r.overrides.insert(r.overrides.end(), extra.begin(), extra.end());
  return r;
}
}  // namespace

// A checkpoint taken while an exchange travels (step 16: sent at 15, merged at 18) holds the
// finished mix; the resumed run lands it at its usual step and goes on bit for bit, so the
// trajectory does not depend on where checkpoints fall.
TEST_F(Overlap, ACheckpointInFlightResumesBitExactly) {
  struct Case {
    std::string name;
    std::vector<std::string> settings;
  };
  for (const Case& c : {Case{"gasloc_eager", {"algo.name=gasloc", "algo.topology=1peer", "algo.form=mix_after"}},
                        Case{"diloco_delayed", {"algo.name=diloco", "algo.overlap=delayed", "optim.name=gpa"}},
                        // Compressed rounds, relayed: the codec's state and the finished mix both carry.
                        Case{"gasloc_modulo", {"algo.name=gasloc", "algo.topology=1peer", "algo.compression=int8",
                                               "algo.gossip_codec=modulo"}},
                        Case{"diloco_int4", {"algo.name=diloco", "algo.compression=int4"}}}) {
    SCOPED_TRACE(c.name);
    const auto full = train::run_training(request(root_, c.name + "_full", c.settings));
    auto halves = c.settings;
    halves.push_back("train.stop_at=16");
    const auto first = train::run_training(request(root_, c.name + "_halves", halves));
    train::TrainRequest again;
    again.quiet = true;
    again.resume_dir = (root_ / (c.name + "_halves")).string();
    // The checkpoint did catch an exchange in flight.
    const train::RunCheckpoints ck(root_ / (c.name + "_halves"), 2);
    EXPECT_EQ(train::load_checkpoint(ck.file(16, 0)).tensors.count("sync.overlap_mixed"), 1u);
    const auto second = train::run_training(again);
    ASSERT_EQ(full.train_losses.size(), 40u);
    ASSERT_EQ(second.train_losses.size(), 24u);
    for (size_t i = 0; i < 16; ++i) EXPECT_EQ(first.train_losses[i], full.train_losses[i]) << "step " << i + 1;
    for (size_t i = 0; i < 24; ++i) EXPECT_EQ(second.train_losses[i], full.train_losses[16 + i]) << "step " << 17 + i;
    EXPECT_EQ(second.final_val_loss, full.final_val_loss);
  }
}

// Settings that cannot work are refused naming the key and the fix.
TEST_F(Overlap, BadSettingsAreNamed) {
  auto expect = [](algo::AlgoConfig a, int world, const std::vector<std::string>& needles) {
    try {
      a.validate(world);
      ADD_FAILURE() << "expected a ConfigError for " << a.name.str() << " overlap_steps " << a.overlap_steps;
    } catch (const ConfigError& e) {
      for (const auto& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
    }
  };
  expect(cfg("diloco", "anchor", "2peer", 5, 5, "eager"), 2, {"algo.overlap_steps", "algo.H = 5", "raise algo.H"});
  expect(cfg("dadam", "anchor", "2peer", 5, 2, "eager"), 3, {"algo.overlap_steps", "dadam", "diloco, gasloc, local_dadam"});
  expect(cfg("allreduce", "anchor", "2peer", 5, 1, "eager"), 2, {"algo.overlap_steps", "allreduce"});
  expect(cfg("gasloc", "anchor", "2peer", 5, -1, "eager"), 3, {"algo.overlap_steps", ">= 0"});
  EXPECT_NO_THROW(cfg("gasloc", "anchor", "2peer", 5, 4, "delayed").validate(3));
  try {
    algo::AlgoConfig a;
    config::apply_override(a, "algo", "overlap", "lazy");
    ADD_FAILURE() << "expected a ConfigError for algo.overlap = lazy";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("eager"), std::string::npos) << e.what();
  }
  try {
    train::run_training(request(root_, "elastic_overlap", {"algo.name=gasloc", "cluster.elastic=true"}));
    ADD_FAILURE() << "expected a ConfigError for overlap in an elastic run";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("algo.overlap_steps"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("cluster.elastic"), std::string::npos) << e.what();
  }
}

// time_budget with overlap: a round costs H_i s_i + max(0, C_i - tau s_i), so a slow link loses
// fewer steps; a budget below tau + 1 steps is an error naming the keys.
TEST(OverlapBudget, TheHiddenPartOfTheExchangeIsNotTakenFromTheSteps) {
  comm::NetworkModel net;
  net.step_time_s = 0.1;
  net.latency_s = 0.0;
  net.bandwidth_Bps = 1000.0;
  net.bandwidth_scale = {1.0, 1.0, 1.0, 0.25};  // worker 3's link at a quarter
  const topology::Topology ring(topology::Kind::ring, 4, 1);
  // The fixed ring 0-1-2-3: C_ref = 100 B / (1000 / 2) = 0.2 s; worker 3 and its neighbours 0 and 2
  // wait for its quarter link shared by two: C = 100 / (250 / 2) = 0.8 s; worker 1 is unimpeded.
  const algo::LocalSteps blocking(10, net, ring, 4, 0), overlapped(10, net, ring, 4, 3);
  // Blocking: R = 1.0 + 0.2, H_3 = floor((1.2 - 0.8) / 0.1) = 4. Overlapped: R = 1.0 + max(0, 0.2 - 0.3),
  // H_3 = floor((1.0 - (0.8 - 0.3)) / 0.1) = 5.
  EXPECT_EQ(blocking.steps(1, 0, 100), 10);
  EXPECT_EQ(blocking.steps(3, 0, 100), 4);
  EXPECT_EQ(overlapped.steps(1, 0, 100), 10);
  EXPECT_EQ(overlapped.steps(3, 0, 100), 5);
  EXPECT_EQ(algo::LocalSteps(10, net, ring, 4, 5).steps(3, 0, 100), 7);   // (1.0 - 0.3) / 0.1, >= tau + 1
  EXPECT_EQ(algo::LocalSteps(10, net, ring, 4, 8).steps(3, 0, 100), 10);  // all of C hidden
  net.bandwidth_scale = {1.0, 1.0, 1.0, 0.02};  // C_3 = 10 s: 1 - 9.5 s leaves no step
  try {
    algo::LocalSteps(10, net, ring, 4, 5).steps(3, 0, 100);
    ADD_FAILURE() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("algo.overlap_steps"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.hint()).find("algo.h_policy"), std::string::npos) << e.hint();
  }
}

// train.eval_model: "local" evaluates each worker's own model and reports their mean, sending no
// model; "average" prices its all-reduce in eval_time_s beside the clock. Training is the same.
TEST_F(Overlap, LocalEvaluationIsTheMeanOfTheOwnModelsAndCostsNothing) {
  // Evaluations mid-round (7, 14, ...), where the workers' models differ, and at the end (40).
  const std::vector<std::string> base = {"algo.name=gasloc", "algo.topology=1peer", "algo.overlap_steps=0",
                                         "network.simulated_model_bytes=1000000", "train.eval_every=7"};
  auto with = [&](std::string mode) {
    auto s = base;
    s.push_back("train.eval_model=" + mode);
    return s;
  };
  const auto avg = train::run_training(request(root_, "eval_average", with("average")));
  const auto local = train::run_training(request(root_, "eval_local", with("local")));
  EXPECT_EQ(avg.train_losses, local.train_losses);
  auto evals = [&](const std::string& dir) {
    std::vector<train::EvalEvent> out;
    for (const auto& e : train::read_metrics(root_ / dir))
      if (const auto* x = std::get_if<train::EvalEvent>(&e)) out.push_back(*x);
    return out;
  };
  const auto a = evals("eval_average"), l = evals("eval_local");
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(l.size(), a.size());
  const auto job = test_util::nano_job(data_, {"network.simulated_model_bytes=1000000"});
  const double price = train::eval_seconds(job.network.model(2), 1, 2);
  EXPECT_GT(price, 0.0);
  for (size_t k = 0; k < a.size(); ++k) {
    SCOPED_TRACE("eval " + std::to_string(k));
    ASSERT_EQ(l[k].worker_val_loss.size(), 2u);
    EXPECT_EQ(l[k].worker_val_loss, a[k].worker_val_loss);  // each worker's own model, the same bits
    EXPECT_DOUBLE_EQ(l[k].val_loss, (a[k].worker_val_loss[0] + a[k].worker_val_loss[1]) / 2);
    if (k == 0) EXPECT_NE(l[k].val_loss, a[k].val_loss);  // not the average model's
    EXPECT_TRUE(std::isnan(l[k].consensus_distance));
    EXPECT_EQ(l[k].eval_time_s, 0.0);
    EXPECT_NEAR(a[k].eval_time_s, static_cast<double>(k + 1) * price, 1e-9);
    EXPECT_EQ(l[k].virtual_time_s, a[k].virtual_time_s);  // evaluation leaves the algorithm's clock alone
  }
  EXPECT_DOUBLE_EQ(local.final_val_loss, l.back().val_loss);
}

// Utilization in the train lines: compute over virtual time; 1 when the exchange is hidden.
TEST_F(Overlap, TrainLinesCarryComputeAndUtilization) {
  const std::vector<std::string> s = {"algo.name=diloco", "network.step_time_s=0.1", "network.latency_s=0",
                                      "network.simulated_model_bytes=1000", "network.bandwidth_gbit=0.00004"};
  // C = 1000 B / 5000 B/s = 0.2 s per round: hidden by 3 steps (0.3 s), paid in full at tau = 0.
  for (const int64_t tau : {0, 3}) {
    auto settings = s;
    settings.push_back("algo.overlap_steps=" + std::to_string(tau));
    const std::string dir = "util_" + std::to_string(tau);
    train::run_training(request(root_, dir, settings));
    int lines = 0;
    for (const auto& e : train::read_metrics(root_ / dir)) {
      const auto* t = std::get_if<train::TrainEvent>(&e);
      if (!t) continue;
      ++lines;
      ASSERT_TRUE(t->utilization.has_value());
      EXPECT_NEAR(*t->compute_s, 0.1 * static_cast<double>(t->step), 1e-9);
      EXPECT_NEAR(*t->utilization, *t->compute_s / t->virtual_time_s, 1e-12);
      // Rounds end at multiples of 5; with tau = 3 each lands before anyone waits (the last one at the end).
      const double rounds_paid = tau == 0 ? static_cast<double>(t->step / 5) : (t->step == 40 ? 1.0 : 0.0);
      EXPECT_NEAR(t->virtual_time_s, 0.1 * static_cast<double>(t->step) + 0.2 * rounds_paid, 1e-9) << "step " << t->step;
    }
    EXPECT_EQ(lines, 16);  // 8 log steps x 2 workers
  }
}
