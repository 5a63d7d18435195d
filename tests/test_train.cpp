// Trainer end to end on the nano preset and a byte-level dataset: bit-exact resume, Ctrl+C,
// checkpoints that survive a full disk, and refusals that lose nothing.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <thread>

#include "gasloc/comm/nccl.hpp"
#include "gasloc/core/atomic_file.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/train/checkpoint.hpp"
#include "gasloc/train/metrics.hpp"
#include "gasloc/train/signals.hpp"
#include "gasloc/train/trainer.hpp"
#include "gasloc/train/user_run.hpp"
#include "gasloc/train/worker.hpp"
#include "test_util.hpp"

using namespace gasloc;
namespace fs = std::filesystem;

namespace {
// One directory per process: ctest runs the tests of this file as parallel processes.
const fs::path kRoot = test_util::temp_root("test_train");

// The file of `rank`'s newest committed checkpoint in `run`.
fs::path newest(const fs::path& run, int rank = 0, int world = 1) {
  const train::RunCheckpoints c(run, world);
  const auto steps = c.committed(rank);
  return steps.empty() ? run / "no-committed-checkpoint" : c.file(steps.front(), rank);
}

// Sends SIGINT, like Ctrl+C, once training is under way (its first metrics line exists).
std::thread interrupt_when_running(const fs::path& run, std::atomic<bool>& done) {
  return std::thread([run, &done] {
    while (!done.load()) {
      if (fs::exists(run / "metrics.jsonl") && fs::file_size(run / "metrics.jsonl") > 0) {
        std::raise(SIGINT);
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
}

class Trainer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { test_util::make_byte_dataset(kRoot); }
  static void TearDownTestSuite() { fs::remove_all(kRoot); }

  static train::TrainRequest request(const std::string& run, std::vector<std::string> extra = {}) {
    return test_util::nano_request(kRoot, run, std::move(extra));
  }
};
}  // namespace

TEST_F(Trainer, ResumeIsBitExact) {
  const auto full = train::run_training(request("full"));
  ASSERT_EQ(full.train_losses.size(), 100u);
  EXPECT_LT(full.train_losses.back(), full.train_losses.front());  // it learns

  const auto first = train::run_training(request("halves", {"train.stop_at=50"}));
  ASSERT_EQ(first.steps_done, 50);
  train::TrainRequest again;
  again.quiet = true;
  again.resume_dir = (kRoot / "halves").string();
  const auto second = train::run_training(again);
  ASSERT_EQ(second.steps_done, 100);
  ASSERT_EQ(second.train_losses.size(), 50u);
  for (size_t i = 0; i < 50; ++i) {
    EXPECT_EQ(first.train_losses[i], full.train_losses[i]) << "step " << i + 1;
    EXPECT_EQ(second.train_losses[i], full.train_losses[50 + i]) << "step " << 51 + i;
  }
  EXPECT_EQ(second.final_val_loss, full.final_val_loss);
  auto a = train::load_checkpoint(newest(kRoot / "full"));
  auto b = train::load_checkpoint(newest(kRoot / "halves"));
  EXPECT_TRUE(torch::equal(a.tensors.at("params"), b.tensors.at("params")));
  EXPECT_TRUE(torch::equal(a.tensors.at("optim.exp_avg_sq"), b.tensors.at("optim.exp_avg_sq")));

  // metrics.jsonl has one train line per log_every and one eval line per eval_every, no duplicates.
  // And one memory line, written when the run started.
  std::ifstream m(kRoot / "halves" / "metrics.jsonl");
  std::string line;
  std::map<std::string, int> lines;
  while (std::getline(m, line)) {
    auto j = nlohmann::json::parse(line);
    lines[j["event"]]++;
    if (j["event"] != "memory") EXPECT_TRUE(j.contains("wall_time_s"));
  }
  EXPECT_EQ(lines, (std::map<std::string, int>{{"train", 10}, {"eval", 4}, {"memory", 1}}));
  auto run = nlohmann::json::parse(read_file(kRoot / "halves" / "run.json"));
  EXPECT_EQ(run["config"]["model"]["preset"], "nano");
  EXPECT_EQ(run["model"]["vocab_size"], 257);
}

TEST_F(Trainer, RefusesAnotherModelShapeAndExistingRuns) {
  train::run_training(request("shape", {"train.steps=10", "train.eval_every=0"}));
  const auto before = read_file(newest(kRoot / "shape"));
  train::TrainRequest r;
  r.quiet = true;
  r.resume_dir = (kRoot / "shape").string();
  r.overrides = {"model.n_layers=3"};
  try {
    train::run_training(r);
    ADD_FAILURE() << "resuming with another model shape must fail";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("differs from this job: model.n_layers is 2 in the checkpoint, 3 in this job"),
              std::string::npos)
        << e.what();
  }
  // A fresh run into a directory that holds a checkpoint is refused, nothing overwritten.
  EXPECT_THROW(train::run_training(request("shape", {"train.steps=10"})), CheckpointError);
  EXPECT_EQ(read_file(newest(kRoot / "shape")), before);
  // --resume of something that is not a run.
  r.overrides.clear();
  r.resume_dir = (kRoot / "nope").string();
  EXPECT_THROW(train::run_training(r), CheckpointError);
}

TEST_F(Trainer, CorruptCheckpointIsAClearError) {
  write_file_atomic(kRoot / "garbage.pt", "this is not a checkpoint");
  try {
    train::load_checkpoint(kRoot / "garbage.pt");
    ADD_FAILURE() << "expected CheckpointError";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("corrupt checkpoint"), std::string::npos) << e.what();
  }
}

TEST_F(Trainer, FullDiskKeepsThePreviousCheckpoint) {
  train::Checkpoint a;
  a.meta = {{"step", 1}};
  a.tensors["x"] = torch::arange(10, torch::kFloat32);
  const auto path = kRoot / "disk" / "checkpoint.pt";
  train::save_checkpoint(path, a);
  const auto size = fs::file_size(path);

  train::Checkpoint big;
  big.meta = {{"step", 2}};
  big.tensors["x"] = torch::ones({1 << 20}, torch::kFloat32);  // 4 MB: beyond the limit below
  // Simulate a full disk: the file-size limit makes write() fail with EFBIG, as ENOSPC would.
  auto prev_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit old{};
  getrlimit(RLIMIT_FSIZE, &old);
  rlimit low = old;
  low.rlim_cur = size * 4;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &low), 0);
  bool threw = false;
  try {
    train::save_checkpoint(path, big);
  } catch (const CheckpointError& e) {
    threw = true;
    EXPECT_NE(std::string(e.hint()).find("left intact"), std::string::npos) << e.hint();
  }
  setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, prev_handler);
  EXPECT_TRUE(threw);
  auto back = train::load_checkpoint(path);
  EXPECT_EQ(back.meta["step"], 1);
  EXPECT_TRUE(torch::equal(back.tensors.at("x"), a.tensors.at("x")));
  EXPECT_FALSE(fs::exists(path.string() + ".tmp"));
}

