// The dashboard's data (study/dashboard.hpp): what the page polls, built from a run directory the
// test writes line by line, as a trainer does.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>

#include "gasloc/core/atomic_file.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/study/dashboard.hpp"
#include "gasloc/train/metrics.hpp"
#include "test_util.hpp"

namespace gasloc {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;

// A fresh run directory with a run.json of `workers` workers and `steps` steps, on data whose
// dataset.json records a unigram baseline of 3.25.
fs::path make_run(const std::string& name, int64_t workers, int64_t steps) {
  const fs::path dir = test_util::temp_root("dashboard") / name;
  fs::remove_all(dir);
  fs::create_directories(dir / "data");
  write_file_atomic(dir / "data" / "dataset.json", R"({"unigram_val_loss": 3.25})");
  const json info = {{"config",
                      {{"algo", {{"name", "gasloc"}, {"topology", "1peer"}}},
                       {"optim", {{"name", "adamw"}}},
                       {"train", {{"steps", steps}}},
                       {"model", {{"preset", "nano"}}},
                       {"cluster", {{"backend", "inproc"}, {"elastic", false}}}}},
                     {"world", workers},
                     {"dataset", {{"dir", (dir / "data").string()}}}};
  write_file_atomic(dir / "run.json", info.dump(2));
  return dir;
}

std::string line_of(const train::MetricsEvent& e) { return train::to_json(e).dump() + "\n"; }

void append(const fs::path& dir, const std::string& text) {
  std::ofstream f(dir / "metrics.jsonl", std::ios::app | std::ios::binary);
  f << text;
}

train::TrainEvent train_line(int64_t step, int64_t worker, double loss) {
  train::TrainEvent t;
  t.step = step;
  t.worker = worker;
  t.train_loss = loss;
  t.virtual_time_s = 0.5 * static_cast<double>(step) + 0.01 * static_cast<double>(worker);
  t.bytes_sent = 1'000'000 * step * (worker + 1);
  t.utilization = 0.5 + 0.1 * static_cast<double>(worker);
  return t;
}

train::EvalEvent eval_line(int64_t step, double val_loss, std::vector<double> own, std::vector<int64_t> members = {}) {
  train::EvalEvent e;
  e.step = step;
  e.val_loss = val_loss;
  e.worker_val_loss = std::move(own);
  e.members = std::move(members);
  e.consensus_distance = 0.001 * static_cast<double>(step);
  e.virtual_time_s = 0.5 * static_cast<double>(step);
  return e;
}

json watch_once(const fs::path& dir) {
  study::RunWatch watch(dir, "run");
  watch.refresh();
  return watch.to_json();
}

std::vector<double> doubles(const json& j) { return j.get<std::vector<double>>(); }

TEST(Dashboard, RunNotStartedOrWithoutMetricsYet) {
  const json missing = watch_once(test_util::temp_root("dashboard") / "never-created");
  EXPECT_EQ(missing["state"], "waiting");
  EXPECT_TRUE(missing["settings"].is_null());
  EXPECT_TRUE(missing["seconds_since_update"].is_null());

  const fs::path dir = make_run("no-metrics", 2, 20);
  const json started = watch_once(dir);
  EXPECT_EQ(started["state"], "no metrics yet");
  EXPECT_EQ(started["settings"]["label"], "gasloc-1peer");
  EXPECT_EQ(started["settings"]["workers"], 2);
  EXPECT_DOUBLE_EQ(started["unigram"].get<double>(), 3.25);
  EXPECT_TRUE(started["workers"].empty());
  EXPECT_TRUE(started["eval"]["step"].empty());
}

TEST(Dashboard, SeriesPerWorkerAndEvaluations) {
  const fs::path dir = make_run("two-workers", 2, 10);
  for (int64_t step : {5, 10})
    for (int64_t w : {0, 1}) append(dir, line_of(train_line(step, w, 5.0 - 0.1 * static_cast<double>(step + w))));
  append(dir, line_of(eval_line(10, 4.0, {4.1, 4.2})));
  const json j = watch_once(dir);

  ASSERT_EQ(j["workers"].size(), 2u);
  const json& w1 = j["workers"]["1"];
  EXPECT_EQ(doubles(w1["step"]), (std::vector<double>{5, 10}));
  EXPECT_EQ(doubles(w1["train_loss"]), (std::vector<double>{5.0 - 0.6, 5.0 - 1.1}));
  EXPECT_EQ(doubles(w1["mb_sent"]), (std::vector<double>{10, 20}));  // bytes / 1e6
  EXPECT_EQ(doubles(w1["time"]), (std::vector<double>{2.51, 5.01}));
  EXPECT_EQ(doubles(w1["utilization"]), (std::vector<double>{0.6, 0.6}));
  EXPECT_EQ(doubles(j["eval"]["val_loss"]), (std::vector<double>{4.0}));
  EXPECT_EQ(doubles(j["eval"]["consensus"]), (std::vector<double>{0.01}));
  EXPECT_EQ(doubles(j["eval"]["own"]["1"]["val_loss"]), (std::vector<double>{4.2}));
  EXPECT_EQ(j["last_step"], 10);
  EXPECT_EQ(j["state"], "finished");  // evaluated at train.steps
  EXPECT_TRUE(j["views"].empty());
}

// A dead worker (or one its local-step budget skipped) still logs lines, repeating its last
// loss: the chart shows a gap there, not a flat stretch of training.
TEST(Dashboard, StepsNotComputedAreGapsInTheTrainingLoss) {
  const fs::path dir = make_run("skipped", 1, 30);
  append(dir, line_of(train_line(10, 0, 4.0)));
  train::TrainEvent dead = train_line(20, 0, 4.0);
  dead.computed = false;
  append(dir, line_of(dead));
  append(dir, line_of(train_line(30, 0, 3.5)));
  const json j = json::parse(watch_once(dir).dump());  // as the page receives it
  const json& loss = j["workers"]["0"]["train_loss"];
  ASSERT_EQ(loss.size(), 3u);
  EXPECT_EQ(loss[0], 4.0);
  EXPECT_TRUE(loss[1].is_null());
  EXPECT_EQ(loss[2], 3.5);
  EXPECT_EQ(doubles(j["workers"]["0"]["mb_sent"]), (std::vector<double>{10, 20, 30}));  // still counted
}

TEST(Dashboard, ViewChangesAndElasticMembers) {
  const fs::path dir = make_run("elastic", 3, 40);
  append(dir, line_of(train_line(10, 0, 4.0)));
  train::ViewEvent died;
  died.step = 12;
  died.round = 3;
  died.members = {0, 2};
  died.died = {1};
  died.virtual_time_s = 6.5;
  append(dir, line_of(died));
  // An elastic evaluation names its workers by the members' order: worker 1 has no model here.
  append(dir, line_of(eval_line(20, 3.9, {3.8, 3.7}, {0, 2})));
  train::ViewEvent joined = died;
  joined.step = 30;
  joined.members = {0, 1, 2};
  joined.died = {};
  joined.joined = {1};
  append(dir, line_of(joined));
  const json j = watch_once(dir);

  ASSERT_EQ(j["views"].size(), 2u);
  EXPECT_EQ(j["views"][0]["died"], json({1}));
  EXPECT_EQ(j["views"][0]["step"], 12);
  EXPECT_DOUBLE_EQ(j["views"][0]["time"].get<double>(), 6.5);
  EXPECT_EQ(j["views"][1]["joined"], json({1}));
  EXPECT_EQ(doubles(j["eval"]["own"]["2"]["val_loss"]), (std::vector<double>{3.7}));
  EXPECT_FALSE(j["eval"]["own"].contains("1"));
  EXPECT_EQ(j["state"], "training");
}

TEST(Dashboard, PartialLastLineWaitsForItsNewline) {
  const fs::path dir = make_run("partial", 1, 100);
  study::RunWatch watch(dir, "partial");
  watch.refresh();
  EXPECT_EQ(watch.to_json()["state"], "no metrics yet");

  const std::string second = line_of(train_line(10, 0, 3.5));
  append(dir, line_of(train_line(5, 0, 4.0)) + second.substr(0, second.size() / 2));
  watch.refresh();
  EXPECT_EQ(doubles(watch.to_json()["workers"]["0"]["step"]), (std::vector<double>{5}));
  // The whole object but not its newline: still being written.
  append(dir, second.substr(second.size() / 2, second.size() - second.size() / 2 - 1));
  watch.refresh();
  EXPECT_EQ(doubles(watch.to_json()["workers"]["0"]["step"]), (std::vector<double>{5}));
  append(dir, "\n");
  watch.refresh();
  const json j = watch.to_json();
  EXPECT_EQ(doubles(j["workers"]["0"]["step"]), (std::vector<double>{5, 10}));
  EXPECT_EQ(doubles(j["workers"]["0"]["train_loss"]), (std::vector<double>{4.0, 3.5}));
  EXPECT_EQ(j["state"], "training");
  watch.refresh();  // nothing new: nothing added twice
  EXPECT_EQ(watch.to_json()["workers"]["0"]["step"].size(), 2u);
}

TEST(Dashboard, RewrittenMetricsAreReadAgainFromTheStart) {
  const fs::path dir = make_run("resumed", 1, 100);
  study::RunWatch watch(dir, "resumed");
  append(dir, line_of(train_line(5, 0, 4.0)) + line_of(train_line(10, 0, 3.9)) + line_of(train_line(15, 0, 3.8)));
  watch.refresh();
  ASSERT_EQ(watch.to_json()["workers"]["0"]["step"].size(), 3u);
  // A resume from step 10 drops the lines after it (a new file), then trains on.
  write_file_atomic(dir / "metrics.jsonl", line_of(train_line(5, 0, 4.0)) + line_of(train_line(10, 0, 3.9)));
  append(dir, line_of(train_line(15, 0, 3.7)));
  watch.refresh();
  const json j = watch.to_json();
  EXPECT_EQ(doubles(j["workers"]["0"]["step"]), (std::vector<double>{5, 10, 15}));
  EXPECT_EQ(doubles(j["workers"]["0"]["train_loss"]), (std::vector<double>{4.0, 3.9, 3.7}));
}

TEST(Dashboard, NewerMetricsVersionIsTheRunsError) {
  const fs::path dir = make_run("newer", 1, 100);
  append(dir, line_of(train_line(5, 0, 4.0)) + R"({"event":"train","version":999,"step":10})" + "\n");
  const json j = watch_once(dir);
  ASSERT_TRUE(j.contains("error"));
  EXPECT_NE(j["error"].get<std::string>().find("version 999"), std::string::npos) << j["error"];
  EXPECT_EQ(doubles(j["workers"]["0"]["step"]), (std::vector<double>{5}));
}

// Issue 62, item 6: a FIFO in metrics.jsonl's place hung the dashboard's poll (and so the page);
// it is the run's error, naming it (on the old code this test hangs).
TEST(Dashboard, AFifoForMetricsIsTheRunsErrorNotAHang) {
  const fs::path dir = make_run("fifo", 1, 100);
  ASSERT_EQ(::mkfifo((dir / "metrics.jsonl").c_str(), 0600), 0);
  const json j = watch_once(dir);
  ASSERT_TRUE(j.contains("error"));
  EXPECT_NE(j["error"].get<std::string>().find("not a regular file"), std::string::npos) << j["error"];
}

TEST(Dashboard, EmbeddedJsonCannotCloseItsScript) {
  const json data = {{"name", "a</script><script>alert(1)</script>"}};
  const std::string text = study::json_for_html(data);
  EXPECT_EQ(text.find('<'), std::string::npos) << text;
  EXPECT_EQ(json::parse(text), data);  // the same document
}

TEST(Dashboard, FrozenPageHoldsItsDataOrSaysHowToGetUplot) {
  const fs::path dir = make_run("frozen", 1, 10);
  append(dir, line_of(train_line(5, 0, 4.0)));
  std::vector<study::RunWatch> runs;
  runs.emplace_back(dir, "frozen-run");
  study::DashboardPage page;
  page.embedded = study::dashboard_json(runs);
  if (!study::dashboard_assets_available()) {
    try {
      study::dashboard_html(page);
      FAIL() << "a build without uPlot wrote a page";
    } catch (const Error& e) {
      EXPECT_NE(e.hint().find("scripts/setup.sh"), std::string::npos) << e.hint();
    }
    return;
  }
  const std::string html = study::dashboard_html(page);
  EXPECT_NE(html.find("\"frozen-run\""), std::string::npos);
  EXPECT_NE(html.find("uPlot"), std::string::npos);
  EXPECT_EQ(html.find("\"dataUrl\":\"data.json\""), std::string::npos);  // frozen: no polling
  page.data_url = "data.json";
  EXPECT_NE(study::dashboard_html(page).find("\"dataUrl\":\"data.json\""), std::string::npos);
}

}  // namespace
}  // namespace gasloc
