// Using a trained run: finding each rank's checkpoint (one directory or several hosts'), the
// average model against the ranks' own parameters, its score against the trainer's, its export,
// and sampling (deterministic, bounded).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "gasloc/core/error.hpp"
#include "gasloc/data/dataset.hpp"
#include "gasloc/model/hf_export.hpp"
#include "gasloc/train/checkpoint.hpp"
#include "gasloc/train/inference.hpp"
#include "gasloc/train/run_files.hpp"
#include "gasloc/train/run_lock.hpp"
#include "gasloc/study/run_summary.hpp"
#include "gasloc/study/runs_csv.hpp"
#include "gasloc/train/trainer.hpp"
#include "test_util.hpp"

using namespace gasloc;
namespace fs = std::filesystem;

namespace {
const fs::path kRoot = test_util::temp_root("test_run_files");

class RunFiles : public ::testing::Test {
 protected:
  // A 2-worker DiLoCo run stopped between rounds (10 steps, H = 4), so the workers differ.
  static void SetUpTestSuite() {
    test_util::make_byte_dataset(kRoot);
    train::TrainRequest r;
    r.quiet = true;
    r.overrides = {"model.preset=nano", "data.dir=" + (kRoot / "data").string(), "data.seq_len=32", "data.batch_size=4",
                   "data.val_batches=2", "train.steps=10", "train.eval_every=5", "train.log_every=5", "optim.lr=0.003",
                   "optim.warmup_steps=2", "train.threads=1", "cluster.workers=2", "algo.name=diloco", "algo.H=4",
                   "train.run_dir=" + run().string()};
    summary_ = train::run_training(r);
  }
  static void TearDownTestSuite() { fs::remove_all(kRoot); }
  static fs::path run() { return kRoot / "run"; }
  static torch::Tensor rank_params(const fs::path& file) { return train::load_checkpoint(file).tensors.at("params"); }
  // Rank r's file of the last step (10), in `dir`'s layout.
  static fs::path ck(int r, const fs::path& dir = run()) { return train::RunCheckpoints(dir, 2).file(10, r); }
  // Rank r's checkpoint and commit record, copied to another host's run directory.
  static void copy_rank(int r, const fs::path& to) {
    fs::create_directories(ck(r, to).parent_path());
    fs::copy_file(ck(r), ck(r, to), fs::copy_options::overwrite_existing);
    const auto marker = fmt::format("rank{}.committed", r);
    fs::copy_file(run() / "checkpoints" / marker, to / "checkpoints" / marker, fs::copy_options::overwrite_existing);
  }
  static train::TrainSummary summary_;
};
train::TrainSummary RunFiles::summary_;
}  // namespace

TEST_F(RunFiles, FindsEveryRanksCheckpoint) {
  const auto files = train::rank_checkpoint_files({run()}, 2);
  ASSERT_EQ(files.size(), 2u);
  EXPECT_EQ(files[0], ck(0));
  EXPECT_EQ(files[1], ck(1));
  EXPECT_EQ(train::rank_checkpoint_files({run()}, 2, {1}), std::vector<fs::path>{ck(1)});
  try {
    train::rank_checkpoint_files({run()}, 3);
    ADD_FAILURE() << "rank 2 does not exist";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("rank(s) 2 have no checkpoint of step 10"), std::string::npos) << e.what();
    EXPECT_NE(e.hint().find("--run DIR --run DIR2"), std::string::npos) << e.hint();
  }
  EXPECT_THROW(train::rank_checkpoint_files({kRoot / "data"}, 1), CheckpointError);
}