TEST_F(Trainer, InterruptWritesACheckpointAndResumes) {
  const auto run = kRoot / "interrupt";
  std::atomic<bool> done{false};
  std::thread killer = interrupt_when_running(run, done);
  auto s = train::run_training(request("interrupt", {"train.steps=100000", "train.log_every=1"}));
  done = true;
  killer.join();
  EXPECT_TRUE(s.interrupted);
  EXPECT_LT(s.steps_done, 100000);
  auto ckpt = train::load_checkpoint(newest(run));
  EXPECT_EQ(ckpt.meta["step"], s.steps_done);
  train::TrainRequest r;
  r.quiet = true;
  r.resume_dir = run.string();
  r.overrides = {"train.steps=" + std::to_string(s.steps_done + 3)};
  auto resumed = train::run_training(r);
  EXPECT_EQ(resumed.steps_done, s.steps_done + 3);
  EXPECT_FALSE(resumed.interrupted);
}

TEST_F(Trainer, InProcessClusterResumeIsBitExact) {
  // 4 GASLoC workers on a random ring: 2 x 20 steps == 40 steps, for every worker's state.
  const std::vector<std::string> algo = {"cluster.workers=4", "algo.name=gasloc", "algo.topology=2peer", "algo.H=5",
                                         "train.steps=40", "train.eval_every=20"};
  const auto full = train::run_training(request("cluster_full", algo));
  auto half_opts = algo;
  half_opts.push_back("train.stop_at=20");
  const auto first = train::run_training(request("cluster_halves", half_opts));
  train::TrainRequest again;
  again.quiet = true;
  again.resume_dir = (kRoot / "cluster_halves").string();
  const auto second = train::run_training(again);
  ASSERT_EQ(full.train_losses.size(), 40u);
  ASSERT_EQ(second.train_losses.size(), 20u);
  for (size_t i = 0; i < 20; ++i) {
    EXPECT_EQ(first.train_losses[i], full.train_losses[i]) << "step " << i + 1;
    EXPECT_EQ(second.train_losses[i], full.train_losses[20 + i]) << "step " << 21 + i;
  }
  EXPECT_EQ(second.final_val_loss, full.final_val_loss);
  for (int r = 0; r < 4; ++r) {
    auto a = train::load_checkpoint(newest(kRoot / "cluster_full", r, 4));
    auto b = train::load_checkpoint(newest(kRoot / "cluster_halves", r, 4));
    EXPECT_TRUE(torch::equal(a.tensors.at("params"), b.tensors.at("params"))) << "rank " << r;
    EXPECT_TRUE(torch::equal(a.tensors.at("sync.theta"), b.tensors.at("sync.theta"))) << "rank " << r;
    EXPECT_TRUE(torch::equal(a.tensors.at("sync.momentum"), b.tensors.at("sync.momentum"))) << "rank " << r;
  }
  // The eval lines carry the average model's loss, each worker's, and the consensus distance.
  std::ifstream m(kRoot / "cluster_full" / "metrics.jsonl");
  std::string line;
  int evals = 0;
  while (std::getline(m, line)) {
    auto j = nlohmann::json::parse(line);
    if (j["event"] != "eval") continue;
    ++evals;
    EXPECT_EQ(j["worker_val_loss"].size(), 4u);
    EXPECT_GT(j["consensus_distance"].get<double>(), 0.0);  // gossip leaves workers apart
    EXPECT_GT(j["bytes_sent"].get<int64_t>(), 0);
  }
  EXPECT_EQ(evals, 2);
}

TEST_F(Trainer, InProcessClusterStopsEveryWorkerAtTheSameStep) {
  const auto run = kRoot / "cluster_interrupt";
  std::atomic<bool> done{false};
  std::thread killer = interrupt_when_running(run, done);
  auto s = train::run_training(request("cluster_interrupt", {"cluster.workers=3", "algo.name=diloco", "algo.H=4",
                                                             "train.steps=100000", "train.log_every=1"}));
  done = true;
  killer.join();
  EXPECT_TRUE(s.interrupted);
  for (int r = 0; r < 3; ++r)
    EXPECT_EQ(train::load_checkpoint(newest(run, r, 3)).meta["step"], s.steps_done);
  train::TrainRequest r;
  r.quiet = true;
  r.resume_dir = run.string();
  r.overrides = {"train.steps=" + std::to_string(s.steps_done + 4)};
  EXPECT_EQ(train::run_training(r).steps_done, s.steps_done + 4);
}

