// Synchronizers on the in-process cluster, each pinned to a simpler algorithm it must reduce
// to (docs/design.md section 3) or to hand-computed values. Tolerances are stated per test.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <thread>

#include "gasloc/algo/algo_config.hpp"
#include "gasloc/algo/algorithms.hpp"
#include "gasloc/algo/consensus.hpp"
#include "gasloc/algo/registry.hpp"
#include "gasloc/core/config.hpp"
#include "gasloc/optim/adamw.hpp"
#include "gasloc/optim/gpa.hpp"
#include "gasloc/comm/inproc.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/data/dataset.hpp"
#include "gasloc/data/sampler.hpp"
#include "gasloc/train/checkpoint.hpp"
#include "gasloc/train/metrics.hpp"
#include "gasloc/train/trainer.hpp"
#include "gasloc/train/worker.hpp"
#include "test_util.hpp"

using namespace gasloc;

namespace {
struct ClusterRun {
  std::vector<torch::Tensor> params;            // final phi per rank
  std::vector<std::vector<double>> losses;      // per rank, per step
  std::vector<int64_t> bytes_sent;              // per rank, as priced by the network model
  std::vector<double> clock;                    // per rank, virtual seconds at the end
  std::vector<int64_t> sync_state_bytes;        // per rank
};

class Algo : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = test_util::temp_root("test_algo");
    data_ = test_util::make_byte_dataset(root_);
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(root_); }

  // n workers of the nano job, each with the synchronizer made from `a`, for `steps` inner steps.
  static ClusterRun run(int n, const algo::AlgoConfig& a, int64_t steps, std::vector<std::string> extra = {}) {
    const auto job = test_util::nano_job(data_, extra);
    const auto ds = data::Dataset::open(job.data.dir);
    const auto mc = job.model.resolve(ds.vocab_size);
    comm::InProcCluster cluster(n, job.network.model(n));
    std::vector<std::unique_ptr<train::Worker>> workers;
    for (int r = 0; r < n; ++r)
      workers.push_back(std::make_unique<train::Worker>(job, mc, ds, cluster.comm(r), algo::make_synchronizer(a, n, job.train.seed)));
    ClusterRun out;
    out.losses.resize(n);
    cluster.run([&](int r, comm::Communicator&) {
      for (int64_t s = 0; s < steps; ++s) out.losses[r].push_back(workers[r]->step().loss);
    });
    for (auto& w : workers) out.params.push_back(w->params().data().clone());
    for (int r = 0; r < n; ++r) {
      out.bytes_sent.push_back(cluster.comm(r).stats().bytes_sent);
      out.clock.push_back(cluster.comm(r).now());
      out.sync_state_bytes.push_back(workers[r]->sync_state_bytes());
    }
    return out;
  }

  static algo::AlgoConfig cfg(const std::string& name, int64_t H = 5, double eta = 0.7, double mu = 0.9,
                              const std::string& topo = "2peer") {
    algo::AlgoConfig a;
    a.name = name;
    a.H = H;
    a.outer_lr = eta;
    a.outer_momentum = mu;
    a.topology = topo;
    return a;
  }
  static algo::AlgoConfig form(const std::string& f, double eta, double mu, const std::string& topo = "2peer",
                               double alpha = 1.0, int64_t H = 5) {
    auto a = cfg("gasloc", H, eta, mu, topo);
    a.form = f;
    a.gossip_step = alpha;
    return a;
  }

  static inline std::filesystem::path root_, data_;
};

// An unknown name is refused where it is read, naming the key and the valid names.
void expect_bad_choice(const std::string& key, const std::string& value, const std::string& valid_one) {
  algo::AlgoConfig a;
  try {
    config::apply_override(a, "algo", key, value);
    ADD_FAILURE() << "expected ConfigError for algo." << key << " = " << value;
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("algo." + key), std::string::npos) << what;
    EXPECT_NE(what.find(valid_one), std::string::npos) << what;
  }
}

double max_diff(const torch::Tensor& a, const torch::Tensor& b) { return (a - b).abs().max().item<double>(); }
}  // namespace

TEST_F(Algo, GasLocOnTheCompleteGraphIsDiLoCo) {
  // n = 4, H = 5, 4 rounds. Same operations in the same order: bitwise equal.
  const auto diloco = run(4, cfg("diloco"), 20);
  const auto gasloc = run(4, cfg("gasloc", 5, 0.7, 0.9, "complete"), 20);
  for (int r = 0; r < 4; ++r) {
    EXPECT_TRUE(torch::equal(diloco.params[r], gasloc.params[r])) << "rank " << r;
    EXPECT_EQ(diloco.losses[r], gasloc.losses[r]) << "rank " << r;
  }
  // After a DiLoCo round all workers hold the same theta.
  EXPECT_TRUE(torch::equal(diloco.params[0], diloco.params[3]));
  // And the outer step did something: eta = 0.7, mu = 0.9 differs from plain averaging.
  const auto avg = run(4, cfg("gasloc", 5, 1.0, 0.0, "complete"), 20);
  EXPECT_GT(max_diff(avg.params[0], diloco.params[0]), 1e-4);
}

TEST_F(Algo, GasLocWithUnitLrAndNoMomentumIsLocalDAdam) {
  // theta - 1 * (theta - m) equals m up to one rounding per round: 1e-6 absolute over 4 rounds.
  const auto gasloc = run(4, cfg("gasloc", 5, 1.0, 0.0, "1peer"), 20);
  const auto local = run(4, cfg("local_dadam", 5, 0.7, 0.9, "1peer"), 20);
  for (int r = 0; r < 4; ++r) EXPECT_LT(max_diff(gasloc.params[r], local.params[r]), 1e-6) << "rank " << r;
  // Gossip (unlike DiLoCo) leaves the workers apart after a round.
  EXPECT_GT(max_diff(local.params[0], local.params[1]) + max_diff(local.params[0], local.params[2]), 1e-5);
}

TEST_F(Algo, DiLoCoWithOneWorkerOneStepUnitLrIsAdamW) {
  // n = 1, H = 1, eta = 1, mu = 0: theta <- phi after every step (up to rounding: 1e-6).
  const auto diloco = run(1, cfg("diloco", 1, 1.0, 0.0), 20);
  const auto plain = run(1, cfg("none"), 20);
  EXPECT_LT(max_diff(diloco.params[0], plain.params[0]), 1e-6);
  for (size_t s = 0; s < 20; ++s) EXPECT_NEAR(diloco.losses[0][s], plain.losses[0][s], 1e-5) << "step " << s + 1;
}

TEST_F(Algo, AllReduceEqualsOneWorkerWithNTimesTheBatch) {
  const int n = 3;
  const int64_t steps = 6;
  const auto ddp = run(n, cfg("allreduce"), steps);
  // Reference: one model whose batch is the concatenation of the n workers' batches.
  const auto job = test_util::nano_job(data_);
  const auto ds = data::Dataset::open(job.data.dir);
  model::Llama m(job.model.resolve(ds.vocab_size));
  m->init_weights(job.train.seed);
  FlatParams flat(m->hf_parameters());
  optim::AdamWOptions o;
  o.weight_decay = job.optim.weight_decay;
  optim::AdamW opt(flat, o);
  optim::Schedule sched{job.optim.lr, job.optim.warmup_steps, job.train.steps, job.optim.min_lr_ratio, job.optim.decay};
  std::vector<data::WindowSampler> samplers;
  for (int r = 0; r < n; ++r) samplers.emplace_back(ds.train, job.data.batch_size, job.data.seq_len, job.train.seed + r);
  for (int64_t k = 1; k <= steps; ++k) {
    std::vector<torch::Tensor> xs, ys;
    for (auto& s : samplers) {
      auto b = s.next();
      xs.push_back(b.inputs);
      ys.push_back(b.targets);
    }
    flat.zero_grad();
    m->loss(torch::cat(xs), torch::cat(ys)).backward();
    optim::clip_grad_norm(flat.grad(), job.optim.grad_clip);
    opt.step(sched.at(k));
  }
  // Gradient sums differ in order only; Adam's normalization keeps the effect near fp32 rounding.
  for (int r = 0; r < n; ++r) EXPECT_LT(max_diff(ddp.params[r], flat.data()), 2e-5) << "rank " << r;
  EXPECT_TRUE(torch::equal(ddp.params[0], ddp.params[2]));  // replicas stay identical
}

