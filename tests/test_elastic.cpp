// Elastic membership on the in-process cluster (docs/design.md section 10): views as a pure
// function of the fault schedule, failed gossip edges moving W_ij onto W_ii, an all-reduce round
// retried over the survivors, a joiner healed bit for bit from its donor, and whole elastic runs
// pinned to the fixed-membership runs they must reduce to. Equalities are exact (bitwise) unless
// a tolerance is stated.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <tuple>

#include "gasloc/algo/algo_config.hpp"
#include "gasloc/algo/mix/make_mix.hpp"
#include "gasloc/algo/peer_clip.hpp"
#include "gasloc/algo/membership.hpp"
#include "gasloc/comm/inproc.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/data/dataset.hpp"
#include "gasloc/study/run_summary.hpp"
#include "gasloc/train/checkpoint.hpp"
#include "gasloc/train/metrics.hpp"
#include "gasloc/train/worker.hpp"
#include "test_util.hpp"

using namespace gasloc;

namespace {

constexpr double kHeartbeat = 7.0;

// --- Views ------------------------------------------------------------------------------------

TEST(Membership, ViewsFollowTheSchedule) {
  const algo::Membership m(4, {{.id = 1, .round = 2, .restart_after_rounds = 2}});
  EXPECT_EQ(m.view(1).members, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_TRUE(m.view(1).dying.empty());
  EXPECT_EQ(m.view(2).members, (std::vector<int>{0, 1, 2, 3}));  // it dies at round 2's merge: still in V_2
  EXPECT_EQ(m.view(2).dying, (std::vector<int>{1}));
  EXPECT_EQ(m.view(2).survivors(), (std::vector<int>{0, 2, 3}));
  EXPECT_EQ(m.view(3).members, (std::vector<int>{0, 2, 3}));
  EXPECT_EQ(m.view(4).members, (std::vector<int>{0, 2, 3}));
  EXPECT_EQ(m.view(4).joining, (std::vector<int>{1}));
  EXPECT_EQ(m.view(4).donor(1), 0);  // the nearest survivor below it
  EXPECT_EQ(m.view(5).members, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_TRUE(m.computes(1, 2));   // computes its last round's local steps
  EXPECT_FALSE(m.computes(1, 3));  // dead
  EXPECT_FALSE(m.computes(1, 4));  // joining: its state comes from the donor
  EXPECT_TRUE(m.computes(1, 5));
}

TEST(Membership, DonorsSpreadOverSurvivors) {
  algo::View v;
  v.members = {0, 2, 5};
  v.joining = {1, 3, 6};
  EXPECT_EQ(v.donor(1), 0);
  EXPECT_EQ(v.donor(3), 2);
  EXPECT_EQ(v.donor(6), 5);
  v.members = {4, 5};
  v.joining = {0};
  EXPECT_EQ(v.donor(0), 5);  // cyclically: no survivor below 0
}

// Ids that arrive at round 3 (a run resumed on more workers): out before, joining at 3 (healed
// from the nearest survivor below them), members after; a kill scheduled before the arrival is
// dropped, one after it counts.
TEST(Membership, ArrivalsJoinAtTheirRound) {
  const algo::Membership m(6, {{.id = 4, .round = 1}, {.id = 5, .round = 5}}, {}, 0, std::nullopt, {{4, 3}, {5, 3}});
  EXPECT_FALSE(m.trivial());
  EXPECT_EQ(m.view(2).members, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_TRUE(m.view(2).joining.empty());
  EXPECT_EQ(m.view(3).members, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(m.view(3).joining, (std::vector<int>{4, 5}));
  EXPECT_EQ(m.view(3).donor(4), 3);
  EXPECT_EQ(m.view(3).donor(5), 3);
  EXPECT_EQ(m.view(4).members, (std::vector<int>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(m.view(5).dying, (std::vector<int>{5}));
  EXPECT_FALSE(m.computes(4, 2));
  EXPECT_FALSE(m.computes(4, 3));
  EXPECT_TRUE(m.computes(4, 4));
  EXPECT_EQ(m.events().size(), 1u);
  EXPECT_TRUE(algo::Membership(4, {}).trivial());
}

void expect_config_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected a ConfigError mentioning '" << needle << "'";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Membership, ImpossibleSchedulesAreRefused) {
  expect_config_error([] { algo::Membership(4, {{.id = 4, .round = 1}}); }, "faults.kill[0].id is 4");
  expect_config_error([] { algo::Membership(4, {{.id = 0, .round = -1}}); }, "faults.kill[0].round");
  expect_config_error([] { algo::Membership(4, {{.id = 2, .round = 1, .restart_after_rounds = 3}, {.id = 2, .round = 3}}); },
                      "while it is dead or rejoining");
  expect_config_error([] { algo::Membership(2, {{.id = 0, .round = 1}, {.id = 1, .round = 1}}); }, "no worker alive");
  expect_config_error([] { algo::Membership(4, {}, {}, 0, std::nullopt, {{4, 1}}); }, "worker 4 cannot arrive");
  expect_config_error([] { algo::Membership(4, {}, {}, 0, algo::RestartAll{}, {{3, 1}}); }, "cannot add workers");
}

TEST(Membership, ChurnIsAPureFunctionOfItsSeed) {
  const algo::Churn a{.mean_rounds = 4, .restart_after_rounds = 2, .seed = 11};
  const auto first = algo::draw_churn(8, a, 200), again = algo::draw_churn(8, a, 200);
  EXPECT_EQ(first, again);
  auto b = a;
  b.seed = 12;
  EXPECT_NE(first, algo::draw_churn(8, b, 200));
  // About one failure per mean + restart + 1 rounds per worker: 8 * 200 / 7 = 229 (a loose band).
  EXPECT_GT(first.size(), 150u);
  EXPECT_LT(first.size(), 320u);
  for (const auto& e : first) EXPECT_LT(e.round, 200);
}

// --- Rounds over a view, with frozen parameters -------------------------------------------------

// x_i = (i + 1) * [1, 2, 3, 4] on rank i.
torch::Tensor value_of(int rank) { return torch::arange(1, 5, torch::kFloat) * static_cast<float>(rank + 1); }

// Runs round `round` of `mixer` on every rank of an elastic cluster and returns each rank's
// result (undefined for those that do not mix) and clock.
struct Mixed {
  std::vector<torch::Tensor> out;
  std::vector<double> clock;
};
Mixed mix_round(int n, const algo::MixOptions& options, int64_t round) {
  comm::NetworkModel net;
  comm::InProcCluster cluster(n, net, 30.0, kHeartbeat);
  Mixed m;
  m.out.resize(n);
  cluster.run([&](int r, comm::Communicator& c) {
    const auto mixer = algo::make_mix(options);  // one per worker
    if (mixer->mixes(r, round)) m.out[r] = mixer->mix({.t = round, .x = value_of(r)}, c);
    else mixer->stand_by(round, c);
  });
  for (int r = 0; r < n; ++r) m.clock.push_back(cluster.clock(r));
  return m;
}

TEST(ElasticMix, AFailedEdgeMovesItsWeightOntoTheSelfWeight) {
  const int n = 4;
  const algo::Membership m(n, {{.id = 1, .round = 0}});
  const topology::Topology topo(topology::Kind::one_peer, n, 5);
  const algo::MixOptions mixer{.topology = topo, .membership = &m};
  const auto res = mix_round(n, mixer, 0);
  const int partner = topo.peers(1, 0).at(0);
  EXPECT_FALSE(res.out[1].defined());
  // W_{p,1} = 1/2 moved onto W_pp: the partner keeps its own parameters exactly.
  EXPECT_TRUE(torch::equal(res.out[partner], value_of(partner)));
  // The partner waits for the death's detection: rank 1's clock (0) plus the heartbeat timeout.
  EXPECT_DOUBLE_EQ(res.clock[partner], kHeartbeat);
  EXPECT_DOUBLE_EQ(res.clock[1], 0.0);  // a dead worker's clock stops
  for (int r = 0; r < n; ++r) {
    if (r == 1 || r == partner) continue;
    const int q = topo.peers(r, 0).at(0);
    EXPECT_TRUE(torch::equal(res.out[r], value_of(r) * 0.5 + value_of(q) * 0.5)) << "rank " << r;
    EXPECT_LT(res.clock[r], 1.0) << "a pair unaffected by the death does not wait for it";
  }
}

// Over the three survivors the random matching leaves one of them alone; the others average in
// pairs: W is symmetric and doubly stochastic over the view, and the sum is conserved.
TEST(ElasticMix, TheNextRoundMixesOverTheSurvivorsOnly) {
  const int n = 4;
  const algo::Membership m(n, {{.id = 1, .round = 0}});
  const algo::MixOptions mixer{.topology = topology::Topology(topology::Kind::one_peer, n, 5), .membership = &m};
  const auto graph = [&](int id, int64_t t) { return algo::round_graph(mixer.topology, m.view(t).members, id, t); };
  const auto res = mix_round(n, mixer, 1);
  EXPECT_FALSE(res.out[1].defined());
  int alone = 0;
  torch::Tensor sum = torch::zeros({4});
  for (int r : {0, 2, 3}) {
    sum += res.out[r];
    const auto g = graph(r, 1);
    ASSERT_LE(g.peers.size(), 1u);
    if (g.peers.empty()) {
      ++alone;
      EXPECT_TRUE(torch::equal(res.out[r], value_of(r)));
    } else {
      const int q = g.peers[0];
      EXPECT_NE(q, 1);
      EXPECT_EQ(graph(q, 1).peers, std::vector<int>{r});  // symmetric
      EXPECT_TRUE(torch::allclose(res.out[r], (value_of(r) + value_of(q)) * 0.5, 0, 1e-6));
    }
  }
  EXPECT_EQ(alone, 1);
  EXPECT_TRUE(torch::allclose(sum, value_of(0) + value_of(2) + value_of(3), 0, 1e-5));
}

TEST(ElasticMix, AnAllReduceRoundWithADeathIsRetriedOverTheSurvivors) {
  const int n = 4;
  const algo::Membership m(n, {{.id = 2, .round = 0}});
  const algo::MixOptions mixer{.topology = topology::Topology(topology::Kind::complete, n, 0), .membership = &m};
  const auto res = mix_round(n, mixer, 0);
  // The mean over the survivors, summed in id order: bit for bit.
  auto expected = value_of(0).clone();
  expected.add_(value_of(1)).add_(value_of(3)).div_(3);
  comm::NetworkModel net;
  const double P = 4 * 4;
  const double retry = comm::ring_allreduce_seconds(P, 3, net.bandwidth_Bps, net.latency_s);
  for (int r : {0, 1, 3}) {
    EXPECT_TRUE(torch::equal(res.out[r], expected)) << "rank " << r;
    // Aborted at the detection (rank 2's clock 0 + heartbeat), then the retry over three.
    EXPECT_DOUBLE_EQ(res.clock[r], kHeartbeat + retry) << "rank " << r;
  }
}

// Issue 63: a clipped all-reduce in an elastic round. Worker 2 dies at round 0's exchange: the
// attempt over the view is aborted by the members' vote and retried over the survivors, each of
// which clips worker 3's poisoned message (x 50) to 2 x the lower median of the three norms and
// ends with the same bits.
TEST(ElasticMix, AClippedAllReduceIsRetriedOverTheSurvivors) {
  const int n = 4;
  const algo::Membership m(n, {{.id = 2, .round = 0}});
  const algo::MixOptions options{.topology = topology::Topology(topology::Kind::complete, n, 0),
                                 .membership = &m,
                                 .clip = 2.0,
                                 .poisons = {{.worker = 3, .round = 0, .factor = 50.0}}};
  const torch::Tensor anchor = torch::zeros({4});
  comm::NetworkModel net;
  comm::InProcCluster cluster(n, net, 30.0, kHeartbeat);
  std::vector<torch::Tensor> out(n);
  std::vector<std::vector<int64_t>> clipped(n);
  cluster.run([&](int r, comm::Communicator& c) {
    const auto mixer = algo::make_mix(options);
    if (mixer->mixes(r, 0)) out[r] = mixer->mix({.t = 0, .x = value_of(r), .anchor = anchor}, c);
    else mixer->stand_by(0, c);
    clipped[r] = mixer->stats().clipped_from.value_or(std::vector<int64_t>{});
  });
  const torch::Tensor g0 = anchor - value_of(0), g1 = anchor - value_of(1), g3 = anchor - value_of(3) * 50.0;
  const double threshold = 2.0 * algo::lower_median({algo::l2_norm(g0), algo::l2_norm(g1), algo::l2_norm(g3)});
  const torch::Tensor expected = anchor - g0.clone().add_(g1).add_(algo::clip_to(g3, algo::l2_norm(g3), threshold)) / 3.0;
  EXPECT_FALSE(out[2].defined());
  for (int r : {0, 1}) {
    EXPECT_TRUE(torch::equal(out[r], expected)) << "rank " << r << ": " << out[r] << " vs " << expected;
    EXPECT_EQ(clipped[r], (std::vector<int64_t>{0, 0, 0, 1})) << "rank " << r;
  }
  EXPECT_TRUE(out[3].defined());  // its own term is unpoisoned: its mean is its own
}

// A membership whose only fault lies beyond the rounds run: every view is the whole world, so
// the elastic paths (member all-reduce, view graphs) must give the fixed world's bits.
TEST(ElasticMix, AWholeViewGivesTheFixedWorldsBits) {
  const int n = 4;
  const algo::Membership late(n, {{.id = 0, .round = 1000}});
  for (auto kind : {topology::Kind::one_peer, topology::Kind::two_peer, topology::Kind::complete}) {
    const topology::Topology topo(kind, n, 9);
    const auto elastic = mix_round(n, {.topology = topo, .membership = &late}, 3);
    const auto fixed = mix_round(n, {.topology = topo}, 3);
    for (int r = 0; r < n; ++r) {
      EXPECT_TRUE(torch::equal(elastic.out[r], fixed.out[r])) << topology::to_string(kind) << " rank " << r;
      EXPECT_EQ(elastic.clock[r], fixed.clock[r]);
    }
  }
}

// --- Whole runs ---------------------------------------------------------------------------------

class ElasticRun : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = test_util::temp_root("test_elastic");
    data_ = test_util::make_byte_dataset(root_);
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(root_); }

  struct Result {
    std::vector<std::unique_ptr<train::Worker>> workers;
    std::vector<double> clock;
  };
  // n workers of the nano job for `steps` steps; with `faults`, an elastic cluster under them.
  // `after(step, workers)` runs after every step of every worker (on rank 0's thread, at a barrier).
  static Result run(int n, const std::vector<std::string>& settings, int64_t steps,
                    const std::optional<std::vector<algo::FaultEvent>>& faults,
                    const std::function<void(int64_t, std::vector<std::unique_ptr<train::Worker>>&)>& after = {},
                    std::optional<algo::RestartAll> restart = std::nullopt) {
    auto with_world = settings;
    with_world.push_back("cluster.workers=" + std::to_string(n));
    const auto job = test_util::nano_job(data_, with_world);
    const auto ds = data::Dataset::open(job.data.dir);
    const auto mc = job.model.resolve(ds.vocab_size);
    std::optional<algo::Membership> membership;
    if (faults) membership.emplace(n, *faults, algo::Churn{}, 0, restart);
    comm::InProcCluster cluster(n, job.network.model(n), 60.0, faults ? kHeartbeat : -1.0);
    Result res;
    for (int r = 0; r < n; ++r)
      res.workers.push_back(std::make_unique<train::Worker>(
          job, mc, ds, cluster.comm(r),
          algo::make_synchronizer(job.algo, n, job.train.seed, nullptr, membership ? &*membership : nullptr)));
    cluster.run([&](int r, comm::Communicator&) {
      for (int64_t s = 1; s <= steps; ++s) {
        res.workers[r]->step();
        if (!after) continue;
        cluster.control(r).barrier();
        if (r == 0) after(s, res.workers);
        cluster.control(r).barrier();
      }
    });
    for (int r = 0; r < n; ++r) res.clock.push_back(cluster.clock(r));
    return res;
  }
  static std::vector<std::string> algo(const std::string& name, const std::string& topo = "1peer") {
    return {"algo.name=" + name, "algo.H=3", "algo.topology=" + topo, "train.steps=12"};
  }

  static inline std::filesystem::path root_, data_;
};

// Elastic mode without faults in the rounds run gives today's bits, for every algorithm.
TEST_F(ElasticRun, WithoutFaultsItGivesTheFixedWorldsBits) {
  for (const auto& [name, topo] : std::vector<std::pair<std::string, std::string>>{
           {"diloco", "1peer"}, {"gasloc", "1peer"}, {"gasloc", "2peer"}, {"gasloc", "complete"}, {"local_dadam", "2peer"},
           {"dadam", "1peer"}, {"allreduce", "1peer"}}) {
    const auto elastic = run(4, algo(name, topo), 9, std::vector<algo::FaultEvent>{{.id = 3, .round = 1000}});
    const auto fixed = run(4, algo(name, topo), 9, std::nullopt);
    for (int r = 0; r < 4; ++r) {
      EXPECT_TRUE(torch::equal(elastic.workers[r]->params().data(), fixed.workers[r]->params().data())) << name << "/" << topo;
      EXPECT_EQ(elastic.clock[r], fixed.clock[r]) << name << "/" << topo;
    }
  }
}

// Worker 3 dies at round 0's merge and never returns: DiLoCo's retried round is the mean over
// workers 0..2, and every later round too, so the survivors follow a 3-worker DiLoCo bit for bit
// (their data streams are keyed by id, which a 3-worker run shares).
TEST_F(ElasticRun, DiLoCoRetriedEqualsDiLoCoOverTheSurvivors) {
  const auto elastic = run(4, algo("diloco"), 9, std::vector<algo::FaultEvent>{{.id = 3, .round = 0}});
  const auto three = run(3, algo("diloco"), 9, std::nullopt);
  for (int r = 0; r < 3; ++r)
    EXPECT_TRUE(torch::equal(elastic.workers[r]->params().data(), three.workers[r]->params().data())) << "worker " << r;
}

// The same for All-Reduce AdamW, whose every step is a round: from the first step on, the
// gradients are averaged over workers 0..2 only.
TEST_F(ElasticRun, AllReduceRetriedEqualsAllReduceOverTheSurvivors) {
  const auto elastic = run(4, algo("allreduce"), 5, std::vector<algo::FaultEvent>{{.id = 3, .round = 0}});
  const auto three = run(3, algo("allreduce"), 5, std::nullopt);
  for (int r = 0; r < 3; ++r)
    EXPECT_TRUE(torch::equal(elastic.workers[r]->params().data(), three.workers[r]->params().data())) << "worker " << r;
}

// Compressed all-reduces in elastic rounds (algo.compression with diloco or the complete graph).
std::vector<std::string> compressed(const std::string& name, const std::string& topo, const std::string& codec) {
  return {"algo.name=" + name, "algo.H=3", "algo.topology=" + topo, "train.steps=12", "algo.compression=" + codec};
}

// Without faults in the rounds run, elastic mode gives the fixed world's bits (the clocks differ
// by the members' agreement on each attempt, a one-value all-reduce).
TEST_F(ElasticRun, CompressedWithoutFaultsGivesTheFixedWorldsBits) {
  for (const auto& [name, topo, codec, gossip] : std::vector<std::tuple<std::string, std::string, std::string, std::string>>{
           {"diloco", "1peer", "int8", "delta"}, {"diloco", "1peer", "int4", "delta"}, {"diloco", "1peer", "topk", "delta"},
           {"gasloc", "complete", "int8", "delta"}, {"gasloc", "2peer", "int8", "direct"}, {"gasloc", "1peer", "int8", "direct"},
           {"gasloc", "2peer", "int8", "modulo"}, {"gasloc", "1peer", "int4", "modulo"}, {"gasloc", "2peer", "int8", "delta"},
           {"gasloc", "1peer", "int4", "delta"}, {"local_dadam", "2peer", "int8", "modulo"}, {"dadam", "1peer", "int8", "delta"}}) {
    auto settings = compressed(name, topo, codec);
    settings.push_back("algo.gossip_codec=" + gossip);
    const auto elastic = run(4, settings, 9, std::vector<algo::FaultEvent>{{.id = 3, .round = 1000}});
    const auto fixed = run(4, settings, 9, std::nullopt);
    for (int r = 0; r < 4; ++r)
      EXPECT_TRUE(torch::equal(elastic.workers[r]->params().data(), fixed.workers[r]->params().data()))
          << name << " " << topo << " " << codec << " " << gossip;
  }
}

// Worker 3 dies at round 0's merge: the aborted attempt over four leaves no trace (int4's error
// feedback, on by default, is put back), and the survivors follow a 3-worker compressed DiLoCo bit for bit.
TEST_F(ElasticRun, CompressedDiLoCoRetriedEqualsItOverTheSurvivors) {
  for (const std::string codec : {"int8", "int4", "topk"}) {
    const auto elastic = run(4, compressed("diloco", "1peer", codec), 9, std::vector<algo::FaultEvent>{{.id = 3, .round = 0}});
    const auto three = run(3, compressed("diloco", "1peer", codec), 9, std::nullopt);
    for (int r = 0; r < 3; ++r)
      EXPECT_TRUE(torch::equal(elastic.workers[r]->params().data(), three.workers[r]->params().data())) << codec << " worker " << r;
  }
}

// Through a death and a rejoin, every member ends each round with the same theta, bit for bit
// (the owners' requantized bytes), the joiner included; the joiner's error feedback starts at zero.
TEST_F(ElasticRun, CompressedAllReduceKeepsEveryMemberIdenticalThroughDeathAndRejoin) {
  const std::vector<algo::FaultEvent> faults = {{.id = 1, .round = 1, .restart_after_rounds = 1}};
  const algo::Membership m(4, faults);
  const int donor = m.view(2).donor(1);
  bool healed_checked = false;
  const auto res = run(4, compressed("diloco", "1peer", "int4"), 12, faults, [&](int64_t step, auto& w) {
    if (step == 6) {  // round 1 ended: worker 1 died there and is out
      for (int r : {2, 3}) EXPECT_TRUE(torch::equal(w[r]->params().data(), w[0]->params().data())) << "step 6, worker " << r;
    }
    if (step == 9) {  // round 2 ended: worker 1 rejoined from its donor
      const auto joiner = w[1]->state(), from = w[donor]->state();
      ASSERT_TRUE(from.count("sync.compression_feedback"));
      EXPECT_FALSE(joiner.count("sync.compression_feedback")) << "a joiner's error feedback starts at zero";
      EXPECT_TRUE(torch::equal(joiner.at("params"), from.at("params")));
      healed_checked = true;
    }
  });
  EXPECT_TRUE(healed_checked);
  for (int r = 1; r < 4; ++r)
    EXPECT_TRUE(torch::equal(res.workers[r]->params().data(), res.workers[0]->params().data())) << "worker " << r;
}

// Direct int8 gossip (the one gossip codec without state shared between pairs) through a death
// and a rejoin: the partners drop the failed edge, the joiner holds its donor's model after its
// join round and trains on; every worker ends finite.
TEST_F(ElasticRun, DirectCompressedGossipRunsThroughDeathAndRejoin) {
  const std::vector<algo::FaultEvent> faults = {{.id = 2, .round = 0, .restart_after_rounds = 1}};
  const algo::Membership m(4, faults);
  const int donor = m.view(1).donor(2);
  auto settings = compressed("gasloc", "2peer", "int8");
  settings.push_back("algo.gossip_codec=direct");
  bool checked = false;
  const auto res = run(4, settings, 12, faults, [&](int64_t step, auto& w) {
    if (step != 6) return;  // round 1 ended: worker 2 joined there
    EXPECT_TRUE(torch::equal(w[2]->params().data(), w[donor]->params().data()));
    checked = true;
  });
  EXPECT_TRUE(checked);
  for (int r = 0; r < 4; ++r) EXPECT_TRUE(torch::isfinite(res.workers[r]->params().data()).all().item<bool>()) << r;
}

// The modulo codec through deaths (worker 3 at round 0, in the fp32 first round; worker 2 at round
// 1, in a coded one) and worker 2's rejoin at round 2: the partners drop the failed edges, the
// joiner holds its donor's model, and in its first round (3) it has no gaps, so its pairs resend
// every chunk in fp32 (counted as resends) instead of trusting a grid.
TEST_F(ElasticRun, ModuloCompressedGossipRunsThroughDeathsAndARejoin) {
  const std::vector<algo::FaultEvent> faults = {{.id = 3, .round = 0}, {.id = 2, .round = 1, .restart_after_rounds = 1}};
  const algo::Membership m(4, faults);
  const int donor = m.view(2).donor(2);
  for (const std::string codec : {"int8", "int4"}) {
    auto settings = compressed("gasloc", "2peer", codec);
    settings.push_back("algo.gossip_codec=modulo");
    bool joined = false, resent = false;
    const auto res = run(4, settings, 12, faults, [&](int64_t step, auto& w) {
      if (step == 9) {  // round 2 ended: worker 2 joined there
        EXPECT_TRUE(torch::equal(w[2]->params().data(), w[donor]->params().data())) << codec;
        EXPECT_EQ(w[2]->state().count("sync.compression_gaps"), 0u) << codec << ": a joiner takes no grid";
        joined = true;
      }
      if (step == 12) {  // round 3 ended: the joiner's first coded round
        resent = w[2]->state().at("sync.compression_resends").template item<int64_t>() > 0;
        EXPECT_EQ(w[2]->state().at("sync.compression_gaps").numel(), w[0]->state().at("sync.compression_gaps").numel());
      }
    });
    EXPECT_TRUE(joined) << codec;
    EXPECT_TRUE(resent) << codec << ": the joiner's pairs did not resend its chunks in fp32";
    for (int r : {0, 1, 2}) EXPECT_TRUE(torch::isfinite(res.workers[r]->params().data()).all().item<bool>()) << codec << " " << r;
  }
}

// The delta codec through a death in a reference refresh (worker 3 at round 0: the refresh over
// four aborts and is retried over three) and a rejoin (worker 2 at round 2, K = 2 so round 2
// refreshes): every member holds the same reference bit for bit after each round, the joiner
// included (it takes its donor's), and its error feedback is its own.
TEST_F(ElasticRun, DeltaCompressedGossipKeepsOneReferenceThroughDeathAndRejoin) {
  const std::vector<algo::FaultEvent> faults = {{.id = 3, .round = 0}, {.id = 2, .round = 1, .restart_after_rounds = 1}};
  auto settings = compressed("gasloc", "2peer", "int8");
  settings.push_back("algo.gossip_codec=delta");
  settings.push_back("algo.reference_every=2");
  const algo::Membership m(4, faults);
  int checked = 0;
  run(4, settings, 12, faults, [&](int64_t step, auto& w) {
    if (step % 3 != 0) return;
    const auto holders = m.view(step / 3 - 1).survivors();
    const auto ref = w[holders.at(0)]->state().at("sync.compression_reference");
    for (int r : holders)
      EXPECT_TRUE(torch::equal(w[r]->state().at("sync.compression_reference"), ref)) << "step " << step << ", worker " << r;
    if (step == 9) {  // round 2 ended: worker 2 joined with its donor's reference, not its feedback
      EXPECT_TRUE(torch::equal(w[2]->state().at("sync.compression_reference"), ref));
      EXPECT_EQ(w[2]->state().count("sync.compression_feedback"), 0u);
    }
    ++checked;
  });
  EXPECT_EQ(checked, 4);
}

// Local-DAdam (modulo) and DAdam (delta; every step a round) through a death and a rejoin: the
// joiner holds its donor's model and, for delta, its reference after its join round's merge, and
// every worker ends finite. Local-DAdam: worker 2 dies at round 0, rejoins at round 1 (ends at
// step 6); DAdam: dies at round 2, rejoins at round 4 (its mix comes before the step: checked
// at the merge of round 4, before step 5's AdamW step, through the state's reference).
TEST_F(ElasticRun, CompressedLocalDAdamAndDAdamRunThroughDeathAndRejoin) {
  {
    const std::vector<algo::FaultEvent> faults = {{.id = 2, .round = 0, .restart_after_rounds = 1}};
    const int donor = algo::Membership(4, faults).view(1).donor(2);
    auto settings = compressed("local_dadam", "2peer", "int8");
    settings.push_back("algo.gossip_codec=modulo");
    bool checked = false;
    const auto res = run(4, settings, 12, faults, [&](int64_t step, auto& w) {
      if (step != 6) return;
      EXPECT_TRUE(torch::equal(w[2]->params().data(), w[donor]->params().data()));
      checked = true;
    });
    EXPECT_TRUE(checked);
    for (int r = 0; r < 4; ++r) EXPECT_TRUE(torch::isfinite(res.workers[r]->params().data()).all().item<bool>()) << r;
  }
  {
    const std::vector<algo::FaultEvent> faults = {{.id = 2, .round = 2, .restart_after_rounds = 2}};
    const int donor = algo::Membership(4, faults).view(4).donor(2);
    auto settings = compressed("dadam", "1peer", "int8");
    settings.push_back("algo.gossip_codec=delta");
    settings.push_back("algo.reference_every=2");
    bool checked = false;
    const auto res = run(4, settings, 8, faults, [&](int64_t step, auto& w) {
      if (step != 5) return;  // round 4 (step 5's mix) was the join
      EXPECT_TRUE(torch::equal(w[2]->state().at("sync.compression_reference"), w[donor]->state().at("sync.compression_reference")));
      checked = true;
    });
    EXPECT_TRUE(checked);
    for (int r = 0; r < 4; ++r) EXPECT_TRUE(torch::isfinite(res.workers[r]->params().data()).all().item<bool>()) << r;
  }
}

// A joiner holds its donor's whole state after the merge of its join round, bit for bit, but for
// its own random generator; and it trains on from there. Round 1 ends at step 6 for GASLoC (H = 3)
// and at step 2 for the algorithms whose every step is a round.
TEST_F(ElasticRun, AHealedJoinerHoldsItsDonorsState) {
  const std::vector<algo::FaultEvent> faults = {{.id = 2, .round = 0, .restart_after_rounds = 1}};
  const algo::Membership m(4, faults);
  const int donor = m.view(1).donor(2);
  for (const auto& [name, join_step] : std::vector<std::pair<std::string, int64_t>>{{"gasloc", 6}, {"dadam", 2}, {"allreduce", 2}}) {
    bool checked = false;
    run(4, algo(name), join_step + 3, faults, [&](int64_t step, auto& w) {
      if (step != join_step) return;
      auto joiner = w[2]->state(), from = w[donor]->state();
      ASSERT_EQ(joiner.size(), from.size());
      for (const auto& [k, t] : from) {
        if (k == "rng.cpu") continue;
        EXPECT_TRUE(torch::equal(joiner.at(k), t)) << name << ": " << k;
      }
      checked = true;
    });
    EXPECT_TRUE(checked) << name;
  }
}

// A death in an all-reduce round costs the survivors, on their clocks, the wait for its detection
// and the retry over three: 3 steps, then worker 1's clock plus the heartbeat timeout, then a
// ring all-reduce over 3 (to 1e-9 s: sums of doubles).
TEST_F(ElasticRun, ADeathCostsTheSurvivorsTheDetectionAndTheRetry) {
  const auto elastic = run(4, algo("diloco"), 3, std::vector<algo::FaultEvent>{{.id = 1, .round = 0}});
  const comm::NetworkModel net = test_util::nano_job(data_).network.model(4);
  const double P = static_cast<double>(elastic.workers[0]->numel() * 4);
  const double died = 3 * net.step_time_s;
  const double expected = died + kHeartbeat + comm::ring_allreduce_seconds(P, 3, net.bandwidth_Bps, net.latency_s);
  for (int r : {0, 2, 3}) EXPECT_NEAR(elastic.clock[r], expected, 1e-9) << "worker " << r;
  EXPECT_NEAR(elastic.clock[1], died, 1e-12);  // its clock stops at its death
}

// Stop-and-resume trains exactly as without failures; its clocks pay, at the failure of round 2,
// the restart and the round since the checkpoint of round 1 (one round of DiLoCo, whose clocks
// agree after every all-reduce), to 1e-9 s.
TEST_F(ElasticRun, StopAndResumeTrainsAsWithoutFailuresAndPaysTheRestart) {
  const algo::RestartAll restart{.delay_s = 25.0, .checkpoint_every_rounds = 2};
  const auto priced = run(4, algo("diloco"), 12, std::vector<algo::FaultEvent>{{.id = 1, .round = 2}}, {}, restart);
  const auto free = run(4, algo("diloco"), 12, std::nullopt);
  const double round = free.clock[0] / 4;
  for (int r = 0; r < 4; ++r) {
    EXPECT_TRUE(torch::equal(priced.workers[r]->params().data(), free.workers[r]->params().data())) << "worker " << r;
    EXPECT_NEAR(priced.clock[r], free.clock[r] + restart.delay_s + round, 1e-9) << "worker " << r;
  }
}

// Compressed rounds under stop-and-resume: the same bits as the compressed run without failures
// (its error feedback and the owners' state go on as if nothing failed), and the same restart price.
TEST_F(ElasticRun, StopAndResumeOfCompressedRoundsTrainsAsWithoutFailures) {
  const algo::RestartAll restart{.delay_s = 25.0, .checkpoint_every_rounds = 2};
  for (const auto& [name, topo, codec] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"diloco", "1peer", "int8"}, {"gasloc", "complete", "int4"}}) {
    auto with = algo(name, topo);
    with.push_back("algo.compression=" + codec);
    const auto priced = run(4, with, 12, std::vector<algo::FaultEvent>{{.id = 1, .round = 2}}, {}, restart);
    const auto free = run(4, with, 12, std::nullopt);
    const double round = free.clock[0] / 4;
    for (int r = 0; r < 4; ++r) {
      EXPECT_TRUE(torch::equal(priced.workers[r]->params().data(), free.workers[r]->params().data())) << name << " " << codec;
      EXPECT_NEAR(priced.clock[r], free.clock[r] + restart.delay_s + round, 1e-9) << name << " " << codec;
    }
  }
}

// --- Through the trainer ------------------------------------------------------------------------

std::vector<train::ViewEvent> view_events(const std::filesystem::path& run) {
  std::vector<train::ViewEvent> out;
  for (const auto& e : train::read_metrics(run))
    if (const auto* v = std::get_if<train::ViewEvent>(&e)) out.push_back(*v);
  return out;
}

TEST_F(ElasticRun, TheTrainerRunsThroughDeathsAndJoinsAndResumesBitExactly) {
  const std::vector<std::string> elastic = {
      "cluster.workers=4", "cluster.elastic=true", "algo.name=gasloc", "algo.topology=2peer", "algo.H=5",
      "train.steps=40", "train.eval_every=10", "faults.kill=[{id=1,round=1,restart_after_rounds=2},{id=3,round=4}]"};
  const auto full = train::run_training(test_util::nano_request(root_, "elastic_full", elastic));
  EXPECT_EQ(full.steps_done, 40);
  EXPECT_TRUE(std::isfinite(full.final_val_loss));
  const auto views = view_events(root_ / "elastic_full");
  ASSERT_EQ(views.size(), 3u);  // 1 dies at round 1, rejoins at 3; 3 dies at round 4
  EXPECT_EQ(views[0].round, 1);
  EXPECT_EQ(views[0].died, std::vector<int64_t>{1});
  EXPECT_EQ(views[1].round, 3);
  EXPECT_EQ(views[1].joined, std::vector<int64_t>{1});
  EXPECT_EQ(views[2].died, std::vector<int64_t>{3});
  // The last evaluation averages over the three workers that hold a model.
  std::vector<int64_t> members;
  for (const auto& e : train::read_metrics(root_ / "elastic_full"))
    if (const auto* ev = std::get_if<train::EvalEvent>(&e)) members = ev->members;
  EXPECT_EQ(members, (std::vector<int64_t>{0, 1, 2}));
  // What gasloc report and the sweep's tables count.
  const auto summary = study::read_run_summary(root_ / "elastic_full");
  EXPECT_EQ(summary.deaths, 2);
  EXPECT_EQ(summary.rejoins, 1);

  auto first = elastic;
  first.push_back("train.stop_at=17");  // mid-round, while worker 1 is dead
  train::run_training(test_util::nano_request(root_, "elastic_halves", first));
  train::TrainRequest again;
  again.quiet = true;
  again.resume_dir = (root_ / "elastic_halves").string();
  const auto second = train::run_training(again);
  EXPECT_EQ(second.final_val_loss, full.final_val_loss);
}

// The same through compressed rounds (int8 modulo gossip: grids, resends; int4 DiLoCo: error
// feedback): stopped mid-round while worker 1 is dead and resumed, the run ends as the
// uninterrupted one, bit for bit.
TEST_F(ElasticRun, CompressedElasticRunsResumeBitExactly) {
  for (const auto& extra : std::vector<std::vector<std::string>>{
           {"algo.name=gasloc", "algo.topology=2peer", "algo.compression=int8", "algo.gossip_codec=modulo"},
           {"algo.name=diloco", "algo.compression=int4"}}) {
    std::vector<std::string> elastic = {"cluster.workers=4", "cluster.elastic=true", "algo.H=5", "train.steps=30",
                                        "train.eval_every=10", "faults.kill=[{id=1,round=1,restart_after_rounds=2},{id=3,round=4}]"};
    elastic.insert(elastic.end(), extra.begin(), extra.end());
    const std::string name = extra[0].substr(10);
    const auto full = train::run_training(test_util::nano_request(root_, "compressed_full_" + name, elastic));
    EXPECT_EQ(full.steps_done, 30) << name;
    EXPECT_TRUE(std::isfinite(full.final_val_loss)) << name;
    auto first = elastic;
    first.push_back("train.stop_at=12");  // mid-round 2, while worker 1 is dead
    train::run_training(test_util::nano_request(root_, "compressed_halves_" + name, first));
    train::TrainRequest again;
    again.quiet = true;
    again.resume_dir = (root_ / ("compressed_halves_" + name)).string();
    const auto second = train::run_training(again);
    EXPECT_EQ(second.final_val_loss, full.final_val_loss) << name;
  }
}

// Training lines by (worker, step), from a run's metrics.
std::map<std::pair<int64_t, int64_t>, train::TrainEvent> train_lines(const std::filesystem::path& run) {
  std::map<std::pair<int64_t, int64_t>, train::TrainEvent> out;
  for (const auto& e : train::read_metrics(run))
    if (const auto* t = std::get_if<train::TrainEvent>(&e)) out[{t->worker, t->step}] = *t;
  return out;
}

// A run saved by 4 workers at step 10 and resumed on 6: ids 4 and 5 join at the first round's
// merge (round 2, step 15), healed from worker 3, and compute from round 3 on. Joiners have
// weight 0 in the mix, so ids 0..3 follow the 4-worker run bit for bit through round 3's local
// steps (steps 11..20); only round 3's merge, over six, differs.
TEST_F(ElasticRun, ResumedOnMoreWorkersTheNewIdsJoinFromADonor) {
  const std::vector<std::string> base = {"cluster.elastic=true", "algo.name=gasloc", "algo.topology=1peer", "algo.H=5",
                                         "train.eval_every=10", "train.checkpoint_every=10", "train.log_every=1",
                                         "cluster.workers=4"};
  auto whole = base, cut = base;
  whole.push_back("train.steps=25");
  cut.push_back("train.steps=25");
  cut.push_back("train.stop_at=10");
  train::run_training(test_util::nano_request(root_, "more_whole", whole));
  train::run_training(test_util::nano_request(root_, "more_cut", cut));
  train::TrainRequest more;
  more.quiet = true;
  more.resume_dir = (root_ / "more_cut").string();
  more.overrides = {"train.steps=25", "cluster.workers=6"};
  const auto summary = train::run_training(more);
  EXPECT_EQ(summary.steps_done, 25);

  const auto a = train_lines(root_ / "more_whole"), b = train_lines(root_ / "more_cut");
  for (int64_t w = 0; w < 6; ++w)
    for (int64_t step = 11; step <= 25; ++step) {
      ASSERT_TRUE(b.contains({w, step})) << "worker " << w << " step " << step;
      const auto& line = b.at({w, step});
      EXPECT_EQ(line.computed, w < 4 || step > 15) << "worker " << w << " step " << step;
      if (w < 4 && step <= 20) EXPECT_EQ(a.at({w, step}).train_loss, line.train_loss) << "worker " << w << " step " << step;
    }
  const auto views = view_events(root_ / "more_cut");
  ASSERT_FALSE(views.empty());
  EXPECT_EQ(views.front().round, 2);
  EXPECT_EQ(views.front().joined, (std::vector<int64_t>{4, 5}));
  // Saved again by 6: a later resume on 6 takes every id from its own checkpoint.
  const train::RunCheckpoints ckpts(root_ / "more_cut", 6);
  EXPECT_EQ(train::load_checkpoint(ckpts.file(20, 5)).meta.value("world", 0), 6);

  // Disjoint slices of the data depend on the number of workers: such a run keeps its world.
  auto disjoint = cut;
  disjoint.push_back("data.sampling=disjoint");
  train::run_training(test_util::nano_request(root_, "more_disjoint", disjoint));
  train::TrainRequest refused = more;
  refused.resume_dir = (root_ / "more_disjoint").string();
  try {
    train::run_training(refused);
    ADD_FAILURE() << "a run of disjoint slices resumed on more workers";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("each worker's slice of the data would move"), std::string::npos) << e.what();
  }
}

// Faults given in seconds land at the round in progress then on an unimpeded worker's clock
// (floor), restarts after whole rounds (ceil): the same bits as the schedule given in rounds.
TEST_F(ElasticRun, FaultsInSecondsAreTheirRoundsOnAnUnimpededClock) {
  const std::vector<std::string> base = {"cluster.workers=4", "cluster.elastic=true", "algo.name=gasloc",
                                         "algo.topology=1peer", "algo.H=5", "train.steps=40", "train.eval_every=20",
                                         "network.step_time_s=0.1", "network.bandwidth_gbit=0.1"};
  auto by_round = base, by_time = base;
  by_round.push_back("faults.kill=[{id=1,round=2,restart_after_rounds=3}]");
  const auto a = train::run_training(test_util::nano_request(root_, "faults_rounds", by_round));
  // The nano model in fp32 over 0.1 Gbit/s to one peer: a round is 5 x 0.1 s of steps plus about
  // 0.04 s of exchange, 0.54 s. 1.3 s falls in round 2 (1.08..1.62 s); 1.5 s of restart is 2.8
  // rounds, so 3.
  by_time.push_back("faults.kill=[{id=1,time_s=1.3,restart_after_s=1.5}]");
  const auto b = train::run_training(test_util::nano_request(root_, "faults_time", by_time));
  EXPECT_EQ(a.final_val_loss, b.final_val_loss);
  const auto views = view_events(root_ / "faults_time");
  ASSERT_EQ(views.size(), 2u);
  EXPECT_EQ(views[0].round, 2);
  EXPECT_EQ(views[1].round, 5);
}

TEST(ElasticConfig, BadSettingsNameTheKeyAndTheFix) {
  const auto root = test_util::temp_root("test_elastic_cfg");
  auto load = [&](std::vector<std::string> o) {
    o.insert(o.begin(), {"data.dir=" + root.string(), "algo.name=gasloc"});
    return train::load_job("", o);
  };
  expect_config_error([&] { load({"cluster.workers=4", "faults.kill=[{id=1,round=1}]"}); }, "cluster.elastic = true");
  expect_config_error([&] { load({"cluster.workers=4", "cluster.elastic=true", "faults.kill=[{id=4,round=1}]"}); },
                      "faults.kill[0].id");
  expect_config_error([&] { load({"cluster.elastic=true", "algo.name=none"}); }, "cluster.elastic");
  expect_config_error([&] { load({"cluster.workers=4", "cluster.elastic=true", "faults.restart_all=true"}); },
                      "faults.restart_all");
  expect_config_error([&] { load({"cluster.workers=4", "algo.name=diloco", "algo.H=30", "train.checkpoint_every=100",
                                  "faults.restart_all=true", "faults.kill=[{id=1,round=1}]"}); },
                      "train.checkpoint_every");
  // Every codec is elastic, and restart_all prices any compressed round.
  load({"cluster.workers=4", "cluster.elastic=true", "algo.compression=int8"});
  load({"cluster.elastic=true", "cluster.backend=gloo", "algo.compression=int8"});
  load({"cluster.workers=4", "cluster.elastic=true", "algo.name=diloco", "algo.compression=int8"});
  load({"cluster.workers=4", "cluster.elastic=true", "algo.compression=int8", "algo.gossip_codec=direct"});
  load({"cluster.workers=4", "cluster.elastic=true", "algo.compression=int4", "algo.gossip_codec=modulo"});
  load({"cluster.workers=4", "cluster.elastic=true", "algo.compression=int8", "algo.gossip_codec=delta"});
  load({"cluster.workers=4", "cluster.elastic=true", "algo.topology=complete", "algo.compression=int4"});
  load({"cluster.workers=4", "algo.name=diloco", "algo.H=5", "train.checkpoint_every=10", "faults.restart_all=true",
        "faults.kill=[{id=1,round=1}]", "algo.compression=int8"});
  expect_config_error([&] { load({"cluster.elastic=true", "cluster.backend=nccl"}); }, "cluster.backend = \"gloo\"");
  // Over Gloo the failures are real: a schedule of simulated ones is refused.
  expect_config_error([&] { load({"cluster.elastic=true", "cluster.backend=gloo", "faults.kill=[{id=1,round=2}]"}); },
                      "over Gloo, failures are real");
  load({"cluster.elastic=true", "cluster.backend=gloo"});  // an elastic Gloo job is a valid job
  // time_budget prices the fixed graph, not the view's: refused until it follows the view.
  expect_config_error([&] { load({"cluster.workers=4", "cluster.elastic=true", "algo.h_policy=time_budget"}); },
                      "algo.h_policy = \"fixed\"");
  load({"cluster.workers=4", "algo.h_policy=time_budget"});  // without elastic: valid
  load({"cluster.elastic=true", "cluster.backend=gloo", "cluster.join=true"});
  expect_config_error([&] { load({"cluster.workers=4", "cluster.elastic=true", "cluster.join=true"}); }, "cluster.join");
  expect_config_error([&] { load({"cluster.backend=gloo", "cluster.join=true"}); }, "cluster.join");
  expect_config_error([&] { load({"cluster.workers=4", "cluster.elastic=true", "faults.kill=[{id=1,rund=1}]"}); }, "rund");
  expect_config_error([&] { load({"cluster.workers=4", "cluster.elastic=true", "faults.kill=[{id=1}]"}); },
                      "needs a round or a time_s");
  expect_config_error([&] { load({"cluster.workers=4", "cluster.elastic=true", "faults.kill=[{id=1,round=1,time_s=3}]"}); },
                      "not both");
  expect_config_error([&] { load({"cluster.workers=4", "cluster.elastic=true",
                                  "faults.kill=[{id=1,time_s=3,restart_after_s=2,restart_after_rounds=1}]"}); },
                      "in rounds or in seconds");
  expect_config_error([&] { load({"cluster.workers=4", "cluster.elastic=true", "faults.churn_mtbf_s=30",
                                  "faults.churn_mean_rounds=4"}); },
                      "faults.churn_mtbf_s");
  std::filesystem::remove_all(root);
}

}  // namespace