TEST_F(Trainer, ClusterSettingsAreChecked) {
  EXPECT_THROW(train::run_training(request("bad1", {"cluster.workers=4", "algo.name=none"})), ConfigError);
  EXPECT_THROW(train::run_training(request("bad2", {"cluster.workers=1", "algo.name=gasloc", "algo.topology=1peer"})),
               ConfigError);
  EXPECT_THROW(train::run_training(request("bad3", {"cluster.backend=mpi"})), ConfigError);
  // nccl is a valid backend; a build without it says so, and what to do, before any rendezvous.
  if (!comm::kHaveNccl) {
    try {
      train::run_training(request("bad4", {"cluster.backend=nccl"}));
      ADD_FAILURE() << "a build without NCCL accepted cluster.backend = nccl";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("the nccl backend is not in this build"), std::string::npos) << e.what();
      EXPECT_NE(e.hint().find("cluster.backend = \"gloo\""), std::string::npos) << e.hint();
    }
  }
}

// data.sampling = "disjoint" gives each worker its slice of the stream: with one worker the slice
// is the whole stream, so the run must equal a shared one bit for bit; with two it must not.
TEST_F(Trainer, DisjointSamplingReducesToSharedOnOneWorker) {
  const std::vector<std::string> one = {"train.steps=10", "train.eval_every=10"};
  auto with = [](std::vector<std::string> v, const std::string& extra) {
    v.push_back(extra);
    return v;
  };
  const auto shared1 = train::run_training(request("shared1", one));
  const auto disjoint1 = train::run_training(request("disjoint1", with(one, "data.sampling=disjoint")));
  EXPECT_EQ(disjoint1.train_losses, shared1.train_losses);
  EXPECT_EQ(disjoint1.final_val_loss, shared1.final_val_loss);

  const std::vector<std::string> two = {"train.steps=10", "train.eval_every=10", "cluster.workers=2",
                                        "algo.name=diloco", "algo.H=5"};
  const auto shared2 = train::run_training(request("shared2", two));
  const auto disjoint2 = train::run_training(request("disjoint2", with(two, "data.sampling=disjoint")));
  EXPECT_NE(disjoint2.train_losses, shared2.train_losses);
  EXPECT_TRUE(std::isfinite(disjoint2.final_val_loss));
  try {
    train::run_training(request("bad_sampling", {"data.sampling=iid"}));
    ADD_FAILURE() << "data.sampling = iid was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("data.sampling"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("valid: shared, disjoint"), std::string::npos) << e.what();
  }
}

TEST_F(Trainer, SixtyFourNanoWorkersRunInOneProcess) {
  // Cluster size is limited by memory only: 64 workers of the nano preset, two 1peer rounds.
  const auto s = train::run_training(request("n64", {"cluster.workers=64", "algo.name=gasloc", "algo.topology=1peer",
                                                     "algo.H=2", "train.steps=4", "train.eval_every=4",
                                                     "data.batch_size=1", "data.seq_len=16"}));
  EXPECT_EQ(s.steps_done, 4);
  EXPECT_TRUE(std::isfinite(s.final_val_loss));
  int lines = 0;
  std::ifstream m(kRoot / "n64" / "metrics.jsonl");
  for (std::string line; std::getline(m, line);) lines += line.find("\"event\":\"train\"") != std::string::npos;
  EXPECT_EQ(lines, 64);  // one train line per worker at the last step (log_every = 10 > steps)
}

// ---------------------------------------------------------------------------------------------
// GPA and Schedule-Free in the trainer: evaluation, checkpoints and resume at the evaluation point.

namespace {
nlohmann::json first_event(const fs::path& run, const std::string& event) {
  std::ifstream m(run / "metrics.jsonl");
  for (std::string line; std::getline(m, line);) {
    auto j = nlohmann::json::parse(line);
    if (j["event"] == event) return j;
  }
  return {};
}

// Runs `opts` for 40 steps, and again as 17 + 23 steps (stopped mid-round, between evaluations),
// and expects the same losses, validation loss and checkpoint tensors bit for bit.
void expect_resume_bit_exact(const std::string& name, std::vector<std::string> opts, int workers,
                             const std::function<train::TrainRequest(const std::string&, std::vector<std::string>)>& request) {
  opts.insert(opts.end(), {"train.steps=40", "train.eval_every=15", "cluster.workers=" + std::to_string(workers)});
  const auto full = train::run_training(request(name + "_full", opts));
  opts.push_back("train.stop_at=17");
  const auto first = train::run_training(request(name + "_halves", opts));
  train::TrainRequest again;
  again.quiet = true;
  again.resume_dir = (kRoot / (name + "_halves")).string();
  const auto second = train::run_training(again);
  ASSERT_EQ(full.train_losses.size(), 40u);
  ASSERT_EQ(second.train_losses.size(), 23u);
  for (size_t i = 0; i < 17; ++i) EXPECT_EQ(first.train_losses[i], full.train_losses[i]) << "step " << i + 1;
  for (size_t i = 0; i < 23; ++i) EXPECT_EQ(second.train_losses[i], full.train_losses[17 + i]) << "step " << 18 + i;
  EXPECT_EQ(second.final_val_loss, full.final_val_loss);
  for (int r = 0; r < workers; ++r) {
    auto a = train::load_checkpoint(newest(kRoot / (name + "_full"), r, workers));
    auto b = train::load_checkpoint(newest(kRoot / (name + "_halves"), r, workers));
    ASSERT_EQ(a.tensors.size(), b.tensors.size());
    for (const auto& [k, t] : a.tensors)  // the global RNG is shared by the runs of this test process
      if (k != "rng.cpu") EXPECT_TRUE(torch::equal(t, b.tensors.at(k))) << k << " rank " << r;
  }
}
}  // namespace

