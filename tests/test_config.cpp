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

TEST(Config, GpaFromDiLoCoDerivesMuXAndMuY) {
  auto job = job_from_json(toml("[optim]\nname = \"gpa\"\ngpa_from_diloco = { H = 32, mu = 0.9 }\n"), {});
  EXPECT_DOUBLE_EQ(job.optim.mu_x, std::pow(0.9, 1.0 / 32));
  EXPECT_DOUBLE_EQ(job.optim.mu_y, 0.9);
  // The resolved values are what run.json records, and reloading it gives the same job.
  const auto j = job.to_json();
  EXPECT_DOUBLE_EQ(j["optim"]["mu_x"].get<double>(), std::pow(0.9, 1.0 / 32));
  EXPECT_EQ(j["optim"]["gpa_from_diloco"]["H"], 32);
  auto again = job_from_json(j, {});
  EXPECT_EQ(again.optim.mu_x, job.optim.mu_x);
  // Also as --set, with an inline table.
  auto set = load_job("", {"optim.name=gpa", "optim.gpa_from_diloco={ H = 10, mu = 0.8 }"});
  EXPECT_DOUBLE_EQ(set.optim.mu_x, std::pow(0.8, 0.1));
  EXPECT_DOUBLE_EQ(set.optim.mu_y, 0.8);
}

TEST(Config, GpaSettingsAreChecked) {
  expect_config_error([] { load_job("", {"optim.name=sgd"}); }, "optim.name");
  expect_config_error([] { load_job("", {"optim.name=gpa", "optim.mu_y=0"}); }, "optim.mu_y");
  expect_config_error([] { load_job("", {"optim.name=gpa", "optim.mu_y=1.2"}); }, "optim.mu_y");
  expect_config_error([] { load_job("", {"optim.name=gpa", "optim.mu_x=-0.1"}); }, "optim.mu_x");
  expect_config_error([] { load_job("", {"optim.name=gpa", "optim.mu_x=1.5"}); }, "optim.mu_x");
  expect_config_error([] { load_job("", {"optim.name=gpa", "optim.decay_on=x"}); }, "optim.decay_on");
  // The helper and an explicit, different mu_x conflict; the helper only makes sense for gpa.
  expect_config_error([] { load_job("", {"optim.name=gpa", "optim.mu_x=0.5", "optim.gpa_from_diloco={ H = 32 }"}); },
                      "conflicts");
  expect_config_error([] { load_job("", {"optim.gpa_from_diloco={ H = 32, mu = 0.9 }"}); }, "optim.gpa_from_diloco");
  expect_config_error([] { load_job("", {"optim.name=gpa", "optim.gpa_from_diloco={ H = 32, mu = 1.0 }"}); },
                      "optim.gpa_from_diloco.mu");
  expect_config_error([] { load_job("", {"optim.name=gpa", "optim.gpa_from_diloco={ H = 32, nu = 0.9 }"}); },
                      "optim.gpa_from_diloco.nu");
  // mu_y = 1 and mu_x = 0 are the closed ends of the ranges.
  EXPECT_NO_THROW(load_job("", {"optim.name=gpa", "optim.mu_y=1", "optim.mu_x=0"}));
}
