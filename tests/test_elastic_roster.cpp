// The store side of elastic process runs (comm/elastic_roster.hpp, algo/store_views.hpp,
// train/elastic_process.hpp), on a store served in this process: the launcher's roster, views
// pinned once without a barrier, joiners, the stop step and the settings a joiner must share.
// The runs themselves are tests/gloo_elastic.sh.
#include <gtest/gtest.h>

#include <cmath>
#include <thread>

#include "gasloc/algo/store_views.hpp"
#include "gasloc/comm/by_hand.hpp"
#include "gasloc/comm/elastic_host.hpp"
#include "gasloc/comm/elastic_roster.hpp"
#include "gasloc/comm/heartbeat.hpp"
#include "gasloc/comm/store.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/core/interrupt.hpp"
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
  EXPECT_THROW(comm::View::decode(3, 0, "m=0:0,1"), CommError);
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

// The host of ranks started by hand (gasloc store --elastic), on its own clock: founding members
// until every id started, then joiners; a second process of a living id refused; death by a
// stalled heartbeat, or sooner by a suspect report over a still counter, never by the report alone.
namespace {
// The elastic host of `gasloc store --elastic -n world --founders F --heartbeat-timeout T`.
comm::ElasticHost::Options by_hand(int world, double heartbeat_timeout_s, int founders = 0) {
  return {.world = world, .founders = founders, .heartbeat_timeout_s = heartbeat_timeout_s, .by_hand = true};
}

struct HandJob {
  comm::StoreServer server{{"127.0.0.1", 0, false, {}}};
  c10::intrusive_ptr<c10d::Store> store = server.local();
  comm::ElasticHost host{*store, by_hand(3, 6.0), nullptr};
  int64_t claim(int id) { return store->add(comm::elastic_keys::claim(id), 1) - 1; }
  std::string answer(int id, int64_t inc) {
    const auto key = comm::elastic_keys::admit(id, inc);
    return store->check({key}) ? comm::to_text(store->get(key)) : "";
  }
  void beat(int id) { store->add(comm::heartbeat_key(id), 1); }
  RankState state(int id) { return host.roster().find(id)->state; }
  // The host's loop up to `t`, looking every half second as gasloc store does (a longer gap is
  // the host's own pause, which it forgives), the `beating` ranks beating at every look.
  std::vector<std::string> tend(double t, const std::vector<int>& beating = {}) {
    std::vector<std::string> events;
    do {
      now = std::min(t, now + 0.5);
      for (int id : beating) beat(id);
      events.clear();
      for (const auto& e : host.tend(now)) events.push_back(e.line);
    } while (now < t);
    return events;
  }
  double now = 0;
};
}  // namespace

TEST(HostByHand, FoundsTheJobThenAdmitsJoinersAndRefusesALivingId) {
  HandJob job;
  EXPECT_EQ(job.claim(0), 0);
  EXPECT_EQ(job.claim(2), 0);
  job.host.tend(0.0);
  EXPECT_EQ(job.answer(0, 0), "member");
  EXPECT_FALSE(job.host.founded());
  EXPECT_FALSE(job.store->check({comm::elastic_keys::founded()}));
  job.claim(1);
  job.tend(0.5);
  EXPECT_TRUE(job.host.founded());
  EXPECT_TRUE(job.store->check({comm::elastic_keys::founded()}));
  // Rank 1 again while it beats: refused, naming it.
  job.beat(1);
  job.tend(1.0);
  EXPECT_EQ(job.claim(1), 1);
  job.tend(2.0);
  EXPECT_NE(job.answer(1, 1).find("refused:rank 1 is already alive (incarnation 0"), std::string::npos) << job.answer(1, 1);
  EXPECT_EQ(job.host.roster().find(1)->incarnation, 0);
  // Silent for the heartbeat timeout (6 s from its last beat at 1.0): dead at 7.0, not before.
  job.tend(6.9, {0, 2});
  EXPECT_EQ(job.state(1), RankState::member);
  const auto dead = job.tend(7.0, {0, 2});
  EXPECT_EQ(job.state(1), RankState::dead);
  ASSERT_FALSE(dead.empty());
  EXPECT_NE(dead.back().find("rank 1 (incarnation 0) sent no heartbeat for 6 s"), std::string::npos) << dead.back();
  // Started again after the job began: a joiner.
  EXPECT_EQ(job.claim(1), 2);
  job.tend(7.5, {0, 2});
  EXPECT_EQ(job.answer(1, 2), "joiner");
  EXPECT_EQ(job.state(1), RankState::starting);
  comm::ElasticRoster r1(job.store, 1, 2, false);
  r1.announce_up();
  job.tend(7.6, {0, 2});
  EXPECT_EQ(job.state(1), RankState::joining);
  r1.announce_member();
  const auto events = job.tend(7.7, {0, 2});
  EXPECT_EQ(job.state(1), RankState::member);
  ASSERT_FALSE(events.empty());
  EXPECT_NE(events.back().find("rank 1 (incarnation 2) rejoined"), std::string::npos) << events.back();
  // An incarnation that ends says so and leaves at once; an older one's word is ignored.
  comm::announce_out(*job.store, 1, 0);
  job.tend(7.8, {0, 2});
  EXPECT_EQ(job.state(1), RankState::member);
  comm::announce_out(*job.store, 1, 2);
  job.tend(7.9, {0, 2});
  EXPECT_EQ(job.state(1), RankState::dead);
}

