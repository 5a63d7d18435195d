// The store side of elastic process runs (comm/elastic_roster.hpp, algo/store_views.hpp,
// train/elastic_process.hpp), on a store served in this process: the launcher's roster, views
// pinned once without a barrier, joiners, the stop step and the settings a joiner must share.
// The runs themselves are tests/gloo_elastic.sh.
#include <gtest/gtest.h>

#include "gasloc/algo/store_views.hpp"
#include "gasloc/comm/elastic_roster.hpp"
#include "gasloc/comm/store.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/train/elastic_process.hpp"

using namespace gasloc;
using comm::RankState;

namespace {

struct Job {
  comm::StoreServer server{{"127.0.0.1", 0, false, {}}};
  c10::intrusive_ptr<c10d::Store> store = server.local();
  comm::RosterWriter writer{*store, 4};
  Job() {
    for (int id = 0; id < 4; ++id) writer.started(id, 0, /*member=*/true);
  }
  comm::ElasticRoster rank(int id, int64_t inc = 0) { return comm::ElasticRoster(store, id, inc); }
};

}  // namespace

TEST(ElasticRoster, EncodesAndRefusesGarbage) {
  comm::Roster r;
  r.entries = {{0, 0, RankState::member}, {1, 3, RankState::joining}, {2, 1, RankState::dead}};
  const auto back = comm::Roster::decode(r.encode());
  ASSERT_EQ(back.entries.size(), 3u);
  EXPECT_EQ(back.entries[1].incarnation, 3);
  EXPECT_EQ(back.entries[1].state, RankState::joining);
  EXPECT_EQ(back.with(RankState::member), std::vector<int>{0});
  EXPECT_THROW(comm::Roster::decode("0:0:x;"), CommError);
  EXPECT_THROW(comm::Roster::decode("0:zero:m;"), CommError);
  EXPECT_THROW(comm::PinnedView::decode(3, 0, "m=0:0,1"), CommError);
}

TEST(ElasticRoster, WriterFollowsAnIncarnationFromStartToMember) {
  Job job;
  auto r2 = job.rank(2, 1);
  job.writer.exited(2, 0);
  EXPECT_EQ(job.writer.roster().find(2)->state, RankState::dead);
  job.writer.exited(2, 0);  // twice: no change
  job.writer.started(2, 1, /*member=*/false);
  EXPECT_TRUE(job.writer.poll().empty());
  EXPECT_EQ(job.writer.roster().find(2)->state, RankState::starting);
  // An announcement of an older incarnation is stale.
  job.rank(2, 0).announce_up();
  job.writer.poll();
  EXPECT_EQ(job.writer.roster().find(2)->state, RankState::starting);
  r2.announce_up();
  EXPECT_TRUE(job.writer.poll().empty());
  EXPECT_EQ(job.writer.roster().find(2)->state, RankState::joining);
  r2.announce_member();
  EXPECT_EQ(job.writer.poll(), std::vector<int>{2});
  EXPECT_EQ(r2.read().find(2)->state, RankState::member);  // what ranks read is what the writer wrote
  // An exit of the old incarnation after the restart changes nothing.
  job.writer.exited(2, 0);
  EXPECT_EQ(job.writer.roster().find(2)->state, RankState::member);
}

TEST(ElasticRoster, AViewIsPinnedOnceAndReadByEveryone) {
  Job job;
  auto r0 = job.rank(0), r3 = job.rank(3);
  const auto first = r0.pin(5);
  EXPECT_EQ(first.members, (std::vector<int>{0, 1, 2, 3}));
  job.writer.exited(1, 0);  // dies after the pin: round 5's view keeps it, round 6's does not
  EXPECT_EQ(r3.pin(5).encode(), first.encode());
  EXPECT_EQ(r3.pin(6).members, (std::vector<int>{0, 2, 3}));
  EXPECT_EQ(r0.pin(6).members, (std::vector<int>{0, 2, 3}));
  EXPECT_EQ(r0.latest_round(), 6);
  // The retry of an aborted round is its own key: pinned from the roster as it is now.
  EXPECT_EQ(r3.pin(5, 1).members, (std::vector<int>{0, 2, 3}));
  EXPECT_EQ(r0.pin(5).members.size(), 4u);
  EXPECT_FALSE(r0.pinned(7).has_value());
  EXPECT_TRUE(r0.gone(1, 0));
  EXPECT_FALSE(r0.gone(2, 0));
}

