// Heterogeneous clusters (docs/design.md section 5): the time-budget local-step policy against
// hand-computed H_i, the virtual clock of a straggler's round with gossip and with an all-reduce,
// determinism, and the [network] settings. Times are exact up to 1e-9 s (double arithmetic).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

#include "gasloc/algo/algo_config.hpp"
#include "gasloc/algo/algorithms.hpp"
#include "gasloc/algo/local_steps.hpp"
#include "gasloc/comm/inproc.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/train/trainer.hpp"
#include "test_util.hpp"

using namespace gasloc;
namespace fs = std::filesystem;

namespace {
constexpr double kTol = 1e-9;

// Step 1 s, links 1 MB/s, no latency, every message priced at 1 MB; rank 3 straggles.
comm::NetworkModel straggler_model(double bandwidth, double slowdown = 1.0) {
  comm::NetworkModel m;
  m.step_time_s = 1.0;
  m.bandwidth_Bps = 1e6;
  m.latency_s = 0.0;
  m.simulated_message_bytes = 1'000'000;
  m.bandwidth_scale = {1, 1, 1, bandwidth};
  m.slowdown = {1, 1, 1, slowdown};
  return m;
}

int partner_of(const topology::Topology& t, int rank, int64_t round) { return t.peers(rank, round).at(0); }
}  // namespace

TEST(LocalSteps, TimeBudgetMatchesHandComputedValuesForGossip) {
  // 1peer, H = 10: R = 10 * 1 s + 1 MB / 1 MB/s = 11 s. The straggler's pair runs at its
  // bandwidth, C = 1 MB / (f MB/s): f = 0.2 gives 5 s, so it and its partner take
  // floor((11 - 5) / 1) = 6 steps; the others 10. f = 0.1 gives C = 10 s and 1 step.
  const topology::Topology t(topology::Kind::one_peer, 4, 42);
  for (int64_t round : {0, 1, 2, 7}) {
    const int p = partner_of(t, 3, round);
    algo::LocalSteps bw20(10, straggler_model(0.2), t, 4);
    EXPECT_NEAR(bw20.round_seconds(4), 11.0, kTol);
    EXPECT_NEAR(bw20.exchange_seconds(3, round, 4), 5.0, kTol);
    for (int r = 0; r < 4; ++r) EXPECT_EQ(bw20.steps(r, round, 4), (r == 3 || r == p) ? 6 : 10) << "rank " << r;
    algo::LocalSteps bw10(10, straggler_model(0.1), t, 4);
    EXPECT_EQ(bw10.steps(3, round, 4), 1);
    EXPECT_EQ(bw10.steps(p, round, 4), 1);
  }
  // Slow compute (half speed, full link): floor((11 - 1) / 2) = 5 for the straggler only.
  algo::LocalSteps slow(10, straggler_model(1.0, 2.0), t, 4);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(slow.steps(r, 0, 4), r == 3 ? 5 : 10);
  // 2peer (two neighbours share each link): R = 10 + 1 MB / 0.5 MB/s = 12 s; the straggler at
  // 0.5 sends at 0.25 MB/s per neighbour, C = 4 s, so it and both neighbours take 8 steps.
  const topology::Topology ring(topology::Kind::two_peer, 4, 42);
  algo::LocalSteps bw50(10, straggler_model(0.5), ring, 4);
  EXPECT_NEAR(bw50.round_seconds(4), 12.0, kTol);
  const auto nb = ring.peers(3, 0);
  for (int r = 0; r < 4; ++r) {
    const bool near = r == 3 || std::find(nb.begin(), nb.end(), r) != nb.end();
    EXPECT_EQ(bw50.steps(r, 0, 4), near ? 8 : 10) << "rank " << r;
  }
  // Clamped to 1 and flagged when the exchange alone outlasts the round.
  bool clamped = false;
  algo::LocalSteps bw1(10, straggler_model(0.01), t, 4);
  EXPECT_EQ(bw1.steps(3, 0, 4, &clamped), 1);
  EXPECT_TRUE(clamped);
  // The fixed policy is H whatever the network.
  EXPECT_EQ(algo::LocalSteps(10).steps(3, 0, 4), 10);
}