TEST_F(Algo, LocalDAdamWithOneStepIsAdaptThenCombine) {
  // Reference: every worker takes its own AdamW step (no communication), then x_i <- sum_j
  // W_t[i,j] x_j with the dense mixing matrix, written out here. Tolerance: 1e-6 over 8 steps.
  const int n = 5;
  const int64_t steps = 8;
  const auto a = cfg("local_dadam", 1, 0.7, 0.9, "2peer");
  const auto got = run(n, a, steps);
  const auto job = test_util::nano_job(data_);
  const auto ds = data::Dataset::open(job.data.dir);
  const auto mc = job.model.resolve(ds.vocab_size);
  comm::InProcCluster ranks(n);  // only for ranks (sampler seeds); no collective is called
  std::vector<std::unique_ptr<train::Worker>> ref;
  for (int r = 0; r < n; ++r) ref.push_back(std::make_unique<train::Worker>(job, mc, ds, ranks.comm(r), std::make_unique<algo::NoSync>()));
  topology::Topology topo(topology::Kind::two_peer, n, job.train.seed);
  for (int64_t t = 0; t < steps; ++t) {
    for (auto& w : ref) w->step();
    torch::NoGradGuard ng;
    const auto W = topo.mixing_matrix(t);
    std::vector<torch::Tensor> x;
    for (auto& w : ref) x.push_back(w->params().data().clone());
    for (int i = 0; i < n; ++i) {
      auto mixed = torch::zeros_like(x[i]);
      for (int j = 0; j < n; ++j)
        if (W[i * n + j] != 0) mixed.add_(x[j], W[i * n + j]);
      ref[i]->params().data().copy_(mixed);
    }
  }
  for (int r = 0; r < n; ++r) EXPECT_LT(max_diff(got.params[r], ref[r]->params().data()), 1e-6) << "rank " << r;
}

TEST_F(Algo, HandComputedThreeWorkerOnePeerRound) {
  // 3 workers, 1peer: one pair averages, the odd one out keeps its own phi. eta = 0.7, mu = 0.9,
  // b starts at 0, so b = Delta and theta = theta0 - eta * (1 + mu) * Delta.
  const uint64_t seed = 11;
  topology::Topology topo(topology::Kind::one_peer, 3, seed);
  const auto pi = topo.permutation(0);
  auto theta0 = [](int r) { return std::vector<double>{r + 1.0, -(r + 1.0)}; };
  auto phi = [](int r) { return std::vector<double>{r + 1.0 + 0.5 * r, -(r + 1.0) + 1.0}; };
  std::vector<std::vector<double>> theta_got(3), b_got(3);
  comm::InProcCluster cluster(3);
  cluster.run([&](int r, comm::Communicator& c) {
    const auto t0 = theta0(r), p = phi(r);
    auto w = torch::tensor(std::vector<float>(t0.begin(), t0.end()));
    FlatParams fp({{"w", w}});
    algo::GossipSync sync(1, {0.7, 0.9}, topo);
    sync.init(fp);
    fp.data().copy_(torch::tensor(std::vector<float>(p.begin(), p.end())));
    EXPECT_TRUE(sync.after_step(1, fp, c));
    auto st = sync.state();
    for (int k = 0; k < 2; ++k) {
      theta_got[r].push_back(fp.data()[k].item<double>());
      b_got[r].push_back(st.at("momentum")[k].item<double>());
    }
  });
  for (int r = 0; r < 3; ++r) {
    const int partner = r == pi[0] ? pi[1] : r == pi[1] ? pi[0] : -1;
    for (int k = 0; k < 2; ++k) {
      const double m = partner < 0 ? phi(r)[k] : 0.5 * (phi(r)[k] + phi(partner)[k]);
      const double delta = theta0(r)[k] - m;
      EXPECT_NEAR(b_got[r][k], delta, 1e-6) << "rank " << r << " k " << k;
      EXPECT_NEAR(theta_got[r][k], theta0(r)[k] - 0.7 * (1 + 0.9) * delta, 1e-6) << "rank " << r << " k " << k;
    }
  }
}

TEST_F(Algo, NonFinitePeerIsRejectedWithoutCorruptingParameters) {
  algo::AlgoConfig a = cfg("gasloc", 1, 0.7, 0.9, "1peer");
  std::string error;
  torch::Tensor before, after;
  comm::InProcCluster cluster(2);
  cluster.run([&](int r, comm::Communicator& c) {
    FlatParams fp({{"w", torch::ones({4})}});
    auto sync = algo::make_synchronizer(a, 2, 3);
    sync->init(fp);
    if (r == 1) fp.data().fill_(std::numeric_limits<float>::quiet_NaN());
    else fp.data().fill_(2.0f);
    if (r == 0) before = fp.data().clone();
    try {
      sync->after_step(1, fp, c);
    } catch (const CommError& e) {
      if (r == 0) error = e.what();
    }
    if (r == 0) after = fp.data().clone();
  });
  EXPECT_NE(error.find("worker 1"), std::string::npos) << error;
  EXPECT_NE(error.find("non-finite"), std::string::npos) << error;
  // What happens is said (issue 62, item 5: it said the round was rejected and the run went on).
  EXPECT_NE(error.find("stops the run here without mixing them"), std::string::npos) << error;
  EXPECT_TRUE(torch::equal(before, after));
}

// Issue 62, item 5: with algo.clip_peers, a non-finite message stopped the run as without it. It
// is now a dropped edge, counted against its sender: worker 0 mixes as if its partner had sent
// worker 0's own value (gossip), and every worker averages the others' messages (all-reduce).
TEST_F(Algo, WithClippingANonFinitePeerIsADroppedEdgeCountedAgainstItsSender) {
  for (const char* name : {"gasloc", "diloco"}) {
    SCOPED_TRACE(name);
    const bool gossip = std::string(name) == "gasloc";
    algo::AlgoConfig a = cfg(name, 1, 0.7, 0.9, gossip ? "1peer" : "complete");
    a.clip_peers = true;
    const int n = gossip ? 2 : 3;
    // Worker 1 sends `sent`; the others 2. Returns worker 0's parameters and its counts.
    auto round = [&](float sent) {
      torch::Tensor after;
      std::vector<int64_t> dropped, clipped;
      comm::InProcCluster cluster(n);
      cluster.run([&](int r, comm::Communicator& c) {
        FlatParams fp({{"w", torch::ones({4})}});
        auto sync = algo::make_synchronizer(a, n, 3);
        sync->init(fp);
        fp.data().fill_(r == 1 ? sent : 2.0f);
        sync->after_step(1, fp, c);
        if (r == 0) {
          after = fp.data().clone();
          dropped = *sync->dropped_from();
          clipped = *sync->clipped_from();
        }
      });
      return std::make_tuple(after, dropped, clipped);
    };
    const auto [with_nan, dropped, clipped] = round(std::numeric_limits<float>::quiet_NaN());
    const auto [as_own, none, no_clip] = round(2.0f);
    EXPECT_TRUE(torch::equal(with_nan, as_own)) << with_nan << as_own;
    std::vector<int64_t> one_from_1(static_cast<size_t>(n), 0);
    one_from_1[1] = 1;
    EXPECT_EQ(dropped, one_from_1);
    EXPECT_EQ(none, std::vector<int64_t>(static_cast<size_t>(n), 0));
    EXPECT_EQ(clipped, std::vector<int64_t>(static_cast<size_t>(n), 0));  // dropped, not clipped
  }
}

