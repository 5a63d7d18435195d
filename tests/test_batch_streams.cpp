// train.streams: a batch split into row groups on threads of their own (train/batch_streams.hpp)
// against the one-thread step it replaces. The reference is model->loss(x, y).backward() on the
// whole batch; the streams must give its loss and gradients on many shapes, both model paths,
// the same bits on every run, clear errors, and in the trainer the same loss curve and a
// bit-exact resume.
#include <gtest/gtest.h>

#include <filesystem>
#include <thread>

#include <nlohmann/json.hpp>

#include "gasloc/core/atomic_file.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/core/flat_params.hpp"
#include "gasloc/model/llama.hpp"
#include "gasloc/train/batch_streams.hpp"
#include "gasloc/train/checkpoint.hpp"
#include "gasloc/train/job_config.hpp"
#include "gasloc/train/trainer.hpp"
#include "test_util.hpp"

using namespace gasloc;
namespace fs = std::filesystem;

namespace {
// Tolerance of a stream-split gradient against the whole batch's, relative to the largest
// entry: both are fp32 sums of the same products over the batch's rows in another order.
constexpr double kTol = 1e-5;

double rel_err(const torch::Tensor& a, const torch::Tensor& b) {
  const double scale = std::max(b.abs().max().item<double>(), 1e-30);
  return (a - b).abs().max().item<double>() / scale;
}

model::Llama small_model(bool fused) {
  auto c = model::LlamaConfig::preset("nano");
  c.vocab_size = 97;
  c.fused = fused;
  model::Llama m(c);
  m->init_weights(3);
  return m;
}

struct Step {
  double loss = 0;
  std::vector<torch::Tensor> grads;
};

// One step's loss and gradients, through `streams` (0 = the reference: the whole batch inline).
Step step(model::Llama& m, FlatParams& flat, const torch::Tensor& x, const torch::Tensor& y, int streams) {
  flat.zero_grad();
  Step s;
  if (streams == 0) {
    auto loss = m->loss(x, y);
    loss.backward();
    s.loss = loss.item<double>();
  } else {
    train::BatchStreams bs(streams);
    s.loss = bs.loss_backward(m, x, y, torch::kCPU, "fp32");
  }
  for (const auto& p : m->parameters()) s.grads.push_back(p.grad().clone());
  return s;
}
}  // namespace

TEST(BatchStreams, LossAndGradientsMatchTheWholeBatchOnManyShapes) {
  for (bool fused : {true, false})
    for (int64_t B : {2, 4, 8})
      for (int64_t T : {8, 24}) {
        auto m = small_model(fused);
        FlatParams flat(m->hf_parameters());
        torch::manual_seed(B * 100 + T);
        const auto x = torch::randint(0, 97, {B, T}, torch::kInt64), y = torch::randint(0, 97, {B, T}, torch::kInt64);
        const Step ref = step(m, flat, x, y, 0);
        for (int streams : {2, 4, 8}) {
          if (B % streams != 0) continue;
          const Step s = step(m, flat, x, y, streams);
          const std::string what = "fused=" + std::to_string(fused) + " B=" + std::to_string(B) + " T=" +
                                   std::to_string(T) + " streams=" + std::to_string(streams);
          EXPECT_NEAR(s.loss, ref.loss, 1e-6 * ref.loss) << what;
          ASSERT_EQ(s.grads.size(), ref.grads.size());
          for (size_t i = 0; i < ref.grads.size(); ++i) EXPECT_LT(rel_err(s.grads[i], ref.grads[i]), kTol) << what << " param " << i;
        }
      }
}

TEST(BatchStreams, TheSameBitsOnEveryRun) {
  auto m = small_model(true);
  FlatParams flat(m->hf_parameters());
  torch::manual_seed(5);
  const auto x = torch::randint(0, 97, {8, 16}, torch::kInt64), y = torch::randint(0, 97, {8, 16}, torch::kInt64);
  for (int streams : {2, 4}) {
    const Step first = step(m, flat, x, y, streams);
    for (int run = 0; run < 5; ++run) {
      const Step again = step(m, flat, x, y, streams);
      EXPECT_EQ(again.loss, first.loss) << "streams=" << streams;
      for (size_t i = 0; i < first.grads.size(); ++i)
        EXPECT_TRUE(torch::equal(again.grads[i], first.grads[i])) << "streams=" << streams << " param " << i;
    }
  }
}