TEST(LocalSteps, AnAllReduceLowersEveryonesBudgetAlike) {
  // Ring all-reduce of 1 MB over 4: 2 * 3/4 * 1 MB / min B. Unimpeded 1.5 s, so R = 11.5 s; with
  // the straggler at 0.2 it takes 7.5 s and every worker gets floor(11.5 - 7.5) = 4 steps.
  algo::LocalSteps ar(10, straggler_model(0.2), std::nullopt, 4);
  EXPECT_NEAR(ar.round_seconds(4), 11.5, kTol);
  for (int r = 0; r < 4; ++r) {
    EXPECT_NEAR(ar.exchange_seconds(r, 0, 4), 7.5, kTol);
    EXPECT_EQ(ar.steps(r, 0, 4), 4);
  }
}

namespace {
// One round of `sync_cfg` on 4 in-process workers with `model`: each computes the steps its
// synchronizer asks for (comm.compute), then the round's communication. Returns the clocks.
std::vector<double> one_round(const algo::AlgoConfig& cfg, const comm::NetworkModel& model) {
  comm::InProcCluster cluster(4, model);
  cluster.run([&](int r, comm::Communicator& comm) {
    auto w = torch::zeros({8});
    FlatParams flat({{"w", w}});
    auto sync = algo::make_synchronizer(cfg, 4, 42, &model);
    sync->init(flat);
    for (int64_t k = 1; k <= cfg.H; ++k) {
      if (sync->wants_compute(k, comm)) comm.compute(1);
      EXPECT_EQ(sync->after_step(k, flat, comm), k == cfg.H);
    }
  });
  std::vector<double> clocks;
  for (int r = 0; r < 4; ++r) clocks.push_back(cluster.clock(r));
  return clocks;
}

algo::AlgoConfig round_cfg(const std::string& name, const std::string& policy) {
  algo::AlgoConfig a;
  a.name = name;
  a.H = 10;
  a.topology = "1peer";
  a.h_policy = policy;
  return a;
}
}  // namespace

TEST(VirtualClock, OnePeerStragglerDelaysExactlyItsPartner) {
  const topology::Topology t(topology::Kind::one_peer, 4, 42);
  const int p = partner_of(t, 3, 0);
  // Fixed H: everyone computes 10 s; the straggler's pair then takes 5 s, the other pair 1 s.
  auto c = one_round(round_cfg("gasloc", "fixed"), straggler_model(0.2));
  for (int r = 0; r < 4; ++r) EXPECT_NEAR(c[r], (r == 3 || r == p) ? 15.0 : 11.0, kTol) << "rank " << r;
  // Time budget: the straggler and its partner compute 6 steps, so all four end at 11 s.
  c = one_round(round_cfg("gasloc", "time_budget"), straggler_model(0.2));
  for (int r = 0; r < 4; ++r) EXPECT_NEAR(c[r], 11.0, kTol) << "rank " << r;
}

// The modulo codec's first round goes in fp32 (it sizes the grids); the time budget plans it so.
// p = 2048 values, chunks of 256; every fp32 message priced at 1 MB (parameter_message_bytes =
// 4p), so round 0 is the uncompressed round above: the straggler (at 0.2) and its partner take
// 6 steps and every clock ends at 11 s. Round 1 is coded: 8 x (4 + 256) payload + 8 x 8 grid
// bytes = 2144 bytes, priced 1 MB x 2144 / 8192 = 0.261719 MB: R = 10.261719 s, the slow pair's
// C = 1.308595 s, floor(8.953) = 8 steps; the others 10.
TEST(VirtualClock, TimeBudgetPlansTheModuloCodecsFp32FirstRound) {
  constexpr int64_t kP = 2048;
  comm::NetworkModel model = straggler_model(0.2);
  model.parameter_message_bytes = kP * 4;
  algo::AlgoConfig cfg = round_cfg("gasloc", "time_budget");
  cfg.compression = "int8";
  cfg.gossip_codec = "modulo";
  const topology::Topology t(topology::Kind::one_peer, 4, 42);
  std::vector<std::vector<int>> steps(4, std::vector<int>(2, 0));
  std::vector<double> after_first(4);
  comm::InProcCluster cluster(4, model);
  cluster.run([&](int r, comm::Communicator& comm) {
    torch::manual_seed(r);
    auto w = torch::randn({kP});
    FlatParams flat({{"w", w}});
    auto sync = algo::make_synchronizer(cfg, 4, 42, &model);
    sync->init(flat);
    for (int64_t k = 1; k <= 2 * cfg.H; ++k) {
      if (sync->wants_compute(k, comm)) comm.compute(1), ++steps[r][(k - 1) / cfg.H];
      sync->after_step(k, flat, comm);
      if (k == cfg.H) after_first[r] = comm.now();
    }
  });
  for (int64_t round : {0, 1}) {
    const int p = partner_of(t, 3, round);
    for (int r = 0; r < 4; ++r) {
      const bool slow = r == 3 || r == p;
      EXPECT_EQ(steps[r][round], slow ? (round == 0 ? 6 : 8) : 10) << "rank " << r << ", round " << round;
    }
  }
  for (int r = 0; r < 4; ++r) EXPECT_NEAR(after_first[r], 11.0, kTol) << "rank " << r;
}

