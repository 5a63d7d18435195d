// RUN/metrics.jsonl's schema (train/metrics.hpp): the bytes each event writes, pinned; every
// line reads back as the event that wrote it; lines written before the version field (version 1,
// the same keys) still read; a newer version is refused.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>
#include <fstream>

#include "gasloc/core/atomic_file.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/train/metrics.hpp"
#include "test_util.hpp"

using namespace gasloc;
using namespace gasloc::train;

namespace {
TrainEvent train_event() {
  return {.step = 30, .worker = 1, .train_loss = 5.25, .lr = 0.003, .computed = true, .grad_norm = 1.5,
          .round_done = true, .tokens_per_s = 1024.5, .wall_time_s = 12.25, .virtual_time_s = 3.5,
          .bytes_sent = 4096, .idle_s = 0.125, .local_steps = 28, .eval_time_s = 0.5, .compute_s = 2.75,
          .utilization = 0.75};
}
EvalEvent eval_event() {
  return {.step = 30, .worker = 0, .val_loss = 5.5, .worker_val_loss = {5.5, 5.75}, .consensus_distance = 0.001,
          .wall_time_s = 13.0, .virtual_time_s = 3.75, .bytes_sent = 8192, .eval_time_s = 0.5};
}
MemoryEvent memory_event() {
  return {.step = 0, .worker = 0, .optim = "adamw", .algo = "gasloc", .params = 1000, .param_bytes = 4000,
          .optimizer_state_bytes = 8000, .sync_state_bytes = 8000};
}

std::string line_of(const MetricsEvent& e) { return to_json(e).dump(); }
}  // namespace

// The bytes of each event: the keys and number forms of the lines every earlier run wrote, plus
// "version". Scripts and older readers depend on them; a change here is a schema change.
TEST(MetricsSchema, EachEventWritesThePinnedLine) {
  EXPECT_EQ(line_of(train_event()),
            R"({"bytes_sent":4096,"compute_s":2.75,"computed":true,"eval_time_s":0.5,"event":"train","grad_norm":1.5,)"
            R"("idle_s":0.125,"local_steps":28,"lr":0.003,"round_done":true,"step":30,"tokens_per_s":1024.5,)"
            R"("train_loss":5.25,"utilization":0.75,"version":5,"virtual_time_s":3.5,"wall_time_s":12.25,"worker":1})");
  EXPECT_EQ(line_of(eval_event()),
            R"({"bytes_sent":8192,"consensus_distance":0.001,"eval_time_s":0.5,"event":"eval","step":30,"val_loss":5.5,)"
            R"("version":5,"virtual_time_s":3.75,"wall_time_s":13.0,"worker":0,"worker_val_loss":[5.5,5.75]})");
  EXPECT_EQ(line_of(memory_event()),
            R"({"algo":"gasloc","event":"memory","optim":"adamw","optimizer_state_bytes":8000,"param_bytes":4000,)"
            R"("params":1000,"step":0,"sync_state_bytes":8000,"version":5,"worker":0})");
  // Elastic runs: an eval names the workers it averaged over; a view change has its own event.
  EvalEvent over_members = eval_event();
  over_members.members = {0, 2};
  EXPECT_EQ(line_of(over_members),
            R"({"bytes_sent":8192,"consensus_distance":0.001,"eval_time_s":0.5,"event":"eval","members":[0,2],"step":30,)"
            R"("val_loss":5.5,"version":5,"virtual_time_s":3.75,"wall_time_s":13.0,"worker":0,"worker_val_loss":[5.5,5.75]})");
  const ViewEvent view{.step = 30, .worker = 0, .round = 5, .members = {0, 1, 2}, .died = {1}, .joined = {3},
                       .virtual_time_s = 2.5};
  EXPECT_EQ(line_of(view), R"({"died":[1],"event":"view","joined":[3],"members":[0,1,2],"round":5,"step":30,)"
                           R"("version":5,"virtual_time_s":2.5,"worker":0})");
  const auto back = std::get<ViewEvent>(*parse_metrics_line(line_of(view)));
  EXPECT_EQ(back.members, view.members);
  EXPECT_EQ(back.died, view.died);
  EXPECT_EQ(back.joined, view.joined);
  EXPECT_EQ(back.round, 5);
  EXPECT_EQ(std::get<EvalEvent>(*parse_metrics_line(line_of(over_members))).members, over_members.members);
  // A step skipped by its local-step budget had no gradient: null, not 0.
  TrainEvent skipped = train_event();
  skipped.computed = false;
  skipped.grad_norm.reset();
  EXPECT_NE(line_of(skipped).find(R"("computed":false,"eval_time_s":0.5,"event":"train","grad_norm":null,)"), std::string::npos);
  // Compressed gossip with the modulo codec: the chunks resent after a wrap, only on its lines.
  TrainEvent modulo = train_event();
  modulo.codec_resends = 17;
  EXPECT_NE(line_of(modulo).find(R"({"bytes_sent":4096,"codec_resends":17,"compute_s":2.75,)"), std::string::npos) << line_of(modulo);
  EXPECT_EQ(std::get<TrainEvent>(*parse_metrics_line(line_of(modulo))).codec_resends, 17);
  // algo.clip_peers: the messages clipped by sender, only on its lines.
  EXPECT_EQ(line_of(train_event()).find("clipped_from"), std::string::npos);
  TrainEvent clipping = train_event();
  clipping.clipped_from = std::vector<int64_t>{0, 0, 3, 1};
  EXPECT_NE(line_of(clipping).find(R"({"bytes_sent":4096,"clipped_from":[0,0,3,1],"compute_s":2.75,)"), std::string::npos)
      << line_of(clipping);
  EXPECT_EQ(std::get<TrainEvent>(*parse_metrics_line(line_of(clipping))).clipped_from, clipping.clipped_from);
  EXPECT_FALSE(std::get<TrainEvent>(*parse_metrics_line(line_of(train_event()))).clipped_from.has_value());
  // A resume that changed a setting the state depends on (--allow-change).
  const ConfigChangeEvent change{.step = 40, .worker = 0, .key = "algo.compression", .old_value = "int4", .new_value = "int8"};
  EXPECT_EQ(line_of(change), R"({"event":"config_change","key":"algo.compression","new":"int8","old":"int4","step":40,)"
                             R"("version":5,"worker":0})");
  const auto changed = std::get<ConfigChangeEvent>(*parse_metrics_line(line_of(change)));
  EXPECT_EQ(changed.key, "algo.compression");
  EXPECT_EQ(changed.old_value, "int4");
  EXPECT_EQ(changed.new_value, "int8");
  EXPECT_EQ(changed.step, 40);
}