// With --founders 2 of 3: ids 0 and 1 found the job; id 2, claimed first, is answered only once
// the job runs, as a joiner; a founder's cluster.join is refused before, an extra id's is not.
TEST(HostByHand, IdsBeyondTheFoundersJoinOnceTheJobRuns) {
  comm::StoreServer server{{"127.0.0.1", 0, false, {}}};
  auto store = server.local();
  comm::ElasticHost host(*store, by_hand(3, 6.0, 2), nullptr);
  EXPECT_TRUE(comm::founds_the_job(*store, 1));
  EXPECT_FALSE(comm::founds_the_job(*store, 2));
  const auto claim = [&](int id) { return store->add(comm::elastic_keys::claim(id), 1) - 1; };
  const auto answer = [&](int id, int64_t inc) {
    const auto key = comm::elastic_keys::admit(id, inc);
    return store->check({key}) ? comm::to_text(store->get(key)) : "";
  };
  claim(2);
  claim(0);
  host.tend(0.0);
  EXPECT_EQ(answer(0, 0), "member");
  EXPECT_EQ(answer(2, 0), "");  // not before the job runs
  EXPECT_FALSE(host.founded());
  claim(1);
  host.tend(0.1);
  EXPECT_TRUE(host.founded());
  host.tend(0.2);
  EXPECT_EQ(answer(1, 0), "member");
  EXPECT_EQ(answer(2, 0), "joiner");
  EXPECT_FALSE(comm::founds_the_job(*store, 0));
  // A second host refused for its --founders leaves the running job's roster as it was.
  const auto roster = comm::to_text(store->get(comm::elastic_keys::roster()));
  EXPECT_THROW(comm::ElasticHost(*store, by_hand(3, 6.0, 4), nullptr), ConfigError);
  EXPECT_EQ(comm::to_text(store->get(comm::elastic_keys::roster())), roster);
}

TEST(HostByHand, ASuspectReportEvictsOnlyOverAStillCounter) {
  HandJob job;
  for (int id = 0; id < 3; ++id) job.claim(id);
  job.host.tend(0.0);
  ASSERT_TRUE(job.host.founded());
  comm::ElasticRoster r0(job.store, 0, 0);
  // Rank 2 beats on: a report of its link is a failed edge, not a death.
  r0.suspect(2, 0);
  job.tend(4.0, {0, 1, 2});
  EXPECT_EQ(job.state(2), RankState::member);
  // Rank 1 stops beating at 4.5 and is reported: dead once its counter is still for 3 s, well
  // before the 6 s heartbeat timeout.
  job.tend(4.5, {0, 1, 2});
  r0.suspect(1, 0);
  job.tend(7.4, {0, 2});
  EXPECT_EQ(job.state(1), RankState::member);
  job.tend(7.5, {0, 2});
  EXPECT_EQ(job.state(1), RankState::dead);
}