TEST_F(Trainer, GpaAndScheduleFreeResumeBitExactly) {
  expect_resume_bit_exact("gpa", {"optim.name=gpa", "optim.mu_x=0.9"}, 1, request);
  expect_resume_bit_exact("sf", {"optim.name=schedule_free", "optim.decay=constant", "optim.decay_on=y"}, 1, request);
  // The checkpoint holds x (params), z, y, the second moment (no first: beta1 is the
  // interpolation weight) and schedule-free's averaging weights.
  auto c = train::load_checkpoint(newest(kRoot / "sf_full"));
  for (const char* k : {"params", "optim.z", "optim.y", "optim.exp_avg_sq", "optim.sf_weight_sum"})
    EXPECT_TRUE(c.tensors.count(k)) << k;
  EXPECT_FALSE(c.tensors.count("optim.exp_avg"));
  // params is x = y + (1 - 1/beta1)(z - y), not y.
  const double mu_y = 0.9;
  const auto& y = c.tensors.at("optim.y");
  const auto x = y + (1 - 1 / mu_y) * (c.tensors.at("optim.z") - y);
  EXPECT_LT((c.tensors.at("params") - x).abs().max().item<double>(), 1e-6);
  EXPECT_GT((c.tensors.at("params") - y).abs().max().item<double>(), 1e-4);
  EXPECT_EQ(c.meta["optim"], "schedule_free");
  // Memory: AdamW keeps m and v (8 B/param), GPA also z (12 B/param).
  const auto gpa_mem = first_event(kRoot / "gpa_full", "memory");
  EXPECT_EQ(gpa_mem["optimizer_state_bytes"].get<int64_t>(), 12 * gpa_mem["params"].get<int64_t>());
  train::run_training(request("adam_mem", {"train.steps=2", "train.eval_every=0"}));
  const auto adam_mem = first_event(kRoot / "adam_mem", "memory");
  EXPECT_EQ(adam_mem["optimizer_state_bytes"].get<int64_t>(), 8 * adam_mem["params"].get<int64_t>());
}

TEST_F(Trainer, GpaInsideDiLoCoResumesBitExactly) {
  // Two workers, rounds of H = 5: the stop at step 17 falls inside the fourth round.
  expect_resume_bit_exact("gpa_diloco", {"optim.name=gpa", "algo.name=diloco", "algo.H=5"}, 2, request);
  const auto mem = first_event(kRoot / "gpa_diloco_full", "memory");
  // DiLoCo adds the anchor theta and the outer momentum: 8 B/param (plus two round counters).
  EXPECT_EQ(mem["sync_state_bytes"].get<int64_t>(), 8 * mem["params"].get<int64_t>() + 16);
}