TEST(MetricsSchema, EveryLineReadsBackAsItsEvent) {
  TrainEvent skipped = train_event();
  skipped.computed = false;
  skipped.grad_norm.reset();
  for (const MetricsEvent& e : {MetricsEvent(train_event()), MetricsEvent(skipped), MetricsEvent(eval_event()),
                                MetricsEvent(memory_event())}) {
    const auto back = parse_metrics_line(line_of(e));
    ASSERT_TRUE(back.has_value()) << line_of(e);
    EXPECT_EQ(back->index(), e.index());
    EXPECT_EQ(line_of(*back), line_of(e));
  }
  const auto t = std::get<TrainEvent>(*parse_metrics_line(line_of(train_event())));
  EXPECT_EQ(t.worker, 1);
  EXPECT_EQ(t.bytes_sent, 4096);
  EXPECT_EQ(t.local_steps, 28);
  EXPECT_EQ(t.grad_norm, 1.5);
  EXPECT_EQ(t.compute_s, 2.75);
  EXPECT_EQ(t.utilization, 0.75);
  EXPECT_EQ(t.eval_time_s, 0.5);
  EXPECT_EQ(std::get<EvalEvent>(*parse_metrics_line(line_of(eval_event()))).worker_val_loss,
            (std::vector<double>{5.5, 5.75}));
}

// Version 1: the lines written before the version field, as runs of that time hold them.
TEST(MetricsSchema, VersionOneLinesReadWithTheSameValues) {
  const std::string v1_train =
      R"({"bytes_sent":4096,"computed":true,"event":"train","grad_norm":1.5,"idle_s":0.125,"local_steps":28,)"
      R"("lr":0.003,"round_done":true,"step":30,"tokens_per_s":1024.5,"train_loss":5.25,)"
      R"("virtual_time_s":3.5,"wall_time_s":12.25,"worker":1})";
  const std::string v1_eval =
      R"({"bytes_sent":8192,"consensus_distance":0.001,"event":"eval","step":30,"val_loss":5.5,)"
      R"("virtual_time_s":3.75,"wall_time_s":13.0,"worker":0,"worker_val_loss":[5.5,5.75]})";
  // They hold none of version 4's fields: no evaluation price, no compute time or utilization.
  TrainEvent v1_want = train_event();
  v1_want.eval_time_s = 0;
  v1_want.compute_s.reset();
  v1_want.utilization.reset();
  EvalEvent v1_eval_want = eval_event();
  v1_eval_want.eval_time_s = 0;
  EXPECT_EQ(line_of(*parse_metrics_line(v1_train)), line_of(v1_want));
  EXPECT_EQ(line_of(*parse_metrics_line(v1_eval)), line_of(v1_eval_want));
  EXPECT_FALSE(std::get<TrainEvent>(*parse_metrics_line(v1_train)).utilization.has_value());
  // Older still: a train line without local_steps (readers then take the step count).
  const auto old = std::get<TrainEvent>(*parse_metrics_line(R"({"event":"train","step":10,"worker":0,"train_loss":6.0})"));
  EXPECT_FALSE(old.local_steps.has_value());
  EXPECT_EQ(old.step, 10);
  EXPECT_EQ(old.train_loss, 6.0);
  // A loss that was not finite was written as null (JSON has no NaN): it reads as NaN.
  const auto nan = std::get<EvalEvent>(*parse_metrics_line(R"({"event":"eval","step":5,"val_loss":null,"worker_val_loss":[null,4.0]})"));
  EXPECT_TRUE(std::isnan(nan.val_loss));
  ASSERT_EQ(nan.worker_val_loss.size(), 2u);
  EXPECT_TRUE(std::isnan(nan.worker_val_loss[0]));
  EXPECT_EQ(nan.worker_val_loss[1], 4.0);
}