TEST_F(RunFiles, AverageModelIsTheMeanOfTheRanksAndScoresAsTheTrainer) {
  const auto p0 = rank_params(ck(0)), p1 = rank_params(ck(1));
  ASSERT_FALSE(torch::equal(p0, p1)) << "the workers should differ between rounds";
  train::RunModel avg = train::load_run_model({run()});
  EXPECT_EQ(avg.step, 10);
  EXPECT_EQ(avg.worker, train::kAverageModel);
  EXPECT_TRUE(torch::allclose(avg.flat.data(), (p0 + p1) / 2, 0, 1e-7));
  train::RunModel w1 = train::load_run_model({run()}, 1);
  EXPECT_TRUE(torch::equal(w1.flat.data(), p1));
  EXPECT_THROW(train::load_run_model({run()}, 2), ConfigError);

  // The same batches and mean as the trainer's final evaluation of the average model.
  const auto ds = data::Dataset::open(kRoot / "data");
  const auto tok = data::Tokenizer::byte_level();
  const auto s = train::score_stream(avg.model, *ds.val, 4, 32, 2, &tok);
  EXPECT_NEAR(s.loss, summary_.final_val_loss, 1e-6);
  EXPECT_EQ(s.tokens, 2 * 4 * 32);
  // Byte-level: every scored token is one byte except document separators.
  EXPECT_GT(s.bytes, s.tokens - 20);
  EXPECT_LE(s.bytes, s.tokens);
  EXPECT_NEAR(s.bits_per_byte, s.loss * static_cast<double>(s.tokens) / (static_cast<double>(s.bytes) * std::log(2.0)), 1e-12);

  // The export holds exactly the average model.
  model::export_hf(kRoot / "hf", avg.model);
  model::Llama back(model::read_hf_config(kRoot / "hf" / "config.json"));
  model::import_hf(kRoot / "hf", back);
  const auto again = train::score_stream(back, *ds.val, 4, 32, 2, &tok);
  EXPECT_EQ(again.loss, s.loss);
}

TEST_F(RunFiles, AverageFromSeveralHostsDirectories) {
  // As a Gloo run over two hosts leaves it: rank 1's checkpoint only in the other directory.
  const fs::path host0 = kRoot / "host0", host1 = kRoot / "host1";
  fs::create_directories(host0);
  fs::create_directories(host1);
  fs::copy_file(run() / "run.json", host0 / "run.json", fs::copy_options::overwrite_existing);
  copy_rank(0, host0);
  copy_rank(1, host1);
  const auto whole = train::load_run_model({run()});
  const auto split = train::load_run_model({host1, host0});  // run.json found in either
  EXPECT_TRUE(torch::equal(split.flat.data(), whole.flat.data()));
  EXPECT_EQ(split.info.dir, host0);
  EXPECT_THROW(train::load_run_model({host0}), CheckpointError);
  EXPECT_TRUE(torch::equal(train::load_run_model({host0}, 0).flat.data(), rank_params(ck(0))));
  // A rank found twice, in two different files, is refused rather than guessed.
  copy_rank(1, host0);
  try {
    train::load_run_model({host0, host1});
    ADD_FAILURE() << "rank 1 is in both directories";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("more than one"), std::string::npos) << e.what();
  }
}

TEST_F(RunFiles, SamplingIsDeterministicAndBounded) {
  train::RunModel m = train::load_run_model({run()});
  const std::vector<int> prompt = {256, 'T', 'h', 'e'};
  train::SampleOptions o;
  o.max_tokens = 12;
  o.temperature = 1.0;
  o.top_k = 0;
  o.seed = 7;
  const auto a = train::sample(m.model, prompt, o), b = train::sample(m.model, prompt, o);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.tokens.size(), 12u);
  EXPECT_FALSE(a.stopped);
  o.seed = 8;
  EXPECT_NE(train::sample(m.model, prompt, o).tokens, a.tokens);
  // Greedy: each token is the argmax of the model's logits after the sequence so far.
  o.temperature = 0;
  o.max_tokens = 3;
  const auto g = train::sample(m.model, prompt, o);
  ASSERT_EQ(g.tokens.size(), 3u);
  std::vector<int64_t> seq(prompt.begin(), prompt.end());
  for (int t : g.tokens) {
    torch::NoGradGuard no_grad;
    const auto logits = m.model->forward(torch::tensor(seq).unsqueeze(0))[0][-1];
    EXPECT_EQ(logits.argmax().item<int64_t>(), t);
    seq.push_back(t);
  }
  // top_k = 1 is greedy too; a stop token ends the text early.
  o.temperature = 1.0;
  o.top_k = 1;
  EXPECT_EQ(train::sample(m.model, prompt, o).tokens, g.tokens);
  o.stop_id = g.tokens[0];
  const auto stopped = train::sample(m.model, prompt, o);
  EXPECT_TRUE(stopped.stopped);
  EXPECT_EQ(stopped.tokens, std::vector<int>{g.tokens[0]});
  EXPECT_THROW(train::sample(m.model, {}, o), ConfigError);
  EXPECT_THROW(train::sample(m.model, {9999}, o), ConfigError);
}