TEST(ElasticRoster, AJoinerHealedAMomentAgoIsAMember) {
  Job job;
  job.writer.exited(1, 0);
  job.writer.started(1, 1, false);
  auto j = job.rank(1, 1);
  j.announce_up();
  job.writer.poll();
  auto r0 = job.rank(0);
  const auto v = r0.pin(3);
  EXPECT_EQ(v.joining, std::vector<int>{1});
  EXPECT_EQ(v.incarnation.at(1), 1);
  EXPECT_EQ(r0.incarnation_of(1), 1);
  // Healed at round 3; the launcher has not polled yet when round 4 is pinned.
  j.announce_member();
  const auto w = r0.pin(4);
  EXPECT_EQ(w.members, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_TRUE(w.joining.empty());
}

TEST(StoreViews, ReportsWhoLeftAndRefusesARankDeclaredDead) {
  Job job;
  auto r0 = job.rank(0), r2 = job.rank(2);
  algo::StoreViews views0(4, r0), views2(4, r2);
  EXPECT_TRUE(views0.view(0).left.empty());
  job.writer.exited(3, 0);
  const auto v1 = views0.view(1);
  EXPECT_EQ(v1.members, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(v1.left, std::vector<int>{3});
  EXPECT_TRUE(v1.dying.empty());
  EXPECT_TRUE(views0.computes(0, 1));
  // Fenced: a rank the launcher declared dead learns it from the next view.
  job.writer.exited(2, 0);
  try {
    views2.view(2);
    FAIL() << "a rank outside the view went on";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("declared it dead"), std::string::npos) << e.what();
  }
  EXPECT_EQ(views0.retry(v1, 1).members, (std::vector<int>{0, 1}));
}

TEST(ElasticProcess, AJoinerWithOtherSettingsIsRefusedNamingTheKey) {
  Job job;
  auto r0 = job.rank(0), r1 = job.rank(1, 1);
  train::ElasticProcess p0(r0, 4, 5, 10.0), p1(r1, 4, 5, 10.0);
  const nlohmann::json run = {{"model", {{"dim", 64}, {"n_layers", 2}}}, {"algo", {{"name", "gasloc"}}}};
  p0.agree(run);
  p1.agree(run);  // the same settings join
  nlohmann::json other = run;
  other["model"]["dim"] = 128;
  try {
    p1.agree(other);
    FAIL() << "a joiner with another model joined";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model.dim is 128 here but 64 in the running job"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(p1.joiner());
  EXPECT_FALSE(p1.leader());
  EXPECT_TRUE(p0.leader());
}

TEST(ElasticProcess, EveryRankStopsAtTheStepTheFirstInterruptProposed) {
  Job job;
  auto r0 = job.rank(0), r1 = job.rank(1);
  train::ElasticProcess p0(r0, 4, 5, 10.0), p1(r1, 4, 5, 10.0);
  EXPECT_FALSE(p1.should_stop(6, false));
  // Interrupted at step 7 with rounds of 5 steps: two rounds ahead, at a round's end.
  EXPECT_FALSE(p0.should_stop(7, true));
  EXPECT_EQ(r0.stop_step(), 15);
  EXPECT_FALSE(p1.should_stop(8, true));  // a later proposal does not move it
  EXPECT_EQ(r1.stop_step(), 15);
  EXPECT_FALSE(p1.should_stop(14, false));
  EXPECT_TRUE(p1.should_stop(15, false));
  EXPECT_TRUE(p0.should_stop(15, false));
}
