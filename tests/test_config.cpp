// Job configuration: defaults, TOML loading, overrides, and errors that name the key.
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <torch/torch.h>

#include <fstream>
#include <stdexcept>
#include <type_traits>

#include "gasloc/algo/algo_config.hpp"
#include "gasloc/algo/registry.hpp"
#include "gasloc/core/config.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/core/flat_params.hpp"
#include "gasloc/core/shipped_files.hpp"
#include "gasloc/train/job_config.hpp"
#include "gasloc/train/run_start.hpp"
#include "gasloc/train/optimizers.hpp"
#include "test_paths.hpp"

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

TEST(Config, NetworkAllreducePicksHowTheModelPricesAllReduces) {
  EXPECT_EQ(load_job("", {}).network.model(8).allreduce, comm::AllReducePattern::ring);
  EXPECT_EQ(load_job("", {"network.allreduce=tree"}).network.model(8).allreduce, comm::AllReducePattern::tree);
}

TEST(Config, NetworkLatenciesAndRegionsReachTheModelOrAreRefusedNamingTheKey) {
  const auto m = load_job("", {"cluster.workers=8", "algo.name=gasloc", "network.regions=[4, 4]", "network.inter_region_latency_s=0.08",
                               "network.inter_region_bandwidth_gbit=0.08"})
                     .network.model(8);
  EXPECT_EQ(m.region, (std::vector<int>{0, 0, 0, 0, 1, 1, 1, 1}));
  EXPECT_DOUBLE_EQ(m.inter_region_latency_s, 0.08);
  EXPECT_DOUBLE_EQ(m.inter_region_Bps, 1e7);
  EXPECT_DOUBLE_EQ(m.link_latency(3, 4), 0.08);
  EXPECT_DOUBLE_EQ(m.link_latency(2, 3), 1e-3);
  const auto l = load_job("", {"cluster.workers=2", "algo.name=gasloc", "network.latencies_s=[0.001, 0.05]"}).network.model(2);
  EXPECT_DOUBLE_EQ(l.link_latency(0, 1), 0.05);
  auto refused = [](std::vector<std::string> o, const std::string& key) {
    try {
      load_job("", o).network.model(8);
      ADD_FAILURE() << "expected a ConfigError naming " << key;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  };
  refused({"cluster.workers=8", "algo.name=gasloc", "network.regions=[4, 3]"}, "network.regions");
  refused({"cluster.workers=8", "algo.name=gasloc", "network.regions=[8, 0]"}, "network.regions[1]");
  refused({"cluster.workers=8", "algo.name=gasloc", "network.inter_region_latency_s=0.1"}, "network.inter_region_latency_s");
  refused({"cluster.workers=8", "algo.name=gasloc", "network.latencies_s=[0.1, 0.1]"}, "network.latencies_s");
  refused({"cluster.workers=8", "algo.name=gasloc", "network.latencies_s=[0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, -1]"}, "network.latencies_s[7]");
}

TEST(Config, ARunSaysHowMuchOfItsDataEachWorkerDraws) {
  // 1,024 disjoint slices of a 1M-token stream: ~977 tokens each; 300 steps x 8 windows x 64
  // tokens = 153,600 drawn per worker, 157 passes over its slice.
  const auto disjoint = train::data_coverage(1'000'000, 1024, 300, 8, 63, true);
  EXPECT_NE(disjoint.find("1024 disjoint slices of ~977 tokens"), std::string::npos) << disjoint;
  EXPECT_NE(disjoint.find("draws up to 153600 tokens"), std::string::npos) << disjoint;
  EXPECT_NE(disjoint.find("157 passes over it, so its windows repeat"), std::string::npos) << disjoint;
  // Shared: 4 x 51,200 of 10M tokens, a fiftieth of a pass: nothing repeats by necessity.
  const auto shared = train::data_coverage(10'000'000, 4, 100, 8, 63, false);
  EXPECT_NE(shared.find("0.00512 passes each, 0.0205 for all together"), std::string::npos) << shared;
  EXPECT_EQ(shared.find("repeat"), std::string::npos) << shared;
  const auto reused = train::data_coverage(100'000, 4, 100, 8, 63, false);
  EXPECT_NE(reused.find("2.05 for all together, so windows repeat across workers"), std::string::npos) << reused;
}

// Thousands of in-process workers load (their cores are shared through cluster.compute_slots,
// test_train.cpp); a negative slot count is refused naming the key.
TEST(Config, ThousandsOfInProcessWorkersLoadAndTheirSlotsAreChecked) {
  EXPECT_EQ(load_job("", {"cluster.workers=4096", "algo.name=gasloc"}).cluster.workers, 4096);
  try {
    load_job("", {"cluster.compute_slots=-1"});
    ADD_FAILURE() << "cluster.compute_slots = -1 must be refused";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("cluster.compute_slots"), std::string::npos) << e.what();
  }
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

// Issue 62, item 6: 1e308 s passed validation and failed deep in Gloo; algo.H beyond train.steps
// ran zero rounds without a word.
TEST(Config, ATimeoutBeyondAWeekAndRoundsLongerThanTheRunAreRefused) {
  expect_config_error([] { load_job("", {"cluster.timeout_s=1e308"}); }, "cluster.timeout_s");
  expect_config_error([] { load_job("", {"cluster.timeout_s=604801"}); }, "604800");
  EXPECT_NO_THROW(load_job("", {"cluster.timeout_s=604800"}));
  auto rounds_fit = [](std::vector<std::string> s) { check_rounds_fit(load_job("", s)); };
  expect_config_error([&] { rounds_fit({"algo.name=diloco", "algo.H=31", "train.steps=30", "cluster.workers=2"}); },
                      "algo.H");
  EXPECT_NO_THROW(rounds_fit({"algo.name=diloco", "algo.H=30", "train.steps=30", "cluster.workers=2"}));
  EXPECT_NO_THROW(rounds_fit({"algo.name=dadam", "algo.H=31", "train.steps=30", "cluster.workers=2"}));  // no rounds
}

TEST(Config, SyntaxErrorsGiveFileAndLine) {
  const std::string path = gasloc::test_paths::binary_dir().string() + "/bad_config.toml";
  {
    std::ofstream f(path);
    f << "[optim]\nlr = 0.1\n[train\nsteps = 3\n";
  }
  expect_config_error([&] { load_job(path, {}); }, "bad_config.toml:3");
  expect_config_error([&] { load_job(path + ".missing", {}); }, "cannot open");
}

// In the build tree (build/test_config: no build/../share/gasloc) nothing is looked up elsewhere:
// a checkout's relative paths mean what they always did. The installed lookup is
// tests/install_prefix.sh's.
TEST(Config, ShippedFilesAreNotLookedUpInTheBuildTree) {
  EXPECT_TRUE(gasloc::shipped_dir().empty());
  EXPECT_EQ(gasloc::find_shipped("configs/no-such-file.toml"), "configs/no-such-file.toml");
  EXPECT_EQ(gasloc::find_shipped(""), "");
  EXPECT_EQ(gasloc::find_shipped("/abs/none.toml"), "/abs/none.toml");
  try {
    gasloc::config::parse_toml_file("configs/no-such-file.toml");
    FAIL() << "a missing file must throw";
  } catch (const gasloc::ConfigError& e) {
    EXPECT_NE(std::string(e.hint()).find("relative to the working directory"), std::string::npos) << e.hint();
  }
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

// ---------------------------------------------------------------------------------------------
// Enumerated settings and the registries behind algo.name and optim.name.

namespace {
// Every enumerated key of the job, with its valid names.
std::vector<std::pair<std::string, const config::Choices*>> choice_keys() {
  std::vector<std::pair<std::string, const config::Choices*>> out;
  train::JobConfig job;
  job.for_each_section([&](const char* section, auto& s) {
    s.visit([&](const char* key, auto& field, const char*) {
      if constexpr (std::is_same_v<std::decay_t<decltype(field)>, config::Choice>)
        out.push_back({std::string(section) + "." + key, &field.choices()});
    });
  });
  return out;
}

// The line of `key` in --help-config.
std::string help_line(const std::string& key) {
  const auto text = train::describe_job();
  const auto at = text.find("  " + key + " ");
  if (at == std::string::npos) return "";
  return text.substr(at, text.find('\n', at) - at);
}
}  // namespace

TEST(Choices, UnknownNamesListTheValidOnes) {
  const auto keys = choice_keys();
  ASSERT_GE(keys.size(), 12u);  // model.preset ... network.preset
  for (const auto& [key, choices] : keys) {
    try {
      load_job("", {key + "=bogus"});
      ADD_FAILURE() << key << " accepted 'bogus'";
    } catch (const ConfigError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("'" + key + "'"), std::string::npos) << what;
      for (const auto& o : choices->options()) EXPECT_NE(what.find(o.name), std::string::npos) << key << ": " << what;
    }
    // The help text lists every name too, and every name loads.
    for (const auto& o : choices->options()) {
      EXPECT_NE(help_line(key).find(o.name), std::string::npos) << key << " " << o.name;
      try {
        load_job("", {key + "=" + o.name});
      } catch (const ConfigError& e) {
        EXPECT_EQ(std::string(e.what()).find("unknown"), std::string::npos) << key << " = " << o.name << ": " << e.what();
      }
    }
  }
  // A TOML value of the wrong type names the choices as well.
  expect_config_error([] { job_from_json(toml("[train]\ndtype = 16\n"), {}); }, "fp32, bf16");
}

TEST(Choices, ReadAndWriteAsPlainStrings) {
  auto job = load_job("", {"algo.name=gasloc", "algo.topology=ring", "cluster.workers=4", "train.dtype=bf16"});
  const auto j = job.to_json();
  EXPECT_EQ(j["algo"]["name"], "gasloc");  // run.json keeps the same strings
  EXPECT_EQ(j["algo"]["topology"], "ring");
  EXPECT_EQ(j["train"]["dtype"], "bf16");
  EXPECT_EQ(job_from_json(j, {}).to_json(), j);
  EXPECT_EQ(job.algo.name, "gasloc");
  EXPECT_EQ(fmt::format("{}", job.algo.topology), "ring");
  // Comparing with a name that is not a choice is a misspelt literal: a bug, not false.
  EXPECT_THROW((void)(job.train.dtype == "bf61"), std::logic_error);
  EXPECT_THROW(job.train.dtype = "fp8", std::logic_error);
  EXPECT_THROW(config::Choice(train::dtype_choices(), "fp8"), std::logic_error);
}

TEST(Registry, EveryAlgorithmIsListedValidatedAndBuiltFromItsEntry) {
  const comm::NetworkModel net;
  for (const auto& e : algo::algorithms()) {
    SCOPED_TRACE(e.name);
    // --help-config: algo.name lists it with its doc; the per-key lists follow the flags.
    EXPECT_NE(help_line("algo.name").find(e.name + " (" + e.doc + ")"), std::string::npos);
    auto listed = [&](const char* key) {
      const auto line = help_line(key);
      for (const char* before : {" ", "("})
        for (const char* after : {",", ")"})
          if (line.find(before + e.name + after) != std::string::npos) return true;
      return false;
    };
    EXPECT_EQ(listed("algo.H"), e.has_rounds);
    EXPECT_EQ(listed("algo.outer_lr"), e.has_outer);
    EXPECT_EQ(listed("algo.topology"), e.needs_topology);
    EXPECT_EQ(listed("algo.form"), e.has_forms);

    algo::AlgoConfig a;
    a.name = e.name;
    const int world = e.single_worker ? 1 : 4;
    // Dispatch: make_synchronizer builds the entry's synchronizer.
    EXPECT_EQ(algo::make_synchronizer(a, world, 1, &net)->name(), e.name);
    // Validation follows the flags.
    auto valid = [&](auto change, int n) {
      algo::AlgoConfig b = a;
      change(b);
      try {
        b.validate(n);
        return true;
      } catch (const ConfigError&) {
        return false;
      }
    };
    EXPECT_EQ(valid([](auto& b) { b.h_policy = "time_budget"; }, world), e.has_rounds);
    EXPECT_EQ(valid([](auto& b) { b.form = "mix_after"; }, world), e.has_forms);
    EXPECT_EQ(valid([](auto& b) { b.wire_dtype = "bf16"; }, world), !e.sends_gradients);
    EXPECT_EQ(valid([](auto&) {}, 4), !e.single_worker);
    EXPECT_EQ(valid([](auto& b) { b.topology = "exp"; }, 3), !e.single_worker && !e.needs_topology);  // exp needs 2^k
  }
  EXPECT_EQ(algo::algorithm_choices().names(), "none, allreduce, diloco, gasloc, dadam, local_dadam");
  try {
    algo::algorithm("magic");
    ADD_FAILURE() << "algorithm('magic') found an entry";
  } catch (const ConfigError& e) {
    EXPECT_NE(e.hint().find("local_dadam"), std::string::npos) << e.hint();
  }
}

TEST(Registry, EveryOptimizerIsListedValidatedAndBuiltFromItsEntry) {
  auto p = torch::zeros({4, 3});
  FlatParams params(std::vector<std::pair<std::string, torch::Tensor>>{{"w", p}});
  for (const auto& e : train::optimizers()) {
    SCOPED_TRACE(e.name);
    EXPECT_NE(help_line("optim.name").find(e.name), std::string::npos);
    EXPECT_EQ(help_line("optim.mu_x").find(e.name + ":") != std::string::npos ||
                  help_line("optim.mu_x").find(e.name + ",") != std::string::npos,
              e.uses_mu);
    EXPECT_EQ(help_line("optim.decay_on").find(e.name) != std::string::npos, e.averages);
    auto job = load_job("", {"optim.name=" + e.name});
    EXPECT_EQ(train::make_optimizer(job.optim, params)->name(), e.name);
    bool helper_ok = true;
    try {
      load_job("", {"optim.name=" + e.name, "optim.gpa_from_diloco={ H = 8 }"});
    } catch (const ConfigError&) {
      helper_ok = false;
    }
    EXPECT_EQ(helper_ok, e.uses_mu);
  }
  expect_config_error([] { load_job("", {"optim.name=sgd"}); }, "adamw, gpa, schedule_free");
}