TEST(MetricsSchema, MalformedAndUnknownLinesAreSkippedANewerVersionIsRefused) {
  EXPECT_FALSE(parse_metrics_line(R"({"event":"train","st)").has_value());  // a crash mid-write
  EXPECT_FALSE(parse_metrics_line("[1, 2]").has_value());
  EXPECT_FALSE(parse_metrics_line(R"({"event":"checkpoint","step":3})").has_value());
  try {
    parse_metrics_line(R"({"event":"train","step":1,"version":6})");
    ADD_FAILURE() << "expected a DataError for version 6";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("version 6"), std::string::npos) << e.what();
  }
}

// Version 4 lines (before codec_resends, clipped_from, dropped_from, joined_incarnations and
// config_change) read as they did, with those absent; version 5 lines, which may hold them, read.
TEST(MetricsSchema, VersionFourAndFiveLinesBothRead) {
  const std::string v4_train =
      R"({"bytes_sent":4096,"compute_s":2.75,"computed":true,"eval_time_s":0.5,"event":"train","grad_norm":1.5,)"
      R"("idle_s":0.125,"local_steps":28,"lr":0.003,"round_done":true,"step":30,"tokens_per_s":1024.5,)"
      R"("train_loss":5.25,"utilization":0.75,"version":4,"virtual_time_s":3.5,"wall_time_s":12.25,"worker":1})";
  const auto v4 = std::get<TrainEvent>(*parse_metrics_line(v4_train));
  EXPECT_EQ(line_of(v4), line_of(train_event()));
  EXPECT_FALSE(v4.codec_resends.has_value());
  EXPECT_FALSE(v4.clipped_from.has_value());
  EXPECT_FALSE(v4.dropped_from.has_value());
  const auto v4_view = std::get<ViewEvent>(*parse_metrics_line(
      R"({"died":[1],"event":"view","joined":[3],"members":[0,1,2],"round":5,"step":30,"version":4,"virtual_time_s":2.5,"worker":0})"));
  EXPECT_TRUE(v4_view.joined_incarnations.empty());
  const auto v5 = std::get<TrainEvent>(*parse_metrics_line(
      R"({"event":"train","step":30,"worker":1,"codec_resends":3,"clipped_from":[0,2],"dropped_from":[1,0],"version":5})"));
  EXPECT_EQ(v5.codec_resends, 3);
  EXPECT_EQ(v5.clipped_from, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(v5.dropped_from, (std::vector<int64_t>{1, 0}));
  const auto v5_view = std::get<ViewEvent>(*parse_metrics_line(
      R"({"event":"view","joined":[3],"joined_incarnations":[1],"members":[0,3],"round":6,"step":36,"version":5,"worker":0})"));
  EXPECT_EQ(v5_view.joined_incarnations, std::vector<int64_t>{1});
  EXPECT_EQ(std::get<ConfigChangeEvent>(*parse_metrics_line(
                R"({"event":"config_change","key":"optim.lr","new":0.01,"old":0.003,"step":40,"version":5,"worker":0})"))
                .key,
            "optim.lr");
}

// MetricsLog writes through to_json, and read_metrics reads the file back in order.
TEST(MetricsSchema, TheLogWritesWhatReadMetricsReads) {
  const auto dir = test_util::temp_root("test_metrics");
  {
    MetricsLog log(dir / "metrics.jsonl");
    log.write(memory_event());
    log.write(train_event());
    log.write(eval_event());
  }
  std::ifstream in(dir / "metrics.jsonl");
  std::string first;
  std::getline(in, first);
  EXPECT_EQ(first, line_of(memory_event()));
  const auto events = read_metrics(dir);
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(line_of(events[1]), line_of(train_event()));
  EXPECT_EQ(line_of(events[2]), line_of(eval_event()));
  std::filesystem::remove_all(dir);
  EXPECT_THROW(read_metrics(dir), DataError);
}

// Issue 62, item 6: a FIFO in metrics.jsonl's place hung gasloc report (and the trainer's log) in
// open(), waiting for a writer; it is refused at once, naming it (on the old code this hangs).
TEST(MetricsFiles, AFifoIsRefusedAtOnceNamingIt) {
  const auto dir = test_util::temp_root("metrics_fifo");
  const auto file = dir / "metrics.jsonl";
  ASSERT_EQ(::mkfifo(file.c_str(), 0600), 0);
  auto expect_named = [&](auto&& f) {
    try {
      f();
      ADD_FAILURE() << "a FIFO was opened as metrics.jsonl";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("not a regular file"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(file.string()), std::string::npos) << e.what();
    }
  };
  expect_named([&] { read_metrics(dir); });
  expect_named([&] { MetricsLog log(file, 10); });
  expect_named([&] { MetricsLog log(file); });
  expect_named([&] { read_file(file); });
  expect_named([&] { read_file(file, 1024); });
  std::filesystem::remove_all(dir);
}