TEST(HostByHand, ARankOfAnotherWorldSizeOrWithoutAHostIsRefused) {
  comm::StoreServer server{{"127.0.0.1", 0, false, {}}};
  auto store = server.local();
  EXPECT_THROW(comm::admit_by_hand(*store, 0, 3, 1.0), CommError);  // no gasloc store --elastic
  comm::ElasticHost host(*store, by_hand(3, 6.0), nullptr);
  try {
    comm::admit_by_hand(*store, 0, 4, 1.0);
    FAIL() << "another world size was admitted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("WORLD_SIZE is 4 here but the job's gasloc store serves 3"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(comm::admit_by_hand(*store, 3, 3, 1.0), ConfigError);
  // Nobody answers a claim when the host does not tend: bounded by the timeout.
  EXPECT_THROW(comm::admit_by_hand(*store, 0, 3, 0.2), CommError);
}

TEST(StoreViews, AnOlderIncarnationOfAListedIdIsOut) {
  Job job;
  auto old2 = job.rank(2, 0);
  algo::StoreViews views(4, old2);
  EXPECT_NO_THROW(views.view(0));
  // Declared dead while stopped, and replaced: the id is listed again, as incarnation 1.
  job.writer.exited(2, 0);
  job.writer.started(2, 1, /*member=*/true);
  EXPECT_THROW(views.view(1), CommError);
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

// A paused store host (issue: a launcher stopped for 15 s killed every healthy rank): its judge
// forgives the time it did not run itself, and a rank's beats go on over a new connection once a
// call on the old one failed.
TEST(Heartbeat, AGapInTheJudgesOwnClockBlamesNobody) {
  comm::StoreServer server{{"127.0.0.1", 0, false, {}}};
  auto store = server.local();
  comm::HeartbeatWatch watch(2, 4.0);
  store->add(comm::heartbeat_key(0), 1);
  store->add(comm::heartbeat_key(1), 1);
  EXPECT_TRUE(watch.stalled(*store, 0.0).empty());
  EXPECT_TRUE(watch.stalled(*store, 0.2).empty());
  // The host was stopped for 15 s: nobody could be heard meanwhile, so nobody is stalled yet.
  EXPECT_TRUE(watch.stalled(*store, 15.2).empty());
  store->add(comm::heartbeat_key(0), 1);  // rank 0 beats again, rank 1 does not
  std::vector<int> stalled;
  for (double t = 15.4; t < 20.0 && stalled.empty(); t += 0.2) stalled = watch.stalled(*store, t);
  EXPECT_EQ(stalled, std::vector<int>{1});  // named about the timeout after the host resumed
}

// The one judge of both hosts: a rank watched from its admission is judged whether or not it
// ever beat; a peer's report settles by the counter alone: two beats since clear it (a failed
// edge), suspect_silence_s() of stillness makes it gone, a report of a replaced incarnation is
// dropped; without a timeout nobody is judged stalled.
TEST(Heartbeat, OneJudgeSettlesReportsByTheCounter) {
  comm::StoreServer server{{"127.0.0.1", 0, false, {}}};
  auto store = server.local();
  comm::HeartbeatWatch watch(3, 6.0);
  EXPECT_DOUBLE_EQ(watch.suspect_silence_s(), 3.0);
  watch.watch_from(*store, 2, 0.0);  // admitted, never beats
  store->add(comm::heartbeat_key(0), 1);
  store->add(comm::heartbeat_key(1), 1);
  EXPECT_TRUE(watch.stalled(*store, 0.0).empty());
  const auto current = [](int, int64_t inc) { return inc == 0; };
  watch.reported(1, 0);
  watch.reported(0, 7);  // an incarnation that is not the current one
  std::vector<int> beating;
  for (double t = 0.5; t <= 2.0; t += 0.5) {
    store->add(comm::heartbeat_key(1), 1);
    EXPECT_TRUE(watch.stalled(*store, t).empty());
    const auto r = watch.settle_reports(t, current);
    EXPECT_TRUE(r.gone.empty());
    beating.insert(beating.end(), r.beating.begin(), r.beating.end());
  }
  EXPECT_EQ(beating, std::vector<int>{1});
  // Reported again, and still from 2.0: gone at 5.0 (3 s), not before.
  watch.reported(1, 0);
  for (double t = 2.5; t < 5.0; t += 0.5) {
    watch.stalled(*store, t);
    EXPECT_TRUE(watch.settle_reports(t, current).gone.empty()) << t;
  }
  watch.stalled(*store, 5.0);
  const auto r = watch.settle_reports(5.0, current);
  ASSERT_EQ(r.gone.size(), 1u);
  EXPECT_EQ(r.gone[0].first, 1);
  EXPECT_DOUBLE_EQ(r.gone[0].second, 3.0);
  // Rank 2 never beat, but was watched from 0.0: stalled at 6.0; rank 0 (beat once, at 0) too.
  EXPECT_EQ(watch.stalled(*store, 5.5), std::vector<int>{});
  EXPECT_EQ(watch.stalled(*store, 6.0), (std::vector<int>{0, 2}));
  comm::HeartbeatWatch off(3, 0.0);
  off.watch_from(*store, 2, 0.0);
  off.stalled(*store, 0.0);
  EXPECT_TRUE(off.stalled(*store, 0.5).empty());
  EXPECT_TRUE(off.stalled(*store, 100.5).empty());  // the gap is forgiven anyway, and no timeout judges
}

TEST(Heartbeat, TheHostClockForgivesOnlyTheGapBeyondALook) {
  comm::HostClock clock(1.0);
  EXPECT_DOUBLE_EQ(clock.forgive(10.0), 0.0);  // the first look
  EXPECT_DOUBLE_EQ(clock.forgive(10.5), 0.0);
  EXPECT_DOUBLE_EQ(clock.forgive(16.5), 5.0);
  EXPECT_DOUBLE_EQ(clock.forgive(17.0), 0.0);
}

TEST(Heartbeat, TimeoutsShorterThanFourBeatsAreRefused) {
  EXPECT_NO_THROW(comm::check_heartbeat_timeout(2.0, "x"));
  EXPECT_NO_THROW(comm::check_heartbeat_timeout(0.0, "x", /*zero_turns_off=*/true));
  EXPECT_THROW(comm::check_heartbeat_timeout(0.0, "x"), ConfigError);
  EXPECT_THROW(comm::check_heartbeat_timeout(1.5, "x", true), ConfigError);
  EXPECT_THROW(comm::check_heartbeat_timeout(std::nan(""), "x"), ConfigError);
}

namespace {
// A connection that fails for good after `calls` calls, as a StoreClient does once a call timed out.
class FailingConnection final : public c10d::Store {
 public:
  FailingConnection(c10::intrusive_ptr<c10d::Store> base, int calls) : base_(std::move(base)), left_(calls) {}
  void set(const std::string& k, const std::vector<uint8_t>& v) override { use(), base_->set(k, v); }
  std::vector<uint8_t> compareSet(const std::string& k, const std::vector<uint8_t>& e, const std::vector<uint8_t>& d) override {
    return use(), base_->compareSet(k, e, d);
  }
  std::vector<uint8_t> get(const std::string& k) override { return use(), base_->get(k); }
  int64_t add(const std::string& k, int64_t v) override { return use(), base_->add(k, v); }
  bool deleteKey(const std::string& k) override { return use(), base_->deleteKey(k); }
  bool check(const std::vector<std::string>& k) override { return use(), base_->check(k); }
  int64_t getNumKeys() override { return use(), base_->getNumKeys(); }
  void wait(const std::vector<std::string>& k) override { use(), base_->wait(k); }
  void wait(const std::vector<std::string>& k, const std::chrono::milliseconds& t) override { use(), base_->wait(k, t); }

 private:
  void use() {
    if (left_-- <= 0) throw CommError("the store did not answer (a test's failing connection)");
  }
  c10::intrusive_ptr<c10d::Store> base_;
  int left_;
};
}  // namespace

TEST(Heartbeat, BeatsGoOnOverANewConnectionAfterAFailedOne) {
  comm::StoreServer server{{"127.0.0.1", 0, false, {}}};
  auto keys = server.local();
  int opened = 0;
  // Every connection fails after three calls; the heartbeat must keep the counter moving.
  auto store = c10::make_intrusive<comm::ReconnectingStore>([&] {
    ++opened;
    return c10::make_intrusive<FailingConnection>(keys, 3);
  });
  {
    comm::Heartbeat hb(store, 5, 0.01);
    for (int i = 0; i < 500 && keys->add(comm::heartbeat_key(5), 0) < 10; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_GE(keys->add(comm::heartbeat_key(5), 0), 10);
  EXPECT_GE(opened, 3);
  EXPECT_EQ(store->reconnects(), opened - 1);
}

// The store must not grow with the rounds: the writer deletes the views and all-reduce keys of
// rounds below every member's progress.
TEST(ElasticRoster, KeysOfRoundsNoMemberReadsAgainAreDeleted) {
  Job job;
  std::vector<comm::ElasticRoster> ranks;
  for (int id = 0; id < 4; ++id) ranks.push_back(job.rank(id));
  auto play = [&](int64_t round) {
    for (auto& r : ranks) r.pin(round);
    for (int64_t a = 0; a < 2; ++a) {  // an aborted attempt and its retry, with receipts
      job.store->set(comm::elastic_keys::all_reduce(round * comm::kAttemptsPerRound + a), comm::to_bytes("commit"));
      for (int id = 0; id < 4; ++id)
        job.store->set(comm::elastic_keys::all_reduce_ok(round * comm::kAttemptsPerRound + a, id), comm::to_bytes("1"));
    }
    job.writer.poll();
  };
  for (int64_t t = 0; t < 100; ++t) play(t);
  const int64_t at_100 = job.store->getNumKeys();
  for (int64_t t = 100; t < 2000; ++t) play(t);
  EXPECT_EQ(job.store->getNumKeys(), at_100);
  // What a member may still read is kept: this round's and the kKeptRounds before it.
  EXPECT_TRUE(job.store->check({comm::elastic_keys::view(1999, 0)}));
  EXPECT_TRUE(job.store->check({comm::elastic_keys::view(1999 - comm::RosterWriter::kKeptRounds, 0)}));
  EXPECT_FALSE(job.store->check({comm::elastic_keys::view(1000, 0)}));
  EXPECT_FALSE(job.store->check({comm::elastic_keys::all_reduce_ok(1000 * comm::kAttemptsPerRound + 1, 3)}));
}

TEST(ElasticRoster, NothingIsDeletedBelowAMemberThatLags) {
  Job job;
  auto r0 = job.rank(0), r1 = job.rank(1), r2 = job.rank(2), r3 = job.rank(3);
  r3.pin(0);
  for (int64_t t = 0; t < 50; ++t) {
    r0.pin(t), r1.pin(t), r2.pin(t);
    job.writer.poll();
  }
  EXPECT_TRUE(job.store->check({comm::elastic_keys::view(1, 0)}));  // rank 3 is at round 0
  // A dead member holds nobody back.
  job.writer.exited(3, 0);
  job.writer.poll();
  EXPECT_FALSE(job.store->check({comm::elastic_keys::view(1, 0)}));
  EXPECT_TRUE(job.store->check({comm::elastic_keys::view(49, 0)}));
}

// Resuming from commits that differ (seen: 40/30/40/30, 665/665/640/480): one step for all, the
// one the most ranks hold; a rank that does not hold it is listed as joining and healed.
TEST(ElasticProcess, RanksResumeAtTheStepTheMostHoldAndTheOthersHeal) {
  Job job;
  std::vector<comm::ElasticRoster> rosters;
  for (int id = 0; id < 4; ++id) rosters.push_back(job.rank(id));
  std::vector<std::unique_ptr<train::ElasticProcess>> ps;
  for (auto& r : rosters) ps.push_back(std::make_unique<train::ElasticProcess>(r, 4, 5, 10.0));
  const std::vector<std::vector<int64_t>> held = {{665, 640}, {665, 640}, {640, 615}, {480, 455}};
  std::vector<train::ElasticProcess::Resume> got(4);
  std::vector<std::thread> threads;
  for (int id = 0; id < 4; ++id) threads.emplace_back([&, id] { got[id] = ps[id]->agree_resume(held[id], std::nullopt); });
  for (auto& t : threads) t.join();
  for (int id = 0; id < 4; ++id) {
    EXPECT_EQ(got[id].step, 640) << id;
    EXPECT_EQ(got[id].heal, id == 3) << id;
    EXPECT_EQ(got[id].loaders, (std::vector<int>{0, 1, 2}));
    EXPECT_EQ(got[id].healers, (std::vector<int>{3}));
    EXPECT_TRUE(got[id].newer_dropped);
  }
  // Rank 3 is a member of the roster but joins in the views until it is healed.
  const auto v = rosters[0].pin(128);
  EXPECT_EQ(v.members, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(v.joining, (std::vector<int>{3}));
  rosters[3].announce_member();
  EXPECT_EQ(rosters[1].pin(129).members, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(ps[2]->agreed_resume_step(), 640);
}

TEST(ElasticProcess, AResumeStepNobodyHoldsIsRefusedNamingWhatEachHolds) {
  Job job;
  job.writer.exited(2, 0);
  job.writer.exited(3, 0);
  auto r0 = job.rank(0), r1 = job.rank(1);
  train::ElasticProcess p0(r0, 4, 5, 10.0), p1(r1, 4, 5, 10.0);
  std::thread t([&] { EXPECT_THROW(p1.agree_resume({40, 30}, 10), CheckpointError); });
  try {
    p0.agree_resume({30, 20}, 10);  // --resume-step 10: the first to decide; nobody holds it
    FAIL() << "step 10 was agreed";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("can load step"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("rank 1: 40, 30"), std::string::npos) << e.what();
  }
  t.join();
}

// Rank 0 killed in its first second (issue: every rank then waited 300 s for it to open the run's
// files): whoever claimed the files and died is replaced by a waiting rank.
TEST(ElasticProcess, TheRunFilesAreOpenedByAnotherRankWhenTheirClaimantDied) {
  Job job;
  auto r0 = job.rank(0), r1 = job.rank(1), r2 = job.rank(2);
  train::ElasticProcess p0(r0, 4, 5, 10.0), p1(r1, 4, 5, 10.0), p2(r2, 4, 5, 10.0);
  EXPECT_TRUE(p0.claim_files());  // then rank 0 dies before files_ready()
  job.writer.exited(0, 0);
  EXPECT_TRUE(p1.claim_files());
  p1.files_ready();
  EXPECT_FALSE(p2.claim_files());
}

TEST(ElasticProcess, AWaitForOtherRanksEndsAtAStopRequest) {
  Job job;
  auto r0 = job.rank(0);
  train::ElasticProcess p0(r0, 4, 5, 30.0);
  request_interrupt();
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(p0.agree_resume({10}, std::nullopt), CommError);  // ranks 1..3 never say
  clear_interrupt();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
}

// A rank killed and restarted before any view saw it gone (issue: report said deaths 0, rejoins
// 1, and no "left" line was printed): the next view lists it as a newer incarnation, and it left.
TEST(StoreViews, ARankRestartedBeforeItsDeathWasSeenLeftAndJoins) {
  Job job;
  auto r0 = job.rank(0);
  algo::StoreViews views(4, r0);
  EXPECT_TRUE(views.view(0).left.empty());
  job.writer.exited(2, 0);
  job.writer.started(2, 1, /*member=*/false);
  job.rank(2, 1).announce_up();
  job.writer.poll();
  const auto v = views.view(1);
  EXPECT_EQ(v.left, std::vector<int>{2});
  EXPECT_EQ(v.joining, std::vector<int>{2});
  EXPECT_EQ(v.incarnation.at(2), 1);
}