// Bits a parameter a round, from the bytes the workers counted: DiLoCo's uncompressed ring
// all-reduce sends 2 (n - 1) / n x 32 = 32 bits at n = 2 (the 10 steps logged at step 10 hold 2
// rounds of H = 4); its int8 twin 2 (n - 1) / n x (8 + 32/256) = 8.125, plus the padding of its
// last shard (under 1%). The label names the codec.
TEST_F(RunFiles, ReportsBitsPerParameterPerRound) {
  const auto plain = study::read_run_summary(run());
  EXPECT_NEAR(plain.bits_per_param_round, 32.0, 1e-9);
  EXPECT_EQ(plain.label, "diloco");
  train::TrainRequest r;
  r.quiet = true;
  r.overrides = {"model.preset=nano", "data.dir=" + (kRoot / "data").string(), "data.seq_len=32", "data.batch_size=4",
                 "data.val_batches=2", "train.steps=8", "train.eval_every=4", "train.log_every=4", "train.threads=1",
                 "cluster.workers=2", "algo.name=diloco", "algo.H=4", "algo.compression=int8",
                 "train.run_dir=" + (kRoot / "int8").string()};
  train::run_training(r);
  const auto int8 = study::read_run_summary(kRoot / "int8");
  EXPECT_EQ(int8.label, "diloco+int8");
  EXPECT_GE(int8.bits_per_param_round, 8.125);
  EXPECT_LT(int8.bits_per_param_round, 8.125 * 1.01);
  // Priced as the 134m model in bf16, bits are of its parameters: 16 for the uncompressed ring at
  // n = 2, 8.125 for int8 (a message's price scales with its size against this run's own).
  for (const std::string c : {"none", "int8"}) {
    auto priced = r;
    priced.overrides.back() = "train.run_dir=" + (kRoot / ("priced_" + c)).string();
    priced.overrides.push_back("algo.compression=" + c);
    priced.overrides.push_back("network.simulated_model=134m:bf16");
    train::run_training(priced);
    const auto got = study::read_run_summary(kRoot / ("priced_" + c));
    EXPECT_GT(got.priced_params, 100'000'000);
    const double want = c == "none" ? 16.0 : 8.125;
    EXPECT_GT(got.bits_per_param_round, want * 0.999) << c;
    EXPECT_LT(got.bits_per_param_round, want * 1.01) << c;
  }
}