TEST(VirtualClock, AllReduceStragglerDelaysEveryoneByTheComputedAmount) {
  // DiLoCo: 10 s of compute, then the all-reduce at the straggler's pace, 7.5 s instead of 1.5 s.
  const auto homogeneous = one_round(round_cfg("diloco", "fixed"), straggler_model(1.0));
  const auto straggler = one_round(round_cfg("diloco", "fixed"), straggler_model(0.2));
  for (int r = 0; r < 4; ++r) {
    EXPECT_NEAR(homogeneous[r], 11.5, kTol);
    EXPECT_NEAR(straggler[r] - homogeneous[r], 6.0, kTol);
  }
}

namespace {
const fs::path kRoot = test_util::temp_root("test_hetero");

train::TrainRequest hetero_request(const std::string& run, std::vector<std::string> extra = {}) {
  train::TrainRequest r;
  r.quiet = true;
  r.overrides = {"model.preset=nano", "data.dir=" + (kRoot / "data").string(), "data.seq_len=32", "data.batch_size=4",
                 "data.val_batches=2", "train.steps=20", "train.eval_every=10", "train.checkpoint_every=0",
                 "train.log_every=5", "optim.lr=0.003", "optim.warmup_steps=5", "train.threads=1",
                 "cluster.workers=4", "algo.name=gasloc", "algo.topology=1peer", "algo.H=5",
                 "network.step_time_s=1.0", "network.simulated_model=134m:bf16",
                 "network.stragglers=[{ rank = 3, bandwidth = 0.5 }]", "train.run_dir=" + (kRoot / run).string()};
  r.overrides.insert(r.overrides.end(), extra.begin(), extra.end());
  return r;
}

std::vector<nlohmann::json> events(const fs::path& run, const std::string& kind) {
  std::vector<nlohmann::json> out;
  std::ifstream m(run / "metrics.jsonl");
  for (std::string line; std::getline(m, line);) {
    auto j = nlohmann::json::parse(line);
    if (j["event"] == kind) out.push_back(j);
  }
  return out;
}
}  // namespace

class Hetero : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { test_util::make_byte_dataset(kRoot); }
  static void TearDownTestSuite() { fs::remove_all(kRoot); }
};

TEST_F(Hetero, VirtualTimeIsDeterministicAndTheStragglerStepsLess) {
  train::run_training(hetero_request("a", {"algo.h_policy=time_budget"}));
  train::run_training(hetero_request("b", {"algo.h_policy=time_budget"}));
  const auto a = events(kRoot / "a", "train"), b = events(kRoot / "b", "train");
  ASSERT_EQ(a.size(), 16u);  // 4 workers x 4 log points
  ASSERT_EQ(a.size(), b.size());
  // Workers write their lines in whatever order their threads run: match them by (worker, step).
  auto by_key = [](const std::vector<nlohmann::json>& v) {
    std::map<std::pair<int, int64_t>, nlohmann::json> m;
    for (const auto& j : v) m[{j["worker"].get<int>(), j["step"].get<int64_t>()}] = j;
    return m;
  };
  const auto ka = by_key(a), kb = by_key(b);
  std::map<int, int64_t> local;
  for (const auto& [key, ja] : ka) {
    const auto& jb = kb.at(key);
    EXPECT_EQ(ja["virtual_time_s"], jb["virtual_time_s"]) << ja.dump();
    EXPECT_EQ(ja["idle_s"], jb["idle_s"]);
    EXPECT_EQ(ja["local_steps"], jb["local_steps"]);
    if (key.second == 20) local[key.first] = ja["local_steps"].get<int64_t>();
  }
  // 134m in bf16 is 268 MB: 2.15 s per pair at 1 Gbit/s, R = 5 + 2.15 s. At half bandwidth the
  // straggler's pair needs 4.3 s and fits floor(2.85) = 2 steps: 4 rounds x 2 = 8 of 20.
  // Its partner of each round (drawn from train.seed) takes 2 steps too, the others 5.
  const topology::Topology t(topology::Kind::one_peer, 4, 1337);
  std::map<int, int64_t> expected;
  for (int64_t round = 0; round < 4; ++round)
    for (int r = 0; r < 4; ++r) expected[r] += (r == 3 || partner_of(t, 3, round) == r) ? 2 : 5;
  EXPECT_EQ(local, expected);
  EXPECT_EQ(local[3], 8);
  // At step 5 the straggler has used its 2 steps: its line says so, with no gradient norm; a
  // worker outside its pair computed step 5.
  const int other = partner_of(t, 3, 0) == 0 ? 1 : 0;
  EXPECT_FALSE(ka.at({3, 5})["computed"].get<bool>());
  EXPECT_TRUE(ka.at({3, 5})["grad_norm"].is_null());
  EXPECT_TRUE(ka.at({other, 5})["computed"].get<bool>());
  EXPECT_GT(ka.at({other, 5})["grad_norm"].get<double>(), 0.0);
  // The evaluation's virtual time is when the average model exists: the latest clock.
  const auto evals = events(kRoot / "a", "eval");
  ASSERT_EQ(evals.size(), 2u);
  double latest = 0;
  for (const auto& e : a)
    if (e["step"] == 20) latest = std::max(latest, e["virtual_time_s"].get<double>());
  EXPECT_DOUBLE_EQ(evals[1]["virtual_time_s"].get<double>(), latest);
}