// The study layer prices and labels runs from the registry, never by comparing names: each
// entry says how many rounds it communicates and whether a round is an all-reduce. Hand-written
// for every algorithm (a new one must be added here).
TEST(Registry, WhatEachAlgorithmSendsAndWhen) {
  struct Want {
    int64_t rounds;                      // in 300 steps at H = 30
    bool all_reduce_2peer, all_reduce_complete;
  };
  const std::map<std::string, Want> want = {{"none", {0, true, true}},         {"allreduce", {300, true, true}},
                                            {"diloco", {10, true, true}},      {"gasloc", {10, false, true}},
                                            {"dadam", {300, false, true}},     {"local_dadam", {10, false, true}}};
  EXPECT_EQ(algo::algorithms().size(), want.size());
  for (const auto& e : algo::algorithms()) {
    SCOPED_TRACE(e.name);
    ASSERT_EQ(want.count(e.name), 1u);
    const Want& w = want.at(e.name);
    EXPECT_EQ(e.rounds_in(300, 30), w.rounds);
    EXPECT_EQ(e.all_reduces("2peer"), w.all_reduce_2peer);
    EXPECT_EQ(e.all_reduces("1peer"), w.all_reduce_2peer);
    EXPECT_EQ(e.all_reduces("complete"), w.all_reduce_complete);
  }
}