TEST_F(RunFiles, LabelsAreUniqueAndCsvIsTidy) {
  EXPECT_EQ(study::run_labels({"a/run", "b/run", "c/other/"}), (std::vector<std::string>{"a/run", "b/run", "other"}));
  EXPECT_EQ(study::run_labels({"x/a/run", "y/a/run"}), (std::vector<std::string>{"x/a/run", "y/a/run"}));
  const std::string csv = study::runs_csv({run().string()}, {"r,1"});
  std::vector<std::string> lines;
  for (size_t at = 0; at < csv.size();) {
    const size_t nl = csv.find('\n', at);
    lines.push_back(csv.substr(at, nl - at));
    at = nl + 1;
  }
  ASSERT_FALSE(lines.empty());
  std::string header = "run,event,worker,step";
  for (const auto& c : study::kCsvColumns) header += "," + c;
  EXPECT_EQ(lines[0], header);
  // 10 steps, log_every 5, 2 workers: 4 train rows; evaluations at 5 and 10: 2 eval rows and
  // 2 x 2 eval_worker rows.
  int train_rows = 0, eval_rows = 0, worker_rows = 0;
  const size_t columns = 4 + study::kCsvColumns.size();
  for (size_t i = 1; i < lines.size(); ++i) {
    ASSERT_EQ(lines[i].rfind("\"r,1\",", 0), 0u) << lines[i];  // a comma in a name is quoted
    const std::string rest = lines[i].substr(6);
    EXPECT_EQ(static_cast<size_t>(std::count(rest.begin(), rest.end(), ',')) + 2, columns) << lines[i];
    train_rows += rest.rfind("train,", 0) == 0;
    eval_rows += rest.rfind("eval,,", 0) == 0;
    worker_rows += rest.rfind("eval_worker,", 0) == 0;
  }
  EXPECT_EQ(train_rows, 4);
  EXPECT_EQ(eval_rows, 2);
  EXPECT_EQ(worker_rows, 4);
  EXPECT_NE(csv.find("\"r,1\",eval,,10,,"), std::string::npos) << csv;  // the average model's row at step 10
}

// An elastic run's evaluations list their members: each own-model loss goes to its id, not to
// its position (each Gloo rank writes its own line, members = [itself]).
TEST(RunsCsv, AnElasticEvaluationsLossesGoToTheirMembersIds) {
  const fs::path dir = kRoot / "elastic_csv";
  fs::create_directories(dir);
  {
    std::ofstream f(dir / "metrics.jsonl");
    for (int id : {3, 6})
      f << fmt::format(R"({{"event":"eval","members":[{}],"step":100,"val_loss":0.{},"version":4,"worker":{},)"
                       R"("worker_val_loss":[0.{}],"consensus_distance":0.0,"bytes_sent":0,"eval_time_s":0.0,)"
                       R"("virtual_time_s":1.0,"wall_time_s":1.0}})"
                       "\n",
                       id, id, id, id);
  }
  const std::string csv = study::runs_csv({dir.string()}, {"e"});
  EXPECT_NE(csv.find("e,eval_worker,3,100,,0.3,"), std::string::npos) << csv;
  EXPECT_NE(csv.find("e,eval_worker,6,100,,0.6,"), std::string::npos) << csv;
  EXPECT_EQ(csv.find("e,eval_worker,0,"), std::string::npos) << csv;
}

// One run directory, one job (train/run_lock.hpp): another process holding a rank's byte is
// named by pid; ranks of the same job (other bytes) do not refuse each other; the lock goes with
// its holder, killed or not.
TEST(RunDirLock, AnotherProcessIsRefusedWithItsPidAndItsLockDiesWithIt) {
  const fs::path dir = kRoot / "locked";
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  if (child == 0) {
    try {
      train::RunDirLock held(dir, {0, 1});
      [[maybe_unused]] auto n = ::write(ready[1], "x", 1);
      ::pause();
    } catch (...) {
    }
    ::_exit(1);
  }
  // The holder goes however this test ends (a failed assertion returns early).
  struct KillOnExit {
    pid_t pid;
    ~KillOnExit() {
      if (pid > 0) ::kill(pid, SIGKILL), ::waitpid(pid, nullptr, 0);
    }
  } holder{child};
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  try {
    train::RunDirLock second(dir, {1});
    FAIL() << "a second process locked rank 1's part";
  } catch (const CheckpointError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("is in use: rank 1's part is held by process " + std::to_string(child)), std::string::npos) << m;
  }
  { train::RunDirLock other_rank(dir, {2}); }  // a rank the holder does not own
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  holder.pid = -1;
  train::RunDirLock after(dir, {0, 1});  // the kernel released the dead holder's lock
  ::close(ready[0]);
  ::close(ready[1]);
}