TEST_F(Hetero, TimeBudgetRunsResumeBitExactly) {
  const auto full = train::run_training(hetero_request("full", {"algo.h_policy=time_budget"}));
  const auto first = train::run_training(hetero_request("halves", {"algo.h_policy=time_budget", "train.stop_at=7"}));
  train::TrainRequest again;
  again.quiet = true;
  again.resume_dir = (kRoot / "halves").string();
  const auto second = train::run_training(again);
  ASSERT_EQ(second.train_losses.size(), 13u);
  for (size_t i = 0; i < 13; ++i) EXPECT_EQ(second.train_losses[i], full.train_losses[7 + i]) << "step " << 8 + i;
  EXPECT_EQ(second.final_val_loss, full.final_val_loss);
}

TEST_F(Hetero, NetworkSettingsAreChecked) {
  auto expect_error = [](std::vector<std::string> extra, const std::string& needle) {
    try {
      train::load_job("", extra);
      ADD_FAILURE() << "expected an error mentioning " << needle;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error({"cluster.workers=4", "algo.name=diloco", "network.stragglers=[{ rank = 4, bandwidth = 0.1 }]"}, "network.stragglers[0].rank");
  expect_error({"cluster.workers=4", "algo.name=diloco", "network.stragglers=[{ rank = 1, bandwidth = 0 }]"}, "network.stragglers[0].bandwidth");
  expect_error({"cluster.workers=4", "algo.name=diloco", "network.stragglers=[{ rank = 1, speed = 2 }]"}, "network.stragglers.speed");
  expect_error({"network.preset=flaky"}, "network.preset");
  expect_error({"network.bandwidth_gbit=-1"}, "network.bandwidth_gbit");
  expect_error({"network.simulated_model=134m:int4"}, "network.simulated_model");
  expect_error({"network.simulated_model=134m:bf16", "network.simulated_model_bytes=5"}, "conflicts");
  expect_error({"cluster.workers=2", "algo.name=allreduce", "algo.h_policy=time_budget"}, "algo.h_policy");
  expect_error({"algo.h_policy=sometimes"}, "algo.h_policy");
  // A scenario file with an unknown key is refused like any job file.
  expect_error({"network.bandwith_gbit=1"}, "network.bandwith_gbit");
  // 134m in bf16: two bytes per parameter.
  const auto job = train::load_job("", {"network.simulated_model=134m:bf16"});
  EXPECT_EQ(job.network.simulated_model_bytes, 2 * model::LlamaConfig::preset("134m").num_params());
  // Presets name the last rank; explicit stragglers win.
  auto m = train::load_job("", {"cluster.workers=4", "algo.name=diloco", "network.preset=straggler_bw10"}).network.model(4);
  EXPECT_DOUBLE_EQ(m.bandwidth(3), 0.1 * 1e9 / 8);
  EXPECT_DOUBLE_EQ(m.bandwidth(0), 1e9 / 8);
  m = train::load_job("", {"cluster.workers=4", "algo.name=diloco", "network.preset=slow_compute",
                           "network.stragglers=[{ rank = 3, slowdown = 4 }]"}).network.model(4);
  EXPECT_DOUBLE_EQ(m.step_time(3), 0.4);
}