TEST_F(Algo, BadSettingsNameTheKey) {
  auto expect = [](algo::AlgoConfig a, int n, const std::string& needle) {
    try {
      a.validate(n);
      ADD_FAILURE() << "expected ConfigError mentioning " << needle;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect(cfg("gasloc", 0), 4, "algo.H");
  expect(cfg("gasloc", 5, 0.0), 4, "algo.outer_lr");
  expect(cfg("gasloc", 5, 0.7, 1.0), 4, "algo.outer_momentum");
  expect(cfg("gasloc", 5, 0.7, -0.1), 4, "algo.outer_momentum");
  expect_bad_choice("topology", "star", "1peer");
  expect(cfg("gasloc", 5, 0.7, 0.9, "1peer"), 1, "algo.topology");
  expect_bad_choice("name", "magic", "diloco");  // the message lists the valid names
  expect(cfg("none"), 4, "algo.name");
}

// ---------------------------------------------------------------------------------------------
// GPA / Schedule-Free as the inner optimizer: parameters travel at the evaluation point x.

TEST_F(Algo, GasLocOnTheCompleteGraphIsDiLoCoWithGpaInside) {
  // The reduction holds for any inner optimizer: bitwise, with GPA and with Schedule-Free.
  for (const std::string opt : {"gpa", "schedule_free"}) {
    const std::vector<std::string> o = {"optim.name=" + opt, "optim.mu_x=0.9"};
    const auto diloco = run(4, cfg("diloco"), 20, o);
    const auto gasloc = run(4, cfg("gasloc", 5, 0.7, 0.9, "complete"), 20, o);
    for (int r = 0; r < 4; ++r) {
      EXPECT_TRUE(torch::equal(diloco.params[r], gasloc.params[r])) << opt << " rank " << r;
      EXPECT_EQ(diloco.losses[r], gasloc.losses[r]) << opt << " rank " << r;
    }
    const auto adamw = run(4, cfg("diloco"), 20);
    EXPECT_GT(max_diff(adamw.params[0], diloco.params[0]), 1e-4) << opt;  // the inner optimizer matters
  }
}

namespace {
// Two ranks, each with its own small flat buffer (same start), its own GPA and a synchronizer
// with eta = 1, mu = 0 (so the round sets the model to the plain average). Rank r's gradient
// pulls towards a different target. Returns, per rank, x, y and z just before the round and the
// evaluation point and z - x just after it.
struct RoundSnapshot {
  torch::Tensor x_before, y_before, z_minus_x_before, x_after, z_minus_x_after;
};

std::vector<RoundSnapshot> gpa_round(const algo::AlgoConfig& a) {
  constexpr int n = 2, H = 3;
  comm::InProcCluster cluster(n);
  std::vector<RoundSnapshot> out(n);
  cluster.run([&](int r, comm::Communicator& comm) {
    torch::manual_seed(11);
    auto w = torch::randn({4, 3}), g = torch::randn({3});
    FlatParams flat({{"w", w}, {"g", g}});
    optim::GpaOptions o;
    o.mu_x = 0.8;
    o.mu_y = 0.6;
    optim::Gpa opt(flat, o);
    auto sync = algo::make_synchronizer(a, n, 7);
    sync->attach(&opt);
    sync->init(flat);
    const auto target = torch::full({flat.numel()}, r == 0 ? 2.0 : -3.0);
    for (int k = 1; k <= H; ++k) {
      flat.grad().copy_(flat.data() - target);
      opt.step(0.1);
      if (k == H) {
        auto& s = out[r];
        s.y_before = flat.data().clone();
        optim::EvalScope at_x(&opt);
        s.x_before = flat.data().clone();
        s.z_minus_x_before = opt.z_buffer() - flat.data();
      }
      EXPECT_EQ(sync->after_step(k, flat, comm), k == H);
    }
    optim::EvalScope at_x(&opt);
    out[r].x_after = flat.data().clone();
    out[r].z_minus_x_after = opt.z_buffer() - flat.data();
  });
  return out;
}
}  // namespace

TEST_F(Algo, SynchronizersExchangeTheEvaluationPoint) {
  // DiLoCo and GASLoC-1peer (n = 2: one pair, W = 1/2) with eta = 1, mu = 0: after the round
  // every worker's model x is the mean of the x_i before it, and each keeps its own z - x (the
  // three sequences are translated together). 1e-6: a few float32 roundings.
  for (const auto& a : {cfg("diloco", 3, 1.0, 0.0), cfg("gasloc", 3, 1.0, 0.0, "1peer")}) {
    SCOPED_TRACE(a.name);
    const auto s = gpa_round(a);
    const auto mean_x = (s[0].x_before + s[1].x_before) / 2;
    const auto mean_y = (s[0].y_before + s[1].y_before) / 2;
    for (int r = 0; r < 2; ++r) {
      EXPECT_LT(max_diff(s[r].x_after, mean_x), 1e-6) << "rank " << r;
      EXPECT_LT(max_diff(s[r].z_minus_x_after, s[r].z_minus_x_before), 1e-6) << "rank " << r;
    }
    // Averaging y instead would be visibly different: the test can tell the two apart.
    EXPECT_GT(max_diff(mean_x, mean_y), 1e-3);
    EXPECT_GT(max_diff(s[0].x_before, s[1].x_before), 1e-2);
  }
}

namespace {
// A synchronizer that asks its worker for an evaluation in the middle of the worker's step.
class EvaluatesMidStep final : public algo::Synchronizer {
 public:
  std::string name() const override { return "evaluates_mid_step"; }
  bool after_step(int64_t, FlatParams&, comm::Communicator&) override {
    worker->evaluate({});
    return false;
  }
  train::Worker* worker = nullptr;
};
}  // namespace

TEST_F(Algo, EvaluationDuringATrainingStepIsRefused) {
  const auto job = test_util::nano_job(data_, {"optim.name=gpa"});
  const auto ds = data::Dataset::open(job.data.dir);
  comm::SingleRank single;
  auto sync = std::make_unique<EvaluatesMidStep>();
  auto* probe = sync.get();
  train::Worker w(job, job.model.resolve(ds.vocab_size), ds, single, std::move(sync));
  probe->worker = &w;
  try {
    w.step();
    ADD_FAILURE() << "evaluate() inside step() must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("in a training step"), std::string::npos) << e.what();
  }
  probe->worker = nullptr;  // between steps, evaluation is fine
  const auto val = data::validation_batches(*ds.val, 2, 16, 1);
  EXPECT_TRUE(std::isfinite(w.evaluate(val)));
}

// ---------------------------------------------------------------------------------------------
// GASLoC forms (algo.form), each pinned to its limits (docs/design.md section 3).

TEST_F(Algo, MixAfterOnTheCompleteGraphIsDiLoCo) {
  // The Nesterov buffers are linear: mean_j (theta - eta N_j) is DiLoCo's step with the mean of
  // the workers' buffers, which is DiLoCo's buffer. Not bitwise: the all-reduce averages the
  // v_j = theta - eta N_j instead of the phi_j, so the roundings differ (measured 6e-7 after 4
  // rounds; 1e-5 allowed).
  const auto diloco = run(4, cfg("diloco"), 20);
  const auto mix = run(4, form("mix_after", 0.7, 0.9, "complete"), 20);
  for (int r = 0; r < 4; ++r) EXPECT_LT(max_diff(diloco.params[r], mix.params[r]), 1e-5) << "rank " << r;
  // Like DiLoCo, every worker leaves the round with the same theta.
  EXPECT_TRUE(torch::equal(mix.params[0], mix.params[3]));
  // On a sparse graph the form is not the anchor form.
  const auto anchor = run(4, form("anchor", 0.7, 0.9, "1peer"), 10);
  const auto mix_sparse = run(4, form("mix_after", 0.7, 0.9, "1peer"), 10);
  EXPECT_GT(max_diff(anchor.params[0], mix_sparse.params[0]), 1e-4);
}

TEST_F(Algo, MixAfterWithUnitLrAndNoMomentumIsLocalDAdam) {
  // theta - 1 * (theta - phi) is phi up to one rounding per round: 1e-6 over 4 rounds.
  const auto mix = run(4, form("mix_after", 1.0, 0.0, "1peer"), 20);
  const auto local = run(4, cfg("local_dadam", 5, 0.7, 0.9, "1peer"), 20);
  for (int r = 0; r < 4; ++r) EXPECT_LT(max_diff(mix.params[r], local.params[r]), 1e-6) << "rank " << r;
}

TEST_F(Algo, AcceleratedWithUnitStepsAndNoMomentumIsLocalDAdamBitwise) {
  // eta = alpha = 1, gamma = 0: u = lerp(theta, phi, 1) = phi and lerp(u, m, 1) = m exactly.
  const auto acc = run(4, form("accelerated", 1.0, 0.0, "2peer", 1.0), 20);
  const auto local = run(4, cfg("local_dadam", 5, 0.7, 0.9, "2peer"), 20);
  for (int r = 0; r < 4; ++r) {
    EXPECT_TRUE(torch::equal(acc.params[r], local.params[r])) << "rank " << r;
    EXPECT_EQ(acc.losses[r], local.losses[r]) << "rank " << r;
  }
}

TEST_F(Algo, AcceleratedWithoutMixingIsNesterovSgdOnThePseudoGradient) {
  // One worker: W = [1], Lambda = 0. DiLoCo with one worker is PyTorch's Nesterov SGD (lr eta,
  // momentum mu, dampening 0) on the pseudo-gradient theta - phi; the accelerated form with
  // gamma = mu must be the same algorithm. Different operations (u + gamma (u - u_prev) against
  // theta - eta (Delta + mu b)): measured 8e-7 over 4 rounds, 1e-5 allowed.
  const auto diloco = run(1, cfg("diloco", 5, 0.7, 0.9), 20);
  const auto acc = run(1, form("accelerated", 0.7, 0.9, "complete"), 20);
  EXPECT_LT(max_diff(diloco.params[0], acc.params[0]), 1e-5);
  // With gamma = 0 it is not the same run: the test can tell momentum apart.
  const auto no_momentum = run(1, form("accelerated", 0.7, 0.0, "complete"), 20);
  EXPECT_GT(max_diff(diloco.params[0], no_momentum.params[0]), 1e-4);
}

namespace {
// Two workers, 1peer (n = 2: the pair averages, W = 1/2, every round), H = 1, on three-entry
// buffers starting at theta0(r). Before round t worker r's live parameters are moved to
// theta + offset(r, t), as if by local steps. Returns theta per rank and round, and the state.
struct SyncRounds {
  std::vector<std::vector<std::vector<double>>> theta;  // [rank][round][k]
  std::vector<algo::StateDict> state;
};
std::vector<double> theta0(int r) { return {1.0 + r, -0.5 * r, 0.25}; }
double offset(int r, int t, int k) { return 0.1 * (r + 1) * (k + 1) - 0.07 * t * (k - 1) + 0.03 * r * t; }

SyncRounds sync_rounds(const algo::AlgoConfig& a, int rounds) {
  SyncRounds out;
  out.theta.resize(2);
  out.state.resize(2);
  comm::InProcCluster cluster(2);
  cluster.run([&](int r, comm::Communicator& c) {
    const auto t0 = theta0(r);
    FlatParams fp({{"w", torch::tensor(std::vector<float>(t0.begin(), t0.end()))}});
    auto sync = algo::make_synchronizer(a, 2, 5);
    sync->init(fp);
    for (int t = 0; t < rounds; ++t) {
      for (int k = 0; k < 3; ++k) fp.data()[k] += offset(r, t, k);
      EXPECT_TRUE(sync->after_step(1, fp, c));
      std::vector<double> th;
      for (int k = 0; k < 3; ++k) th.push_back(fp.data()[k].item<double>());
      out.theta[r].push_back(th);
    }
    out.state[r] = sync->state();
  });
  return out;
}
}  // namespace

TEST_F(Algo, AcceleratedRoundsMatchTheDefinitionAndNesterovWithoutMixing) {
  const double eta = 0.7, gamma = 0.6;
  for (double alpha : {0.0, 0.6, 1.0}) {
    SCOPED_TRACE("alpha " + std::to_string(alpha));
    const auto got = sync_rounds(form("accelerated", eta, gamma, "1peer", alpha, 1), 4);
    // The definition, in doubles: u_i = theta_i + eta (phi_i - theta_i);
    // theta_i <- u_i - alpha (u_i - mean(u)) + gamma (u_i - u_i^prev), u^prev starting at theta_0.
    std::vector<std::vector<double>> th = {theta0(0), theta0(1)}, up = th;
    // alpha = 0 (Lambda = 0): PyTorch's Nesterov SGD on g = theta - phi, written its own way.
    std::vector<std::vector<double>> nt = th, nb = {{0, 0, 0}, {0, 0, 0}};
    for (int t = 0; t < 4; ++t) {
      for (int k = 0; k < 3; ++k) {
        double u[2];
        for (int r = 0; r < 2; ++r) u[r] = th[r][k] + eta * offset(r, t, k);
        const double m = 0.5 * (u[0] + u[1]);
        for (int r = 0; r < 2; ++r) {
          th[r][k] = u[r] - alpha * (u[r] - m) + gamma * (u[r] - up[r][k]);
          up[r][k] = u[r];
          const double g = -offset(r, t, k);
          nb[r][k] = gamma * nb[r][k] + g;
          nt[r][k] -= eta * (g + gamma * nb[r][k]);
        }
      }
      for (int r = 0; r < 2; ++r)
        for (int k = 0; k < 3; ++k) {
          EXPECT_NEAR(got.theta[r][t][k], th[r][k], 1e-5) << "rank " << r << " round " << t << " k " << k;
          if (alpha == 0.0) EXPECT_NEAR(got.theta[r][t][k], nt[r][k], 1e-5) << "Nesterov, rank " << r << " round " << t;
        }
    }
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(got.state[r].count("u_prev"), 1u);
      EXPECT_EQ(got.state[r].count("momentum"), 0u);  // its momentum acts on u, not through b
      for (int k = 0; k < 3; ++k) EXPECT_NEAR(got.state[r].at("u_prev")[k].item<double>(), up[r][k], 1e-5);
    }
  }
}

// Each GASLoC form is written once (algo/round_forms.hpp) and run by GossipSync on one worker's
// float32 parameters and by the consensus simulation (algo/consensus.hpp, which `gasloc topo
// --consensus` and docs/topology.md measure) on every worker's doubles at once, beside its own mix.
// With parameters no training moves (phi_i = theta_i), a GossipSync round is a simulation round:
// both start from the simulation's start vectors and must agree on the consensus distance round by
// round. float32 against doubles: relative 1e-4 (a form run differently is off by far more).
TEST_F(Algo, GossipSyncWithFrozenParametersIsTheConsensusSimulation) {
  const int n = 6;
  const int64_t dim = 8, rounds = 8;
  const uint64_t seed = 11;
  const auto start = algo::consensus_start(n, dim, seed);
  struct Case {
    std::string form;
    double eta, mu, alpha;
  };
  for (const Case& c : {Case{"anchor", 0.7, 0.9, 1.0}, Case{"mix_after", 0.7, 0.9, 1.0},
                        Case{"accelerated", 0.7, 0.5, 0.6}, Case{"anchor", 1.0, 0.0, 1.0}}) {
    SCOPED_TRACE(c.form + " eta " + std::to_string(c.eta) + " mu " + std::to_string(c.mu));
    const auto a = form(c.form, c.eta, c.mu, "2peer", c.alpha, 1);
    std::vector<std::vector<double>> x(rounds + 1, std::vector<double>(static_cast<size_t>(n * dim)));
    comm::InProcCluster cluster(n);
    cluster.run([&](int r, comm::Communicator& comm) {
      const std::vector<float> mine(start.begin() + r * dim, start.begin() + (r + 1) * dim);
      FlatParams fp({{"w", torch::tensor(mine)}});
      auto sync = algo::make_synchronizer(a, n, seed);
      sync->init(fp);
      const auto record = [&](int64_t t) {
        for (int64_t k = 0; k < dim; ++k) x[t][r * dim + k] = fp.data()[k].item<double>();
      };
      record(0);
      for (int64_t t = 0; t < rounds; ++t) {
        EXPECT_TRUE(sync->after_step(1, fp, comm));
        record(t + 1);
      }
    });
    const algo::OuterStep step{c.eta, c.mu, algo::parse_form(c.form), c.alpha};
    const auto want =
        algo::simulate_consensus(topology::Topology(topology::Kind::two_peer, n, seed), rounds, dim, seed, step);
    ASSERT_EQ(want.size(), static_cast<size_t>(rounds + 1));
    const double d0 = algo::consensus_distance(x[0], n, dim);
    for (int64_t t = 1; t <= rounds; ++t) {
      const double got = algo::consensus_distance(x[t], n, dim) / d0;
      EXPECT_NEAR(got, want[t], 1e-4 * want[t] + 1e-7) << "round " << t;
    }
    EXPECT_LT(want[rounds], 0.5);  // the rounds did mix: a test of a no-op would pass trivially
  }
}

TEST_F(Algo, MixAfterRoundsMatchTheDefinition) {
  // v_i = theta_i - eta (Delta_i + mu b_i) with b_i <- mu b_i + Delta_i, Delta_i = theta_i - phi_i;
  // theta_i <- (v_0 + v_1) / 2. In doubles; 1e-5 against float32.
  const double eta = 0.7, mu = 0.9;
  const auto got = sync_rounds(form("mix_after", eta, mu, "1peer", 1.0, 1), 4);
  std::vector<std::vector<double>> th = {theta0(0), theta0(1)}, b = {{0, 0, 0}, {0, 0, 0}};
  for (int t = 0; t < 4; ++t) {
    for (int k = 0; k < 3; ++k) {
      double v[2];
      for (int r = 0; r < 2; ++r) {
        const double delta = -offset(r, t, k);
        b[r][k] = mu * b[r][k] + delta;
        v[r] = th[r][k] - eta * (delta + mu * b[r][k]);
      }
      th[0][k] = th[1][k] = 0.5 * (v[0] + v[1]);
    }
    for (int r = 0; r < 2; ++r)
      for (int k = 0; k < 3; ++k) EXPECT_NEAR(got.theta[r][t][k], th[r][k], 1e-5) << "rank " << r << " round " << t;
  }
  for (int r = 0; r < 2; ++r)
    for (int k = 0; k < 3; ++k) EXPECT_NEAR(got.state[r].at("momentum")[k].item<double>(), b[r][k], 1e-5) << "rank " << r;
}

TEST_F(Algo, FormsKeepTheStateTheyNeed) {
  // Parameter-sized buffers: theta and b (anchor, mix_after); theta and u^prev (accelerated: u^prev
  // takes b's place); theta alone without momentum. Plus the two round counters (16 bytes).
  const std::vector<std::pair<algo::AlgoConfig, int>> cases = {
      {form("anchor", 0.7, 0.9, "1peer"), 2},      {form("mix_after", 0.7, 0.9, "1peer"), 2},
      {form("accelerated", 0.7, 0.9, "1peer"), 2}, {form("accelerated", 0.7, 0.0, "1peer"), 1},
      {form("mix_after", 1.0, 0.0, "1peer"), 1}};
  for (const auto& [a, buffers] : cases) {
    const auto got = run(2, a, 5);
    const int64_t numel = got.params[0].numel();
    EXPECT_EQ(got.sync_state_bytes[0], buffers * 4 * numel + 16) << a.form << " mu " << a.outer_momentum;
  }
}

TEST_F(Algo, FormSettingsAreChecked) {
  auto expect = [](algo::AlgoConfig a, const std::string& needle) {
    try {
      a.validate(4);
      ADD_FAILURE() << "expected ConfigError mentioning " << needle;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_bad_choice("form", "sideways", "mix_after");
  auto d = cfg("diloco");
  d.form = "accelerated";
  expect(d, "algo.form");  // forms are gasloc's
  expect(form("accelerated", 0.7, 0.9, "2peer", 1.5), "algo.gossip_step");
  expect(form("anchor", 0.7, 0.9, "2peer", 0.5), "algo.gossip_step");  // alpha is the accelerated form's
  expect_bad_choice("wire_dtype", "fp8", "bf16");
  for (const char* f : {"anchor", "mix_after", "accelerated"}) EXPECT_NO_THROW(form(f, 0.7, 0.9).validate(4)) << f;
}

namespace {
torch::Tensor vec(std::vector<double> v) { return torch::tensor(v, torch::kFloat64); }
void expect_values(const torch::Tensor& got, std::vector<double> want, const char* what) {
  ASSERT_EQ(got.numel(), static_cast<int64_t>(want.size())) << what;
  for (size_t k = 0; k < want.size(); ++k) EXPECT_NEAR(got[k].item<double>(), want[k], 1e-12) << what << " entry " << k;
}
// The form's state, copied: send() and provisional() must leave it as it was.
algo::StateDict copy_of(const algo::StateDict& s) {
  algo::StateDict c;
  for (const auto& [k, t] : s) c[k] = t.clone();
  return c;
}
void expect_unchanged(const algo::StateDict& before, const algo::StateDict& now) {
  ASSERT_EQ(before.size(), now.size());
  for (const auto& [k, t] : before) EXPECT_TRUE(torch::equal(t, now.at(k))) << k;
}
}  // namespace

// Each form's two halves (algo/round_forms.hpp) on one round of float64 vectors, against the
// values of its definition computed by hand: theta = (1, -2), phi = (1.5, -1), m = (1.2, -1.4),
// eta = mu = gamma = alpha = 0.5, b and u^prev at rest. 1e-12.
TEST(RoundForms, EachFormSendsAndLandsAsItsDefinition) {
  const auto theta0 = vec({1.0, -2.0}), phi = vec({1.5, -1.0}), m = vec({1.2, -1.4});
  const auto step = [](algo::Form f) { return algo::OuterStep{0.5, 0.5, f, f == algo::Form::accelerated ? 0.5 : 1.0}; };
  {
    SCOPED_TRACE("anchor: s = phi; Delta = theta - m = (-0.2, -0.6), b = Delta, theta' = theta - eta (Delta + mu b)");
    auto form = algo::make_round_form(step(algo::Form::anchor), theta0);
    const auto before = copy_of(form->state());
    const auto sent = form->send(phi);
    EXPECT_TRUE(sent.x.is_same(phi));
    // E: the step towards phi itself, Delta = (-0.5, -1): theta - 0.5 * 1.5 Delta.
    expect_values(form->provisional(phi, sent), {1.375, -1.25}, "E");
    expect_unchanged(before, form->state());
    expect_values(form->land(m, sent), {1.15, -1.55}, "theta'");
    expect_values(form->state().at("theta"), {1.15, -1.55}, "theta");
    expect_values(form->state().at("momentum"), {-0.2, -0.6}, "b");
  }
  {
    SCOPED_TRACE("mix_after: s = v = theta - eta (Delta + mu b'), Delta = theta - phi; theta' = m, b = b'");
    auto form = algo::make_round_form(step(algo::Form::mix_after), theta0);
    const auto before = copy_of(form->state());
    const auto sent = form->send(phi);
    expect_values(sent.x, {1.375, -1.25}, "v");
    expect_values(form->provisional(phi, sent), {1.375, -1.25}, "E");
    expect_unchanged(before, form->state());
    expect_values(form->land(m, sent), {1.2, -1.4}, "theta'");
    expect_values(form->state().at("momentum"), {-0.5, -1.0}, "b");
  }
  {
    SCOPED_TRACE("accelerated: s = u = theta + eta (phi - theta); theta' = u - alpha (u - m) + gamma (u - u^prev)");
    auto form = algo::make_round_form(step(algo::Form::accelerated), theta0);
    const auto before = copy_of(form->state());
    const auto sent = form->send(phi);
    expect_values(sent.x, {1.25, -1.5}, "u");
    expect_values(form->provisional(phi, sent), {1.375, -1.25}, "E = u + gamma (u - u^prev)");
    expect_unchanged(before, form->state());
    expect_values(form->land(m, sent), {1.35, -1.2}, "theta'");
    expect_values(form->state().at("u_prev"), {1.25, -1.5}, "u^prev");
    EXPECT_EQ(form->state().count("momentum"), 0u);
  }
  {
    SCOPED_TRACE("mix only (Local-DAdam): s = phi; theta' = m exactly");
    auto form = algo::make_mix_only_form();
    const auto sent = form->send(phi);
    EXPECT_TRUE(sent.x.is_same(phi));
    EXPECT_TRUE(form->provisional(phi, sent).is_same(phi));
    EXPECT_TRUE(torch::equal(form->land(m, sent), m));
    EXPECT_TRUE(form->state().empty());
  }
}

// ---------------------------------------------------------------------------------------------
// algo.wire_dtype: cast on send, mixed and kept in fp32.

TEST_F(Algo, Bf16WireRoundsOnlyWhatTravels) {
  // n = 2, 1peer: m_i = phi_i / 2 + bf16(phi_j) / 2, the own term unrounded. 1 + 2^-10 is not a
  // bf16 value (8 significant bits): it arrives as 1.
  torch::Tensor m0, m1;
  int64_t sent0 = 0;
  comm::InProcCluster cluster(2);
  topology::Topology topo(topology::Kind::one_peer, 2, 3);
  cluster.run([&](int r, comm::Communicator& c) {
    const auto phi = torch::full({8}, r == 0 ? 1.0f + 1.0f / 1024 : 3.0f + 3.0f / 1024);
    auto m = algo::gossip_mix(topo, 0, phi, c, torch::kBFloat16);
    EXPECT_EQ(m.scalar_type(), torch::kFloat);
    (r == 0 ? m0 : m1) = m;
    if (r == 0) sent0 = c.stats().bytes_sent;
  });
  EXPECT_FLOAT_EQ(m0[0].item<float>(), 0.5f * (1.0f + 1.0f / 1024) + 0.5f * 3.0f);
  EXPECT_FLOAT_EQ(m1[0].item<float>(), 0.5f * (3.0f + 3.0f / 1024) + 0.5f * 1.0f);
  EXPECT_EQ(sent0, 8 * 2);  // priced (and counted) as 2 bytes per parameter
}

TEST_F(Algo, Bf16WireTrainsLikeFp32AtHalfTheBytes) {
  // 4 workers, H = 5, 2 rounds, for the three forms and DiLoCo. bf16 keeps 8 significant bits,
  // so each message is off by up to 2^-9 relative; the runs stay within 3e-3 of each other in
  // every training loss (measured at most 1.4e-3, mix_after; the losses are about 5.5) and send
  // half the bytes, which the virtual clock prices.
  for (const auto& a : {form("anchor", 0.7, 0.9), form("mix_after", 0.7, 0.9), form("accelerated", 0.7, 0.5, "2peer", 0.8),
                        cfg("diloco")}) {
    SCOPED_TRACE(a.name.str() + " " + a.form.str());
    auto b = a;
    b.wire_dtype = "bf16";
    const auto fp32 = run(4, a, 10, {"network.bandwidth_gbit=0.01"});
    const auto bf16 = run(4, b, 10, {"network.bandwidth_gbit=0.01"});
    for (int r = 0; r < 4; ++r) {
      for (size_t s = 0; s < 10; ++s) EXPECT_NEAR(fp32.losses[r][s], bf16.losses[r][s], 3e-3) << "rank " << r << " step " << s + 1;
      EXPECT_EQ(2 * bf16.bytes_sent[r], fp32.bytes_sent[r]) << "rank " << r;
      EXPECT_LT(bf16.clock[r], fp32.clock[r]) << "rank " << r;
    }
    EXPECT_GT(max_diff(fp32.params[0], bf16.params[0]), 0.0);  // it did round something
  }
}

// ---------------------------------------------------------------------------------------------
// Checkpoints: every form resumes bit-exactly (u_prev included).

TEST_F(Algo, EveryFormResumesBitExactly) {
  for (const std::string f : {"mix_after", "accelerated"}) {
    SCOPED_TRACE(f);
    auto request = [&](const std::string& dir, std::vector<std::string> extra) {
      train::TrainRequest r;
      r.quiet = true;
      r.overrides = {"model.preset=nano", "data.dir=" + data_.string(), "data.seq_len=32", "data.batch_size=4",
                     "data.val_batches=2", "train.steps=40", "train.eval_every=15", "train.checkpoint_every=0",
                     "train.log_every=10", "optim.lr=0.003", "optim.warmup_steps=5", "train.threads=1",
                     "cluster.workers=2", "algo.name=gasloc", "algo.topology=1peer", "algo.H=5",
                     "algo.form=" + f, "algo.outer_momentum=0.6", "algo.gossip_step=" + std::string(f == "accelerated" ? "0.8" : "1"),
                     "algo.wire_dtype=bf16", "train.run_dir=" + (root_ / dir).string()};
      r.overrides.insert(r.overrides.end(), extra.begin(), extra.end());
      return r;
    };
    const auto full = train::run_training(request(f + "_full", {}));
    const auto first = train::run_training(request(f + "_halves", {"train.stop_at=17"}));  // mid-round
    train::TrainRequest again;
    again.quiet = true;
    again.resume_dir = (root_ / (f + "_halves")).string();
    const auto second = train::run_training(again);
    ASSERT_EQ(full.train_losses.size(), 40u);
    ASSERT_EQ(second.train_losses.size(), 23u);
    for (size_t i = 0; i < 17; ++i) EXPECT_EQ(first.train_losses[i], full.train_losses[i]) << "step " << i + 1;
    for (size_t i = 0; i < 23; ++i) EXPECT_EQ(second.train_losses[i], full.train_losses[17 + i]) << "step " << 18 + i;
    EXPECT_EQ(second.final_val_loss, full.final_val_loss);
    for (int r = 0; r < 2; ++r) {
      const train::RunCheckpoints ca(root_ / (f + "_full"), 2), cb(root_ / (f + "_halves"), 2);
      auto a = train::load_checkpoint(ca.file(ca.committed(r).at(0), r));
      auto b = train::load_checkpoint(cb.file(cb.committed(r).at(0), r));
      EXPECT_EQ(a.tensors.count("sync.u_prev"), f == "accelerated" ? 1u : 0u);
      EXPECT_EQ(a.tensors.count("sync.momentum"), f == "mix_after" ? 1u : 0u);
      for (const auto& [k, t] : a.tensors)
        if (k != "rng.cpu") EXPECT_TRUE(torch::equal(t, b.tensors.at(k))) << k << " rank " << r;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// algo.clip_peers and faults.poison (docs/communication.md, "Poisoned peers").

TEST(PeerClip, HandComputedMediansAndClips) {
  EXPECT_EQ(algo::lower_median({3.0, 1.0, 2.0}), 2.0);
  EXPECT_EQ(algo::lower_median({4.0, 1.0}), 1.0);  // a pair: the smaller
  EXPECT_EQ(algo::lower_median({5.0, 1.0, 3.0, 100.0}), 3.0);
  EXPECT_THROW(algo::lower_median({}), Error);
  EXPECT_EQ(algo::l2_norm(torch::tensor({3.0f, 4.0f})), 5.0);

  const auto d = torch::tensor({3.0f, 4.0f});
  bool clipped = true;
  const auto same = algo::clip_to(d, 5.0, 5.0, &clipped);  // at the threshold: untouched
  EXPECT_FALSE(clipped);
  EXPECT_TRUE(same.is_same(d));
  const auto half = algo::clip_to(d, 5.0, 2.5, &clipped);  // 5 -> 2.5: scaled by exactly 1/2
  EXPECT_TRUE(clipped);
  EXPECT_TRUE(torch::equal(half, torch::tensor({1.5f, 2.0f})));
}

TEST(PeerClip, GossipClipsToTheReceiversMedianAndRemembersIt) {
  algo::PeerClip clip(2.0, 3);
  const auto x = torch::zeros({2});
  // Differences of norm 5 (from 1) and 50 (from 2): lower median 5, threshold 10.
  const auto honest = torch::tensor({3.0f, 4.0f});
  std::vector<torch::Tensor> recv = {honest, torch::tensor({30.0f, 40.0f})};
  clip.clip_received({1, 2}, x, recv);
  EXPECT_TRUE(recv[0].is_same(honest));  // below: the very tensor, bit for bit
  EXPECT_TRUE(torch::equal(recv[1], torch::tensor({6.0f, 8.0f})));  // 50 -> 10
  EXPECT_EQ(clip.clipped_from(), (std::vector<int64_t>{0, 0, 1}));
  // The window holds 5 and 10 (the clipped one at the threshold, not 50): with 12 now, the
  // lower median is 10 and the threshold 20, so 12 passes; a poisoned peer did not raise it.
  std::vector<torch::Tensor> next = {torch::tensor({0.0f, 12.0f})};
  clip.clip_received({1}, x, next);
  EXPECT_TRUE(torch::equal(next[0], torch::tensor({0.0f, 12.0f})));
  std::vector<torch::Tensor> far = {torch::tensor({0.0f, 25.0f})};  // window {5, 10, 12} + 25: median 10, threshold 20
  clip.clip_received({2}, x, far);
  EXPECT_TRUE(torch::equal(far[0], torch::tensor({0.0f, 20.0f})));
  EXPECT_EQ(clip.clipped_from(), (std::vector<int64_t>{0, 0, 2}));

  // The state round-trips: a restored clipper makes the same next decision.
  algo::StateDict s;
  clip.save(s);
  algo::PeerClip back(2.0, 3);
  back.load(s);
  EXPECT_EQ(back.clipped_from(), clip.clipped_from());
  std::vector<torch::Tensor> a = {torch::tensor({0.0f, 100.0f})}, b = {torch::tensor({0.0f, 100.0f})};
  clip.clip_received({1}, x, a);
  back.clip_received({1}, x, b);
  EXPECT_TRUE(torch::equal(a[0], b[0]));
  EXPECT_THROW(algo::PeerClip(1.0, 3), ConfigError);
}

TEST(PeerClip, AllReduceClipsEachPseudoGradientToTheRoundsMedian) {
  // Pseudo-gradients theta - x_j: (3, 4), (0, 1), (30, 40); norms 5, 1, 50, lower median 5,
  // threshold 10: the third becomes (6, 8). Mean (9, 13) / 3; theta - mean.
  algo::PeerClip clip(2.0, 3);
  const auto theta = torch::zeros({2});
  const auto m = clip.clipped_mean(theta, {torch::tensor({-3.0f, -4.0f}), torch::tensor({0.0f, -1.0f}),
                                           torch::tensor({-30.0f, -40.0f})});
  EXPECT_FLOAT_EQ(m[0].item<float>(), -3.0f);
  EXPECT_FLOAT_EQ(m[1].item<float>(), -13.0f / 3.0f);
  EXPECT_EQ(clip.clipped_from(), (std::vector<int64_t>{0, 0, 1}));
}

TEST_F(Algo, ClipAndPoisonSettingsNameTheKey) {
  auto expect_algo = [](algo::AlgoConfig a, const std::string& needle) {
    try {
      a.validate(4);
      ADD_FAILURE() << "expected ConfigError mentioning " << needle;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  auto clipped = [](algo::AlgoConfig a) {
    a.clip_peers = true;
    return a;
  };
  auto bad_factor = cfg("gasloc");
  bad_factor.clip_factor = 1.0;
  expect_algo(bad_factor, "algo.clip_factor");
  expect_algo(clipped(cfg("allreduce")), "algo.clip_peers");
  auto compressed = clipped(cfg("diloco"));
  compressed.compression = "int8";
  expect_algo(compressed, "algo.clip_peers");
  auto compressed_gossip = clipped(cfg("gasloc"));  // issue 63: tests/test_compression.cpp
  compressed_gossip.compression = "int8";
  EXPECT_NO_THROW(compressed_gossip.validate(4));
  expect_algo(clipped(cfg("local_dadam", 5, 0.7, 0.9, "complete")), "algo.clip_peers");  // no anchor
  auto overlapped = clipped(cfg("diloco"));  // relayed (issue 63; tests/test_relayed_mix.cpp)
  overlapped.overlap_steps = 1;
  EXPECT_NO_THROW(overlapped.validate(4));
  EXPECT_NO_THROW(clipped(cfg("gasloc")).validate(4));
  EXPECT_NO_THROW(clipped(cfg("diloco")).validate(4));
  EXPECT_NO_THROW(clipped(cfg("dadam")).validate(4));

  auto expect_job = [&](std::vector<std::string> o, const std::string& needle) {
    o.insert(o.begin(), "cluster.workers=4");
    try {
      test_util::nano_job(data_, o);
      ADD_FAILURE() << "expected ConfigError mentioning " << needle;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_job({"algo.name=gasloc", "faults.poison=[{ worker = 4, round = 1 }]"}, "faults.poison[0].worker");
  expect_job({"algo.name=gasloc", "faults.poison=[{ worker = 1, round = -1 }]"}, "faults.poison[0].round");
  expect_job({"algo.name=gasloc", "faults.poison=[{ worker = 1, round = 1, factor = 1.0 }]"}, "faults.poison[0].factor");
  expect_job({"algo.name=gasloc", "faults.poison=[{ worker = 1, round = 1, scale = 2.0 }]"}, "scale");
  expect_job({"algo.name=allreduce", "faults.poison=[{ worker = 1, round = 1 }]"}, "faults.poison[0]");
  // Issue 63: a clipped all-reduce runs in elastic rounds (tests/test_elastic.cpp).
  EXPECT_NO_THROW(test_util::nano_job(data_, {"cluster.workers=4", "algo.name=diloco", "algo.clip_peers=true",
                                              "cluster.elastic=true", "faults.kill=[{ id = 1, round = 2 }]"}));
  EXPECT_NO_THROW(test_util::nano_job(data_, {"cluster.workers=4", "algo.name=gasloc",
                                              "faults.poison=[{ worker = 1, round = 1, factor = -3.0 }]"}));
}

// Issue 44, item 6: one worker's message scaled by 100 at one round. Without clipping the run ends
// worse than the unigram baseline; with algo.clip_peers it ends within 3% of the fault-free run.
// In-process, 4 workers of the nano job, H = 5, 150 steps (30 rounds), the poison at round 10;
// gossip on 2peer and DiLoCo. Measured: gasloc 0.2509 fault-free, 0.2500 clipped (-0.4%);
// diloco 0.2633 and 0.2680 (+1.8%); both unclipped above 2e4 (unigram 3.29).
// Not shorter: at 60 steps the final loss is so sensitive to the weights' scale that one
// harmless message scaled by 1.1, unclipped, moves it by 8% (diloco), and the clipped poison
// (a bounded nudge along theta) moved it by -7% to +5% depending on the round; at 150 steps the
// clipped poison stayed within 2% at rounds 10 and 15 and with factor -100.
TEST_F(Algo, ClippingBoundsAPoisonedWorker) {
  const double unigram = data::Dataset::open(data_).unigram_val_loss;
  ASSERT_GT(unigram, 0.0);
  struct Result {
    double loss = 0;
    std::vector<int64_t> clipped;  // summed over the workers' last train lines
  };
  auto run_job = [&](const std::string& dir, std::vector<std::string> extra) {
    train::TrainRequest r;
    r.quiet = true;
    r.overrides = {"model.preset=nano", "data.dir=" + data_.string(), "data.seq_len=32", "data.batch_size=4",
                   "data.val_batches=8", "train.steps=150", "train.eval_every=150", "train.checkpoint_every=0",
                   "train.log_every=150", "optim.lr=0.003", "optim.warmup_steps=5", "train.threads=1",
                   "cluster.workers=4", "algo.H=5", "train.run_dir=" + (root_ / dir).string(),
                   // The unclipped poisoned run is to be measured, not stopped by the divergence guard.
                   "train.divergence_factor=0"};
    r.overrides.insert(r.overrides.end(), extra.begin(), extra.end());
    Result out;
    out.loss = train::run_training(r).final_val_loss;
    for (const auto& e : train::read_metrics(root_ / dir))
      if (const auto* t = std::get_if<train::TrainEvent>(&e); t && t->clipped_from && t->step == 150) {
        out.clipped.resize(t->clipped_from->size(), 0);
        for (size_t j = 0; j < t->clipped_from->size(); ++j) out.clipped[j] += (*t->clipped_from)[j];
      }
    return out;
  };
  const std::string poison = "faults.poison=[{ worker = 2, round = 10, factor = 100.0 }]";
  for (const std::vector<std::string> algo : {std::vector<std::string>{"algo.name=gasloc", "algo.topology=2peer"},
                                              std::vector<std::string>{"algo.name=diloco"}}) {
    SCOPED_TRACE(algo[0]);
    auto with = [&](std::vector<std::string> more) {
      more.insert(more.begin(), algo.begin(), algo.end());
      return more;
    };
    const std::string tag = algo[0].substr(10);
    const Result clean = run_job(tag + "_clean", with({}));
    const Result poisoned = run_job(tag + "_poisoned", with({poison}));
    const Result clipped = run_job(tag + "_clipped", with({poison, "algo.clip_peers=true"}));
    std::printf("%s: unigram %.4f, fault-free %.4f, poisoned %.4f, poisoned and clipped %.4f (%+.2f%%)\n", tag.c_str(),
                unigram, clean.loss, poisoned.loss, clipped.loss, 100 * (clipped.loss / clean.loss - 1));
    EXPECT_LT(clean.loss, unigram);  // the run learned something the poison can take away
    EXPECT_GT(poisoned.loss, unigram);
    EXPECT_LT(std::abs(clipped.loss / clean.loss - 1), 0.03);
    EXPECT_TRUE(clean.clipped.empty() && poisoned.clipped.empty());  // no clip_peers, no field
    ASSERT_EQ(clipped.clipped.size(), 4u);
    EXPECT_GE(clipped.clipped[2], 1);  // the poisoned message was clipped, and counted against its sender
    // ... and no honest one here (measured: none in either run), so the threshold did not slow the others.
    EXPECT_EQ(clipped.clipped[0] + clipped.clipped[1] + clipped.clipped[3], 0);
  }
}

// Issue 62, item 5, end to end: worker 2's message made infinite (faults.poison factor 1e300)
// stops the run without clipping, saying so; with algo.clip_peers the run goes on, the message
// dropped and counted against worker 2 in the train lines. A finite poison large enough to make
// its receivers diverge is named in the divergence (it blamed optim.lr).
TEST_F(Algo, PoisonedMessagesAreDroppedOrNamedNotBlamedOnTheStepSize) {
  auto request = [&](const std::string& dir, std::vector<std::string> extra) {
    train::TrainRequest r;
    r.quiet = true;
    r.overrides = {"model.preset=nano", "data.dir=" + data_.string(), "data.seq_len=32", "data.batch_size=4",
                   "data.val_batches=2", "train.steps=20", "train.eval_every=20", "train.checkpoint_every=0",
                   "train.log_every=20", "optim.lr=0.003", "optim.warmup_steps=5", "train.threads=1",
                   "cluster.workers=4", "algo.name=gasloc", "algo.topology=2peer", "algo.H=5",
                   "train.run_dir=" + (root_ / dir).string()};
    r.overrides.insert(r.overrides.end(), extra.begin(), extra.end());
    return r;
  };
  const std::string inf = "faults.poison=[{ worker = 2, round = 1, factor = 1e300 }]";
  try {
    train::run_training(request("nonfinite_stops", {inf}));
    ADD_FAILURE() << "an infinite message was mixed";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("worker 2 sent non-finite values"), std::string::npos) << e.what();
    EXPECT_NE(e.hint().find("algo.clip_peers"), std::string::npos) << e.hint();
  }
  const auto clipped = train::run_training(request("nonfinite_dropped", {inf, "algo.clip_peers=true"}));
  EXPECT_EQ(clipped.steps_done, 20);
  EXPECT_TRUE(std::isfinite(clipped.final_val_loss));
  std::vector<int64_t> dropped(4, 0);
  for (const auto& e : train::read_metrics(root_ / "nonfinite_dropped"))
    if (const auto* t = std::get_if<train::TrainEvent>(&e); t && t->step == 20) {
      ASSERT_TRUE(t->dropped_from.has_value());
      for (size_t j = 0; j < 4; ++j) dropped[j] += (*t->dropped_from)[j];
    }
  EXPECT_EQ(dropped, (std::vector<int64_t>{0, 0, 2, 0}));  // worker 2's two neighbours dropped its round-1 message

  try {
    train::run_training(request("poison_diverges", {"faults.poison=[{ worker = 2, round = 1, factor = 1e4 }]"}));
    ADD_FAILURE() << "a run whose worker 2 sent its parameters times 1e4 did not diverge";
  } catch (const train::TrainingDiverged& e) {
    EXPECT_NE(std::string(e.what()).find("message from worker 2 was scaled by 10000 (faults.poison)"), std::string::npos)
        << e.what();
    EXPECT_NE(e.hint().find("worker 2 sent it"), std::string::npos) << e.hint();
    EXPECT_EQ(e.hint().find("optim.lr"), std::string::npos) << e.hint();
  }
}

// The clipper's window and counts are in the checkpoint: a clipped, poisoned run stopped
// mid-round resumes bit for bit (gossip, whose window carries over rounds).
TEST_F(Algo, ClippedRunResumesBitExactly) {
  auto request = [&](const std::string& dir, std::vector<std::string> extra) {
    train::TrainRequest r;
    r.quiet = true;
    r.overrides = {"model.preset=nano", "data.dir=" + data_.string(), "data.seq_len=32", "data.batch_size=4",
                   "data.val_batches=2", "train.steps=40", "train.eval_every=20", "train.checkpoint_every=0",
                   "train.log_every=10", "optim.lr=0.003", "optim.warmup_steps=5", "train.threads=1",
                   "cluster.workers=2", "algo.name=gasloc", "algo.topology=1peer", "algo.H=5", "algo.clip_peers=true",
                   "faults.poison=[{ worker = 1, round = 4, factor = 100.0 }]", "train.run_dir=" + (root_ / dir).string()};
    r.overrides.insert(r.overrides.end(), extra.begin(), extra.end());
    return r;
  };
  const auto full = train::run_training(request("clip_full", {}));
  train::run_training(request("clip_halves", {"train.stop_at=17"}));
  train::TrainRequest again;
  again.quiet = true;
  again.resume_dir = (root_ / "clip_halves").string();
  const auto second = train::run_training(again);
  ASSERT_EQ(second.train_losses.size(), 23u);
  for (size_t i = 0; i < 23; ++i) EXPECT_EQ(second.train_losses[i], full.train_losses[17 + i]) << "step " << 18 + i;
  EXPECT_EQ(second.final_val_loss, full.final_val_loss);
  int64_t clipped = 0;
  for (int r = 0; r < 2; ++r) {
    const train::RunCheckpoints ca(root_ / "clip_full", 2), cb(root_ / "clip_halves", 2);
    auto a = train::load_checkpoint(ca.file(ca.committed(r).at(0), r));
    auto b = train::load_checkpoint(cb.file(cb.committed(r).at(0), r));
    ASSERT_EQ(a.tensors.count("sync.clip_window"), 1u);
    clipped += a.tensors.at("sync.clip_counts")[1].item<int64_t>();
    for (const auto& [k, t] : a.tensors)
      if (k != "rng.cpu") EXPECT_TRUE(torch::equal(t, b.tensors.at(k))) << k << " rank " << r;
  }
  EXPECT_GE(clipped, 1);  // worker 0 clipped its partner's poisoned round
}