TEST_F(Trainer, ACheckpointOfAnotherOptimizerIsRefused) {
  train::run_training(request("optim_switch", {"train.steps=10", "train.eval_every=0"}));
  const auto before = read_file(newest(kRoot / "optim_switch"));
  train::TrainRequest r;
  r.quiet = true;
  r.resume_dir = (kRoot / "optim_switch").string();
  r.overrides = {"optim.name=gpa", "train.steps=20"};
  try {
    train::run_training(r);
    ADD_FAILURE() << "resuming an AdamW run as GPA must fail";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("optim is \"adamw\" in the checkpoint, \"gpa\" in this job"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(read_file(newest(kRoot / "optim_switch")), before);
}

// Issue 62, item 4: a resume with another codec was accepted silently, run.json rewritten as if
// the whole run had used it, and int4's error feedback dropped. A change to a setting the
// checkpoints' state depends on is refused naming it, and with --allow-change it is recorded at
// the step it takes effect, in run.json and metrics.jsonl.
TEST_F(Trainer, AResumeThatChangesTheStatesSettingsIsRefusedUnlessAllowedAndThenRecorded) {
  const fs::path run = kRoot / "codec_switch";
  train::run_training(request("codec_switch", {"cluster.workers=2", "algo.name=diloco", "algo.H=5", "algo.compression=int4",
                                               "train.steps=20", "train.stop_at=10", "train.checkpoint_every=5",
                                               "train.eval_every=0"}));
  const auto before = read_file(run / "run.json");
  auto resume = [&](std::vector<std::string> set, std::vector<std::string> allow) {
    train::TrainRequest r;
    r.quiet = true;
    r.resume_dir = run.string();
    r.overrides = std::move(set);
    r.allow_change = std::move(allow);
    return train::run_training(r);
  };
  auto expect_refused = [&](std::vector<std::string> set, const std::string& key, const std::string& values) {
    try {
      resume(set, {});
      ADD_FAILURE() << "a resume with " << set.front() << " was accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("'" + key + "'"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(values), std::string::npos) << e.what();
      EXPECT_NE(e.hint().find("--allow-change " + key), std::string::npos) << e.hint();
    }
  };
  expect_refused({"algo.compression=int8"}, "algo.compression", "algo.compression = \"int4\", this resume asks for \"int8\"");
  expect_refused({"algo.compression_chunk=128"}, "algo.compression_chunk", "= 0, this resume asks for 128");
  expect_refused({"algo.error_feedback=off"}, "algo.error_feedback", "\"auto\"");
  expect_refused({"algo.H=10"}, "algo.H", "= 5, this resume asks for 10");
  expect_refused({"algo.topology=1peer"}, "algo.topology", "\"1peer\"");
  EXPECT_THROW(resume({"algo.name=gasloc"}, {"algo.name"}), ConfigError);  // the checkpoints' algorithm: never
  EXPECT_THROW(resume({}, {"optim.lr"}), ConfigError);                      // not a key a resume refuses: a typo
  EXPECT_EQ(read_file(run / "run.json"), before);  // each refusal changed nothing

  // Allowed: the run continues, and both files say where the codec changed.
  const auto s = resume({"algo.compression=int8"}, {"algo.compression"});
  EXPECT_EQ(s.steps_done, 20);
  const auto doc = nlohmann::json::parse(read_file(run / "run.json"));
  EXPECT_EQ(doc["config"]["algo"]["compression"], "int8");
  ASSERT_EQ(doc["changes"].size(), 1u) << doc["changes"];
  EXPECT_EQ(doc["changes"][0], nlohmann::json({{"step", 10}, {"key", "algo.compression"}, {"old", "int4"}, {"new", "int8"}}));
  int events = 0;
  for (const auto& e : train::read_metrics(run))
    if (const auto* c = std::get_if<train::ConfigChangeEvent>(&e)) {
      ++events;
      EXPECT_EQ(c->step, 10);
      EXPECT_EQ(c->key, "algo.compression");
      EXPECT_EQ(c->old_value, "int4");
      EXPECT_EQ(c->new_value, "int8");
    }
  EXPECT_EQ(events, 1);
}

// ---------------------------------------------------------------------------------------------
// Two-phase checkpoints, integrity, counters across resume, run directories, divergence.

namespace {
// Every metrics line of a run without the fields that measure real time, sorted (worker threads
// write their lines in any order).
std::vector<std::string> metrics_without_wall_time(const fs::path& run) {
  std::vector<std::string> out;
  std::ifstream m(run / "metrics.jsonl");
  for (std::string line; std::getline(m, line);) {
    auto j = nlohmann::json::parse(line);
    j.erase("wall_time_s");
    j.erase("tokens_per_s");
    out.push_back(j.dump());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Makes the path a directory, so that writing a file there fails as a full disk would.
void block_path(const fs::path& p) { fs::create_directories(p); }

const std::vector<std::string> kCluster = {"cluster.workers=3", "algo.name=gasloc", "algo.topology=2peer", "algo.H=5",
                                           "train.steps=30", "train.eval_every=10", "train.checkpoint_every=10",
                                           "train.log_every=5"};
}  // namespace

TEST_F(Trainer, ARankThatFailsMidSaveLeavesTheRunResumable) {
  const auto full = train::run_training(request("two_phase_full", kCluster));
  // Rank 1 cannot write its step-20 file (rank 0 and 2 can): the step is never committed, every
  // rank stops, and --resume continues from step 10, as if nothing had happened.
  const fs::path run = kRoot / "two_phase";
  auto part = kCluster;
  part.push_back("train.stop_at=10");
  train::run_training(request("two_phase", part));
  block_path(run / "checkpoints" / "step-00000020" / "rank1.pt.tmp");
  train::TrainRequest again;
  again.quiet = true;
  again.resume_dir = run.string();
  EXPECT_THROW(train::run_training(again), Error);
  EXPECT_EQ(train::RunCheckpoints(run, 3).committed(0), (std::vector<int64_t>{10}));
  fs::remove_all(run / "checkpoints" / "step-00000020" / "rank1.pt.tmp");
  // What a write killed half-way leaves: removed when that rank commits again.
  const fs::path stale = run / "checkpoints" / "step-00000020" / "rank0.pt.tmp";
  write_file_atomic(stale, "half a checkpoint");
  const auto second = train::run_training(again);
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_EQ(second.train_losses.size(), 20u);  // steps 11..30
  EXPECT_EQ(second.final_val_loss, full.final_val_loss);
  for (int r = 0; r < 3; ++r) {
    auto a = train::load_checkpoint(newest(kRoot / "two_phase_full", r, 3));
    auto b = train::load_checkpoint(newest(run, r, 3));
    for (const auto& [k, t] : a.tensors)
      if (k != "rng.cpu") EXPECT_TRUE(torch::equal(t, b.tensors.at(k))) << k << " rank " << r;
  }
  // Every metric continues across the resume (bytes, virtual time, idle): the whole run's lines
  // equal the uninterrupted run's, real-time fields aside.
  EXPECT_EQ(metrics_without_wall_time(run), metrics_without_wall_time(kRoot / "two_phase_full"));
}

TEST_F(Trainer, AStepCommittedByOneRankIsResumedByAll) {
  const auto full = train::run_training(request("commit_full", kCluster));
  const fs::path run = kRoot / "commit_partial";
  auto part = kCluster;
  part.push_back("train.stop_at=10");
  train::run_training(request("commit_partial", part));
  // Rank 2 cannot record its commit of step 20 (it wrote the file; ranks 0 and 1 commit).
  block_path(run / "checkpoints" / "rank2.committed.tmp");
  train::TrainRequest r;
  r.quiet = true;
  r.resume_dir = run.string();
  EXPECT_THROW(train::run_training(r), Error);
  fs::remove_all(run / "checkpoints" / "rank2.committed.tmp");
  const train::RunCheckpoints c(run, 3);
  EXPECT_EQ(c.committed(0), (std::vector<int64_t>{20, 10}));
  EXPECT_EQ(c.committed(2), (std::vector<int64_t>{10}));
  const auto second = train::run_training(r);  // from step 20: rank 0's commit proves rank 2 wrote it
  EXPECT_EQ(second.train_losses.size(), 10u);
  EXPECT_EQ(second.final_val_loss, full.final_val_loss);
  EXPECT_EQ(metrics_without_wall_time(run), metrics_without_wall_time(kRoot / "commit_full"));
  // Mixed steps that no commit explains are refused, naming the rank.
  fs::remove(c.file(30, 1));
  try {
    train::run_training(r);
    ADD_FAILURE() << "a missing rank file was accepted";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("mixed steps: step 30 is committed, but rank 1"), std::string::npos) << e.what();
  }
}

TEST_F(Trainer, ADamagedCheckpointIsRefusedAndThePreviousStepOffered) {
  auto opts = kCluster;
  opts.push_back("train.stop_at=20");
  train::run_training(request("damaged", opts));
  const fs::path run = kRoot / "damaged";
  const fs::path f = train::RunCheckpoints(run, 3).file(20, 1);
  {  // 4 KB of garbage in the middle of the tensor data, in place (size and zip structure intact)
    std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(static_cast<std::streamoff>(fs::file_size(f) / 2));
    const std::string junk(4096, '\x5a');
    io.write(junk.data(), static_cast<std::streamsize>(junk.size()));
  }
  train::TrainRequest r;
  r.quiet = true;
  r.resume_dir = run.string();
  try {
    train::run_training(r);
    ADD_FAILURE() << "a damaged checkpoint was loaded";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("corrupt checkpoint"), std::string::npos) << e.what();
    EXPECT_NE(e.hint().find("--resume-step 10"), std::string::npos) << e.hint();
  }
  r.resume_step = 10;
  EXPECT_EQ(train::run_training(r).steps_done, 30);
}

TEST_F(Trainer, ARunDirectoryThatHoldsAnotherRunIsRefused) {
  train::run_training(request("taken", {"cluster.workers=2", "algo.name=diloco", "algo.H=5", "train.steps=10"}));
  // A multi-worker run's checkpoints count (the old guard looked for checkpoint.pt only).
  EXPECT_THROW(train::run_training(request("taken", {"train.steps=10"})), CheckpointError);
  // Another run's run.json and metrics, without a checkpoint: refused too, nothing appended.
  fs::remove_all(kRoot / "taken" / "checkpoints");
  const auto metrics = read_file(kRoot / "taken" / "metrics.jsonl");
  try {
    train::run_training(request("taken", {"train.steps=10", "optim.lr=0.001"}));
    ADD_FAILURE() << "a run directory of another configuration was reused";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("holds another run"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'algo.H'"), std::string::npos) << e.what();  // the first difference (keys sort)
  }
  EXPECT_EQ(read_file(kRoot / "taken" / "metrics.jsonl"), metrics);
  // The same job into a directory whose run died before its first checkpoint starts over, also
  // when that run.json was written before a setting existed (it lacks train.streams: one stream).
  train::run_training(request("died", {"train.steps=4", "train.streams=1"}));
  fs::remove_all(kRoot / "died" / "checkpoints");
  auto doc = nlohmann::json::parse(read_file(kRoot / "died" / "run.json"));
  ASSERT_TRUE(doc["config"]["train"].contains("streams"));
  doc["config"]["train"].erase("streams");
  write_file_atomic(kRoot / "died" / "run.json", doc.dump());
  EXPECT_EQ(train::run_training(request("died", {"train.steps=4", "train.streams=1"})).steps_done, 4);
  fs::remove_all(kRoot / "died" / "checkpoints");
  EXPECT_THROW(train::run_training(request("died", {"train.steps=4", "train.streams=2"})), CheckpointError);
  // The overlap variant of a run without overlap does nothing: another one is the same run.
  fs::remove_all(kRoot / "died" / "checkpoints");
  EXPECT_EQ(train::run_training(request("died", {"train.steps=4", "train.streams=1", "algo.overlap=eager"})).steps_done, 4);
  fs::remove_all(kRoot / "died" / "checkpoints");
  EXPECT_EQ(train::run_training(request("died", {"train.steps=4", "train.streams=1", "algo.overlap=delayed"})).steps_done, 4);
}

TEST_F(Trainer, ADivergingWorkerStopsTheRunBeforeItSends) {
  // lr = 10 makes the loss climb far above ln(257) = 5.5; the run stops with an error instead of
  // finishing "done" at loss 238, and keeps its last committed checkpoint.
  const auto opts = std::vector<std::string>{"optim.lr=10", "optim.warmup_steps=0", "optim.grad_clip=0",
                                             "train.steps=200", "train.checkpoint_every=1", "train.eval_every=0"};
  try {
    train::run_training(request("diverge", opts));
    ADD_FAILURE() << "a diverging run finished";
  } catch (const train::TrainingDiverged& e) {
    EXPECT_NE(std::string(e.what()).find("worker 0 diverged at step"), std::string::npos) << e.what();
    EXPECT_NE(e.hint().find("last committed checkpoint is step"), std::string::npos) << e.hint();
  }
  EXPECT_FALSE(train::RunCheckpoints(kRoot / "diverge", 1).committed(0).empty());
  EXPECT_THROW(train::run_training(request("inf_lr", {"optim.lr=inf"})), ConfigError);
}

// A resume from an older step that stops before the newer one (issue: rank0.committed listed 35
// and 40, step 35's file was gone and step 30 deleted, and every later --resume failed): the
// record keeps the step just written and the one before, and forgets the abandoned branch.
TEST_F(Trainer, AResumeFromAnOlderStepKeepsWhatItWroteAndDropsTheAbandonedBranch) {
  train::run_training(request("branch", {"train.steps=40", "train.checkpoint_every=10"}));
  const fs::path run = kRoot / "branch";
  const train::RunCheckpoints c(run, 1);
  ASSERT_EQ(c.committed(0), (std::vector<int64_t>{40, 30}));
  train::TrainRequest r;
  r.quiet = true;
  r.resume_dir = run.string();
  r.resume_step = 30;
  r.overrides = {"train.stop_at=35"};
  EXPECT_EQ(train::run_training(r).steps_done, 35);
  EXPECT_EQ(c.committed(0), (std::vector<int64_t>{35, 30}));
  EXPECT_TRUE(fs::exists(c.file(35, 0)));
  EXPECT_TRUE(fs::exists(c.file(30, 0)));
  EXPECT_FALSE(fs::exists(c.file(40, 0)));
  // Its evaluation at the step it stopped at is in the metrics (it was printed only).
  bool eval_at_35 = false;
  std::ifstream metrics(run / "metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    const auto j = nlohmann::json::parse(line);
    eval_at_35 = eval_at_35 || (j["event"] == "eval" && j["step"] == 35);
  }
  EXPECT_TRUE(eval_at_35);
  // The next resume continues from 35, and a step never committed is refused, listing the others.
  train::TrainRequest again;
  again.quiet = true;
  again.resume_dir = run.string();
  EXPECT_EQ(train::run_training(again).steps_done, 40);
  again.resume_step = 20;
  try {
    train::run_training(again);
    ADD_FAILURE() << "an uncommitted --resume-step was accepted";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("--resume-step 20 is not a committed checkpoint of this run (committed: rank 0: 40, 35)"),
              std::string::npos)
        << e.what();
  }
}

// A crash at each point of the two-phase commit leaves a run that resumes: files written but not
// committed (the previous commit stands), and a commit recorded before the old files went (the
// next commit removes them).
TEST_F(Trainer, ACrashAtEachPointOfTheCommitLeavesTheRunResumable) {
  train::run_training(request("crash_points", {"train.steps=20", "train.checkpoint_every=10"}));
  const fs::path run = kRoot / "crash_points";
  const train::RunCheckpoints c(run, 1);
  train::TrainRequest r;
  r.quiet = true;
  r.resume_dir = run.string();
  r.overrides = {"train.steps=40"};
  // Phase 1 only: step 30's file is there, the record still says 20.
  fs::create_directories(c.file(30, 0).parent_path());
  fs::copy_file(c.file(20, 0), c.file(30, 0));
  EXPECT_EQ(train::run_training(r).steps_done, 40);
  EXPECT_EQ(c.committed(0), (std::vector<int64_t>{40, 30}));
  // Phase 2 cut short: the record lists 40, the file of step 10 was never removed.
  fs::create_directories(c.file(10, 0).parent_path());
  fs::copy_file(c.file(30, 0), c.file(10, 0));
  r.overrides = {"train.steps=50"};
  EXPECT_EQ(train::run_training(r).steps_done, 50);
  EXPECT_EQ(c.committed(0), (std::vector<int64_t>{50, 40}));
  EXPECT_FALSE(fs::exists(c.file(10, 0)));
  EXPECT_FALSE(fs::exists(c.file(30, 0)));
}

// A damaged run directory: --repair drops what cannot be loaded, naming it, and resumes from the
// newest step every rank still holds.
TEST_F(Trainer, RepairDropsWhatIsMissingOrDamagedAndResumes) {
  auto opts = kCluster;
  opts.push_back("train.stop_at=20");
  train::run_training(request("repair", opts));
  const fs::path run = kRoot / "repair";
  const train::RunCheckpoints c(run, 3);
  fs::remove(c.file(20, 1));  // rank 1 lost its newest file
  train::TrainRequest r;
  r.quiet = true;
  r.resume_dir = run.string();
  EXPECT_THROW(train::run_training(r), CheckpointError);  // mixed steps, as before
  r.repair = true;
  testing::internal::CaptureStdout();
  const auto s = train::run_training(r);
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("repair: rank 1: committed step 20 dropped"), std::string::npos) << out;
  EXPECT_EQ(s.steps_done, 30);
  EXPECT_EQ(s.train_losses.size(), 20u);  // from step 10, the newest step all three hold
  for (int rank = 0; rank < 3; ++rank) EXPECT_EQ(c.committed(rank), (std::vector<int64_t>{30, 20})) << rank;
}

// One stop request often arrives twice at once (`timeout` signals its child, then its process
// group; a terminal and `gasloc launch` both pass on a Ctrl+C): it must count as one request, a
// checkpoint and exit 130, not as the second request that ends the process without one.
TEST(Signals, OneRequestDeliveredTwiceAtOnceIsOneRequest) {
  train::SignalScope scope;
  EXPECT_FALSE(train::stop_requested());
  std::raise(SIGTERM);
  std::raise(SIGINT);  // were it a second request, the process would end here
  EXPECT_TRUE(train::stop_requested());
}

TEST(SignalsDeathTest, ARequestASecondLaterEndsTheProcessSayingSo) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        train::SignalScope scope;
        std::raise(SIGINT);
        std::this_thread::sleep_for(std::chrono::milliseconds(1100));
        std::raise(SIGINT);
        std::this_thread::sleep_for(std::chrono::seconds(5));
        std::exit(0);
      },
      testing::KilledBySignal(SIGINT), "second interrupt: exiting now without a checkpoint");
}