TEST(BatchStreams, AnErrorInAStreamIsRethrownAndTheStreamsGoOn) {
  auto m = small_model(true);
  FlatParams flat(m->hf_parameters());
  train::BatchStreams bs(2);
  const auto x = torch::randint(0, 97, {4, 8}, torch::kInt64);
  auto y = torch::randint(0, 97, {4, 8}, torch::kInt64);
  y[3][2] = 500;  // outside the vocabulary, in the second stream's rows
  flat.zero_grad();
  try {
    bs.loss_backward(m, x, y, torch::kCPU, "fp32");
    ADD_FAILURE() << "a target outside the vocabulary must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("outside the vocabulary"), std::string::npos) << e.what();
  }
  y[3][2] = 1;
  flat.zero_grad();
  EXPECT_TRUE(std::isfinite(bs.loss_backward(m, x, y, torch::kCPU, "fp32")));
  // A batch that does not split evenly is a clear error, not a silent remainder.
  const auto x3 = torch::randint(0, 97, {3, 8}, torch::kInt64);
  try {
    bs.loss_backward(m, x3, x3, torch::kCPU, "fp32");
    ADD_FAILURE() << "3 rows into 2 streams must be refused";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("train.streams"), std::string::npos) << e.what();
  }
}

TEST(BatchStreams, TheJobRefusesAStreamCountThatDoesNotFit) {
  for (const auto& [bad, needle] : std::vector<std::pair<std::string, std::string>>{
           {"train.streams=3", "data.batch_size (4)"}, {"train.streams=-1", "[0, 64]"}, {"train.streams=65", "[0, 64]"}}) {
    try {
      train::load_job("", {"data.batch_size=4", bad});
      ADD_FAILURE() << bad << " must be refused";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("train.streams"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  }
  try {
    train::load_job("", {"data.batch_size=4", "train.streams=2", "train.device=cuda"});
    ADD_FAILURE() << "streams on a GPU must be refused";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("train.streams"), std::string::npos) << e.what();
  }
}

TEST(BatchStreams, EvaluationOverStreamsHasTheBitsOfOneThread) {
  // Whole batches spread over the streams, summed in batch order: the same bits as one thread,
  // for batch counts below, at and above the stream count.
  auto m = small_model(true);
  for (int streams : {2, 3})
    for (int n : {1, 3, 5}) {
      std::vector<data::Batch> batches;
      for (int i = 0; i < n; ++i) {
        torch::manual_seed(10 * n + i);
        batches.push_back({torch::randint(0, 97, {2, 16}, torch::kInt64), torch::randint(0, 97, {2, 16}, torch::kInt64)});
      }
      double serial = 0;
      {
        torch::NoGradGuard no_grad;
        for (const auto& b : batches) serial += m->loss(b.inputs, b.targets).item<double>();
      }
      serial /= n;
      train::BatchStreams bs(streams);
      EXPECT_EQ(bs.mean_loss(m, batches, torch::kCPU), serial) << streams << " streams, " << n << " batches";
    }
}

TEST(BatchStreams, AutoPlansOneStreamPerCoreForAWorkerAlone) {
  // (setting, device, batch, world, cores) -> streams
  EXPECT_EQ(train::planned_streams(3, "cpu", 6, 1, 2), 3);   // a setting is kept
  EXPECT_EQ(train::planned_streams(1, "cpu", 8, 1, 16), 1);
  EXPECT_EQ(train::planned_streams(0, "cpu", 8, 1, 2), 2);   // one per core
  EXPECT_EQ(train::planned_streams(0, "cpu", 8, 1, 16), 8);  // no more than the batch's rows
  EXPECT_EQ(train::planned_streams(0, "cpu", 6, 1, 4), 3);   // the largest count dividing the batch
  EXPECT_EQ(train::planned_streams(0, "cpu", 7, 1, 2), 1);
  EXPECT_EQ(train::planned_streams(0, "cpu", 8, 1, 1), 1);   // one core
  EXPECT_EQ(train::planned_streams(0, "cpu", 256, 1, 128), 64);
  EXPECT_EQ(train::planned_streams(0, "cpu", 8, 8, 2), 1);   // in-process workers are the threads
  EXPECT_EQ(train::planned_streams(0, "cuda", 8, 1, 2), 1);  // a GPU parallelizes each operation
  EXPECT_EQ(train::load_job("", {}).train.streams, 0);        // auto is the default
}

// In the trainer, on real data: two streams follow one stream's loss curve (1e-4 relative at
// every step over 50 steps) and resume bit for bit.
class StreamsTrainer : public ::testing::Test {
 protected:
  static inline const fs::path kRoot = test_util::temp_root("test_batch_streams");
  static void SetUpTestSuite() { test_util::make_byte_dataset(kRoot); }
  static void TearDownTestSuite() { fs::remove_all(kRoot); }
  static train::TrainRequest request(const std::string& run, std::vector<std::string> extra) {
    extra.insert(extra.begin(), "train.steps=50");
    return test_util::nano_request(kRoot, run, std::move(extra));
  }
};

TEST_F(StreamsTrainer, TwoStreamsFollowOneStreamsLossCurveAndResumeBitExactly) {
  const auto one = train::run_training(request("one", {"train.streams=1"}));
  const auto two = train::run_training(request("two", {"train.streams=2"}));
  ASSERT_EQ(one.train_losses.size(), 50u);
  ASSERT_EQ(two.train_losses.size(), 50u);
  double worst = 0;
  for (size_t k = 0; k < 50; ++k) worst = std::max(worst, std::abs(two.train_losses[k] - one.train_losses[k]) / one.train_losses[k]);
  EXPECT_LT(worst, 1e-4);
  EXPECT_GT(worst, 0.0);  // the streams did run: another summation order, other last bits
  EXPECT_LT(one.train_losses.back(), one.train_losses.front() - 0.5);  // it learned

  const auto first = train::run_training(request("halves", {"train.streams=2", "train.stop_at=17"}));
  train::TrainRequest again;
  again.quiet = true;
  again.resume_dir = (kRoot / "halves").string();
  const auto second = train::run_training(again);
  ASSERT_EQ(second.train_losses.size(), 33u);
  for (size_t i = 0; i < 17; ++i) EXPECT_EQ(first.train_losses[i], two.train_losses[i]) << "step " << i + 1;
  for (size_t i = 0; i < 33; ++i) EXPECT_EQ(second.train_losses[i], two.train_losses[17 + i]) << "step " << 18 + i;
  EXPECT_EQ(second.final_val_loss, two.final_val_loss);
}

TEST_F(StreamsTrainer, TheDefaultRunsThePlannedStreamsAndRecordsThem) {
  const int64_t planned = train::planned_streams(0, "cpu", 4, 1, std::thread::hardware_concurrency());
  const auto by_default = train::run_training(request("auto", {"train.steps=12"}));
  const auto told = train::run_training(request("told", {"train.steps=12", "train.streams=" + std::to_string(planned)}));
  EXPECT_EQ(by_default.train_losses, told.train_losses);
  EXPECT_EQ(by_default.final_val_loss, told.final_val_loss);
  const auto info = nlohmann::json::parse(read_file(kRoot / "auto" / "run.json"));
  EXPECT_EQ(info["config"]["train"]["streams"], planned);  // a resume keeps the run's count
  // A run made before train.streams existed ran one stream, and resumes with one.
  train::run_training(request("legacy", {"train.steps=12", "train.stop_at=6"}));
  auto doc = nlohmann::json::parse(read_file(kRoot / "legacy" / "run.json"));
  doc["config"]["train"].erase("streams");
  write_file_atomic(kRoot / "legacy" / "run.json", doc.dump());
  train::TrainRequest resume;
  resume.quiet = true;
  resume.resume_dir = (kRoot / "legacy").string();
  EXPECT_EQ(train::run_training(resume).steps_done, 12);
  EXPECT_EQ(nlohmann::json::parse(read_file(kRoot / "legacy" / "run.json"))["config"]["train"]["streams"], 1);
  // Two in-process workers are the threads themselves: one stream each.
  train::run_training(request("pair", {"train.steps=2", "cluster.workers=2", "algo.name=diloco", "algo.H=2"}));
  EXPECT_EQ(nlohmann::json::parse(read_file(kRoot / "pair" / "run.json"))["config"]["train"]["streams"], 1);
}
