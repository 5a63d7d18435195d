// Job configuration: defaults, TOML loading, overrides, and errors that name the key.
#include <gtest/gtest.h>

#include <fstream>

#include "gasloc/core/config.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/train/job_config.hpp"

using namespace gasloc;
using train::job_from_json;
using train::load_job;

namespace {
nlohmann::json toml(const std::string& text) { return config::parse_toml_text(text, "test.toml"); }

// Runs f, expects a ConfigError whose message contains `needle`.
template <class F>
void expect_config_error(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected ConfigError mentioning '" << needle << "'";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << "message: " << e.what();
  }
}
}  // namespace

TEST(Config, DefaultsAreValid) {
  auto job = load_job("", {});
  EXPECT_EQ(job.model.preset, "tiny");
  EXPECT_EQ(job.optim.beta2, 0.95);
  EXPECT_EQ(job.train.dtype, "fp32");
}

TEST(Config, TomlAndOverridesApplyInOrder) {
  auto job = job_from_json(toml("[optim]\nlr = 0.01\n[train]\nsteps = 40\ndevice = \"cpu\"\n"),
                           {"optim.lr=2e-3", "train.run_dir=runs/x", "model.tie_embeddings=true", "data.dir=\"d\""});
  EXPECT_DOUBLE_EQ(job.optim.lr, 2e-3);
  EXPECT_EQ(job.train.steps, 40);
  EXPECT_EQ(job.train.run_dir, "runs/x");
  EXPECT_TRUE(job.model.tie_embeddings);
  EXPECT_EQ(job.data.dir, "d");
}

TEST(Config, IntegersAcceptedForFloatsButNotTheReverse) {
  EXPECT_DOUBLE_EQ(job_from_json(toml("[optim]\nlr = 1\n"), {}).optim.lr, 1.0);
  expect_config_error([] { job_from_json(toml("[train]\nsteps = 1.5\n"), {}); }, "train.steps");
  expect_config_error([] { job_from_json(toml("[train]\nsteps = \"ten\"\n"), {}); }, "train.steps");
}

TEST(Config, UnknownKeysAndSectionsNameTheKey) {
  expect_config_error([] { job_from_json(toml("[optim]\nlearning_rate = 0.1\n"), {}); }, "optim.learning_rate");
  expect_config_error([] { job_from_json(toml("[optimizer]\nlr = 0.1\n"), {}); }, "optimizer");
  expect_config_error([] { job_from_json(nlohmann::json::object(), {"optim.lrr=1"}); }, "optim.lrr");
  expect_config_error([] { job_from_json(nlohmann::json::object(), {"optim.lr"}); }, "optim.lr");
  expect_config_error([] { job_from_json(nlohmann::json::object(), {"optim.lr=abc"}); }, "optim.lr");
}

TEST(Config, BadValuesNameTheKey) {
  expect_config_error([] { load_job("", {"optim.lr=-1"}); }, "optim.lr");
  expect_config_error([] { load_job("", {"optim.beta2=1.0"}); }, "optim.beta2");
  expect_config_error([] { load_job("", {"train.dtype=fp8"}); }, "train.dtype");
  expect_config_error([] { load_job("", {"train.device=tpu"}); }, "train.device");
  expect_config_error([] { load_job("", {"model.preset=huge"}); }, "huge");
  expect_config_error([] { load_job("", {"data.seq_len=100000"}); }, "data.seq_len");
  expect_config_error([] { load_job("", {"algo.name=magic"}); }, "algo.name");
  expect_config_error([] { load_job("", {"train.stop_at=400", "train.steps=300"}); }, "train.stop_at");
}

TEST(Config, SyntaxErrorsGiveFileAndLine) {
  const std::string path = std::string(GASLOC_BINARY_DIR) + "/bad_config.toml";
  {
    std::ofstream f(path);
    f << "[optim]\nlr = 0.1\n[train\nsteps = 3\n";
  }
  expect_config_error([&] { load_job(path, {}); }, "bad_config.toml:3");
  expect_config_error([&] { load_job(path + ".missing", {}); }, "cannot open");
}

TEST(Config, RoundTripsThroughJson) {
  auto job = load_job("", {"optim.lr=0.005", "train.seed=99"});
  auto again = job_from_json(job.to_json(), {});
  EXPECT_EQ(again.to_json(), job.to_json());
  EXPECT_EQ(again.train.seed, 99u);
}

TEST(Config, DescribeListsEveryKeyWithDoc) {
  const auto text = train::describe_job();
  for (const char* key : {"model.preset", "data.seq_len", "optim.lr", "train.steps", "train.dtype", "algo.name"})
    EXPECT_NE(text.find(key), std::string::npos) << key;
}