// ---------------------------------------------------------------------------------------------
// A run whose model, data and optimizer are the user's (train/user_run.hpp, the Python API).

namespace {

std::string config_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "no ConfigError";
}

// A run directory of its own under kRoot.
std::string user_run_dir(const std::string& name) { return (kRoot / ("user_" + name)).string(); }

std::vector<std::pair<std::string, torch::Tensor>> named(const std::vector<torch::Tensor>& ts) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (size_t i = 0; i < ts.size(); ++i) out.emplace_back(fmt::format("p{}", i), ts[i]);
  return out;
}

std::unique_ptr<comm::Cluster> inproc_cluster(int workers) {
  comm::ClusterOptions o;
  o.workers = workers;
  o.timeout_s = 30;
  o.network = [](int) { return comm::NetworkModel{}; };
  return comm::make_cluster(o);
}

}  // namespace

// The keys the user owns in PyTorch, or that the Python API cannot run yet, are refused by name
// with the reason, from the settings and from the job file alike; the others parse as the CLI's.
TEST(UserJob, RefusesTheKeysTheUserOwnsAndNamesBadOnes) {
  const std::string model = config_error_of([] { train::user_job("", {"model.dim=64"}); });
  EXPECT_NE(model.find("'model.dim'"), std::string::npos) << model;
  EXPECT_NE(model.find("the model is yours"), std::string::npos) << model;
  const std::string steps = config_error_of([] { train::user_job("", {"train.steps=10"}); });
  EXPECT_NE(steps.find("'train.steps'"), std::string::npos) << steps;
  const fs::path file = kRoot / "user_job.toml";
  fs::create_directories(kRoot);
  std::ofstream(file) << "[algo]\nname = \"diloco\"\n[optim]\nlr = 0.1\n";
  const std::string in_file = config_error_of([&] { train::user_job(file.string(), {}); });
  EXPECT_NE(in_file.find("'optim.lr' in " + file.string()), std::string::npos) << in_file;
  const std::string unknown = config_error_of([] { train::user_job("", {"algo.Hx=3"}); });
  EXPECT_NE(unknown.find("'algo.Hx'"), std::string::npos) << unknown;
  const std::string bad_value = config_error_of([] { train::user_job("", {"algo.H=0"}); });
  EXPECT_NE(bad_value.find("algo.H"), std::string::npos) << bad_value;
  // Elastic: a process run under gasloc launch --elastic (which sets it), not one process alone.
  const std::string elastic = config_error_of([] { train::user_job("", {"algo.name=diloco", "cluster.elastic=true"}); });
  EXPECT_NE(elastic.find("an elastic Python run is one of processes"), std::string::npos) << elastic;
  EXPECT_TRUE(
      train::user_job("", {"algo.name=diloco", "cluster.elastic=true", "cluster.heartbeat_timeout_s=5"}, true).cluster.elastic);
  const std::string faults = config_error_of([] { train::user_job("", {"faults.poison=[]"}, true); });
  EXPECT_NE(faults.find("'faults.poison'"), std::string::npos) << faults;
  EXPECT_NE(faults.find("a Python rank is a process"), std::string::npos) << faults;
  EXPECT_EQ(train::user_job("", {"algo.name=allreduce"}).algo.name, "allreduce") << "run.sync_gradients()";
  EXPECT_EQ(train::user_job("", {"algo.name=diloco", "algo.H=7"}).algo.H, 7);
  EXPECT_EQ(train::user_job("", {}).cluster.backend, "inproc") << "alone";
  // Under a launcher the process is one rank of the job: gloo, and the world is WORLD_SIZE.
  const train::JobConfig launched = train::user_job("", {"algo.name=gasloc", "algo.topology=1peer"}, /*launched=*/true);
  EXPECT_EQ(launched.cluster.backend, "gloo");
  const std::string alone = config_error_of([] { train::user_job("", {"cluster.backend=inproc"}, true); });
  EXPECT_NE(alone.find("'cluster.backend'"), std::string::npos) << alone;
  EXPECT_EQ(train::user_key_refusal("algo.H"), "");
}

// Alone: the user's tensors become views of one flat buffer (the same tensors), DiLoCo's outer
// Nesterov step lands every H steps as OuterNesterov defines it (one worker: the mean is its own
// parameters), and metrics.jsonl holds the losses given, read back by the metrics reader.
TEST(UserRun, AloneRebindsTheParametersAndStepsDiLoCoEveryH) {
  const train::JobConfig job = train::user_job("", {"algo.name=diloco", "algo.H=2", "algo.outer_lr=0.5",
                                                    "algo.outer_momentum=0.9", "train.log_every=1",
                                                    "train.run_dir=" + user_run_dir("alone")});
  auto w = torch::tensor({{1.0f, 2.0f}, {3.0f, 4.0f}});
  auto b = torch::tensor({0.5f});
  auto cluster = train::open_user_cluster(job);
  train::UserRun run(job, named({w, b}), *cluster, 0, "SGD");
  EXPECT_EQ(run.world(), 1);
  EXPECT_EQ(w.data_ptr<float>(), run.params().data().data_ptr<float>()) << "the matrix is the buffer's first view";
  const torch::Tensor theta0 = run.params().data().clone();
  torch::NoGradGuard no_grad;
  w.add_(1.0f);  // the user's inner steps
  EXPECT_FALSE(run.step(2.5, 0.1));
  b.sub_(1.0f);
  EXPECT_TRUE(run.step(2.0, 0.1));
  const torch::Tensor phi = torch::cat({(theta0.narrow(0, 0, 4) + 1), theta0.narrow(0, 4, 1) - 1});
  const torch::Tensor delta = theta0 - phi;  // b = delta at the first round
  EXPECT_TRUE(torch::allclose(run.params().data(), theta0 - 0.5 * (delta + 0.9 * delta)));
  EXPECT_TRUE(torch::allclose(w.reshape({-1}), run.params().data().narrow(0, 0, 4))) << "still the user's tensor";
  run.close();
  std::vector<double> losses;
  for (const auto& e : train::read_metrics(run.run_dir()))
    if (const auto* t = std::get_if<train::TrainEvent>(&e)) losses.push_back(t->train_loss);
  EXPECT_EQ(losses, (std::vector<double>{2.5, 2.0}));
}

// Parameters that cannot live in one fp32 buffer are refused, naming the parameter.
TEST(UserRun, RefusesParametersOfAnotherDtype) {
  const train::JobConfig job = train::user_job("", {"train.run_dir=" + user_run_dir("dtype")});
  auto cluster = train::open_user_cluster(job);
  const std::string e = config_error_of([&] {
    train::UserRun run(job, named({torch::ones({2}), torch::ones({2}, torch::kFloat64)}), *cluster, 0, "SGD");
  });
  EXPECT_NE(e.find("parameter 'p1' is Double"), std::string::npos) << e;
}

// Two ranks: rank 1 starts from rank 0's parameters (it need not seed alike), and a DiLoCo round
// averages the two workers' parameters, leaving both with the same ones.
TEST(UserRun, RanksStartFromRankZerosParametersAndAverageAtARound) {
  const train::JobConfig job = train::user_job("", {"algo.name=diloco", "algo.H=1", "algo.outer_lr=1.0",
                                                    "algo.outer_momentum=0", "train.run_dir=" + user_run_dir("two")});
  auto cluster = inproc_cluster(2);
  std::vector<torch::Tensor> final(2), start(2);
  cluster->run([&](int r, comm::Communicator&) {
    auto p = torch::full({3}, static_cast<float>(10 * (r + 1)));
    train::UserRun run(job, named({p}), *cluster, r, "SGD");
    start[r] = p.clone();
    {
      torch::NoGradGuard no_grad;
      p.add_(static_cast<float>(r + 1));  // rank 0 steps by 1, rank 1 by 2
    }
    run.step(std::nullopt, 0.0);
    final[r] = p.clone();
    run.close();
  });
  EXPECT_TRUE(torch::equal(start[1], torch::full({3}, 10.0f))) << "rank 1 took rank 0's parameters";
  // outer lr 1, no momentum: theta <- mean of the workers' parameters.
  EXPECT_TRUE(torch::allclose(final[0], torch::full({3}, 11.5f)));
  EXPECT_TRUE(torch::equal(final[0], final[1]));
}
