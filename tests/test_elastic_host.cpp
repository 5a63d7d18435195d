// The elastic control plane (comm/elastic_host.hpp) on a fake clock: the policy of `gasloc
// launch --elastic` without processes. A fake ProcessControl records what the host asks for;
// heartbeats are counters the test moves in a store served in this process. The launched runs
// themselves are tests/gloo_elastic*.sh.
#include <gtest/gtest.h>

#include <utility>

#include "gasloc/comm/elastic_host.hpp"
#include "gasloc/comm/elastic_roster.hpp"
#include "gasloc/comm/heartbeat.hpp"
#include "gasloc/comm/rendezvous.hpp"
#include "gasloc/comm/store.hpp"
#include "gasloc/core/error.hpp"

using namespace gasloc;
using comm::HostEvent;
using comm::RankState;

namespace {

struct FakeControl : comm::ProcessControl {
  std::vector<std::pair<int, int64_t>> started;
  std::vector<int> killed;
  std::string name() const override { return "the fake launcher"; }
  void start(int id, int64_t inc) override { started.emplace_back(id, inc); }
  void kill(int id, const std::string&) override { killed.push_back(id); }
};

// A job of `world` ranks whose host looks every 0.2 s of the fake clock, as the launcher does.
struct Job {
  comm::StoreServer server{{"127.0.0.1", 0, false, {}}};
  c10::intrusive_ptr<c10d::Store> store = server.local();
  FakeControl control;
  comm::ElasticHost host;
  double now = 0;
  Job(comm::ElasticHost::Options o, bool with_control = true) : host(*store, o, with_control ? &control : nullptr) {}

  void beat(int id) { store->add(comm::heartbeat_key(id), 1); }
  RankState state(int id) { return host.roster().find(id)->state; }
  // The host's loop up to `t`, the `beating` ranks beating at every look; every event on the way.
  std::vector<HostEvent> tend(double t, const std::vector<int>& beating) {
    std::vector<HostEvent> events;
    while (now < t) {
      now = std::min(t, now + 0.2);
      for (int id : beating) beat(id);
      for (auto& e : host.tend(now)) events.push_back(std::move(e));
    }
    return events;
  }
  std::vector<HostEvent> exit(int id, std::optional<int> status, const std::string& how) {
    return host.exited(id, {status, how, how}, now);
  }
};

comm::ElasticHost::Options opts(int world, int max_restarts, int min_ranks, double heartbeat_timeout_s) {
  return {world, 0, max_restarts, min_ranks, heartbeat_timeout_s};
}

std::vector<HostEvent::Kind> kinds(const std::vector<HostEvent>& events) {
  std::vector<HostEvent::Kind> k;
  for (const auto& e : events) k.push_back(e.kind);
  return k;
}

}  // namespace

TEST(ElasticHost, AStalledRankIsFencedThenRestartedAndRejoins) {
  Job job(opts(3, 2, 1, 4.0));
  EXPECT_EQ(job.state(1), RankState::member);
  EXPECT_TRUE(job.tend(2.0, {0, 1, 2}).empty());
  // Rank 1 stops beating at 2 s: fenced once its counter has been still for the timeout, not before.
  EXPECT_TRUE(job.tend(5.8, {0, 2}).empty());
  EXPECT_TRUE(job.control.killed.empty());
  const auto fenced = job.tend(6.4, {0, 2});
  ASSERT_EQ(kinds(fenced), std::vector{HostEvent::Kind::fenced});
  EXPECT_EQ(fenced[0].id, 1);
  EXPECT_NE(fenced[0].line.find("the fake launcher killed it"), std::string::npos) << fenced[0].line;
  EXPECT_EQ(job.control.killed, std::vector{1});
  // Its peers can read who failed.
  const auto rec = comm::read_failure(*job.store, 1);
  ASSERT_TRUE(rec.has_value());
  EXPECT_EQ(rec->root, 1);
  // The kill does not repeat while the process takes its time to die.
  job.tend(7.0, {0, 2});
  EXPECT_EQ(job.control.killed, std::vector{1});

  // Its exit restarts it as incarnation 1, a joiner.
  const auto restarted = job.exit(1, std::nullopt, "signal 9 (Killed)");
  ASSERT_EQ(kinds(restarted), std::vector{HostEvent::Kind::restarted});
  EXPECT_EQ(job.control.started, (std::vector<std::pair<int, int64_t>>{{1, 1}}));
  EXPECT_EQ(job.host.incarnation(1), 1);
  EXPECT_EQ(job.host.restarts_left(), 1);
  EXPECT_EQ(job.state(1), RankState::starting);
  // The new process is not judged before it beats (it is still starting).
  EXPECT_TRUE(job.tend(15.0, {0, 2}).empty());
  comm::ElasticRoster r1(job.store, 1, 1, false);
  r1.announce_up();
  r1.announce_member();
  const auto rejoined = job.tend(15.2, {0, 1, 2});
  ASSERT_EQ(kinds(rejoined), std::vector{HostEvent::Kind::rejoined});
  EXPECT_NE(rejoined[0].line.find("rejoined"), std::string::npos) << rejoined[0].line;
  EXPECT_EQ(job.state(1), RankState::member);
  EXPECT_EQ(job.host.story(1), std::vector<std::string>{"incarnation 0 failed with signal 9 (Killed); restarted"});
}

TEST(ElasticHost, APausedRankThatResumesWithinTheTimeoutStays) {
  Job job(opts(2, 1, 1, 4.0));
  job.tend(1.0, {0, 1});
  // SIGSTOP for 3 s, then SIGCONT: its counter moves again before the timeout.
  EXPECT_TRUE(job.tend(4.0, {0}).empty());
  EXPECT_TRUE(job.tend(10.0, {0, 1}).empty());
  // The host itself paused for 20 s (no look in between): nobody's silence could be seen.
  job.now = 30.0;
  EXPECT_TRUE(job.tend(30.2, {}).empty());
  EXPECT_TRUE(job.control.killed.empty());
  // Paused for longer than the timeout, it is fenced.
  EXPECT_EQ(kinds(job.tend(35.0, {0})), std::vector{HostEvent::Kind::fenced});
  EXPECT_EQ(job.control.killed, std::vector{1});
}

TEST(ElasticHost, WithoutProcessControlAJudgedRankIsDroppedNotRestarted) {
  Job job(opts(3, 3, 1, 4.0), /*with_control=*/false);
  job.tend(1.0, {0, 1, 2});
  const auto fenced = job.tend(6.0, {0, 2});
  ASSERT_EQ(kinds(fenced), std::vector{HostEvent::Kind::fenced});
  EXPECT_NE(fenced[0].line.find("dropped from the roster"), std::string::npos) << fenced[0].line;
  EXPECT_EQ(job.state(1), RankState::dead);
  EXPECT_FALSE(job.host.running(1));
  EXPECT_EQ(job.host.restarts_left(), 3);
  EXPECT_EQ(job.host.incarnation(1), 0);
  // A peer's report alone drops nobody: rank 2 beats on, so its link was a failed edge.
  comm::ElasticRoster r0(job.store, 0, 0);
  r0.suspect(2, 0);
  const auto note = job.tend(10.0, {0, 2});
  ASSERT_EQ(kinds(note), std::vector{HostEvent::Kind::note});
  EXPECT_NE(note[0].line.find("rank 2 beats: it stays (a failed edge)"), std::string::npos) << note[0].line;
  EXPECT_EQ(job.state(2), RankState::member);
  // Reported, and still since: dropped after half the timeout (2 s), before the timeout itself.
  r0.suspect(2, 0);
  job.tend(10.2, {0, 2});
  EXPECT_TRUE(job.tend(11.8, {0}).empty());
  const auto dropped = job.tend(12.8, {0});
  ASSERT_EQ(kinds(dropped), std::vector{HostEvent::Kind::fenced});
  EXPECT_NE(dropped[0].line.find("reported by a peer"), std::string::npos) << dropped[0].line;
  EXPECT_EQ(job.state(2), RankState::dead);
  EXPECT_EQ(job.state(0), RankState::member);
  EXPECT_TRUE(job.control.killed.empty());
  EXPECT_TRUE(job.control.started.empty());
}

TEST(ElasticHost, APeersReportAloneKillsNoRankWhoseHeartbeatMoves) {
  // Anyone who reaches a pair's port can make a link fail (Gloo takes the first connection on
  // it): reports against a rank that beats are failed edges, however many come.
  Job job(opts(3, 3, 1, 4.0));
  job.tend(1.0, {0, 1, 2});
  comm::ElasticRoster r0(job.store, 0, 0), r1(job.store, 1, 0);
  std::vector<HostEvent> events;
  for (double t = 1.0; t < 12.0; t += 1.0) {
    r0.suspect(2, 0);
    r1.suspect(2, 0);
    for (auto& e : job.tend(t + 1.0, {0, 1, 2})) events.push_back(std::move(e));
  }
  EXPECT_TRUE(job.control.killed.empty()) << "a rank whose heartbeat moves was killed on peers' reports alone";
  ASSERT_FALSE(events.empty());
  for (const auto& e : events) {
    EXPECT_EQ(e.kind, HostEvent::Kind::note) << e.line;
    EXPECT_NE(e.line.find("rank 2 beats: it stays (a failed edge)"), std::string::npos) << e.line;
  }
  EXPECT_EQ(job.state(2), RankState::member);
  EXPECT_EQ(job.host.restarts_left(), 3);

  // Reported, and its counter still since: killed once still for half the timeout (2 s).
  r0.suspect(2, 0);
  job.tend(12.2, {0, 1});
  EXPECT_TRUE(job.tend(13.8, {0, 1}).empty());
  const auto fenced = job.tend(14.6, {0, 1});
  ASSERT_EQ(kinds(fenced), std::vector{HostEvent::Kind::fenced});
  EXPECT_NE(fenced[0].line.find("rank 2 was reported by a peer whose link to it failed, and silent for"),
            std::string::npos)
      << fenced[0].line;
  EXPECT_NE(fenced[0].line.find("the fake launcher killed it"), std::string::npos) << fenced[0].line;
  EXPECT_EQ(job.control.killed, std::vector{2});
  job.exit(2, std::nullopt, "signal 9 (Killed)");
  EXPECT_EQ(job.host.incarnation(2), 1);
  // A late report about the incarnation already replaced kills nobody.
  r0.suspect(2, 0);
  EXPECT_TRUE(job.tend(20.0, {0, 1}).empty());
  EXPECT_EQ(job.control.killed, std::vector{2});
}

TEST(ElasticHost, RestartsRunOutThenTheFloorStopsTheJob) {
  Job job(opts(3, 1, 2, 0));
  EXPECT_EQ(kinds(job.exit(0, 1, "exit status 1")), std::vector{HostEvent::Kind::restarted});
  // No restart left: the others go on while --min-ranks are alive.
  const auto lost = job.exit(0, 1, "exit status 1");
  ASSERT_EQ(kinds(lost), std::vector{HostEvent::Kind::lost});
  EXPECT_NE(lost[0].line.find("2 rank(s) go on without it"), std::string::npos) << lost[0].line;
  EXPECT_FALSE(job.host.stopping());
  const auto stop = job.exit(1, 1, "exit status 1");
  ASSERT_EQ(kinds(stop), (std::vector{HostEvent::Kind::lost, HostEvent::Kind::stop}));
  EXPECT_NE(stop[1].line.find("only 1 rank(s) alive, fewer than --min-ranks 2: no view can form without rank(s) 0, 1"),
            std::string::npos)
      << stop[1].line;
  EXPECT_TRUE(job.host.stopping());
  EXPECT_EQ(job.control.started.size(), 1u);
  // While the job stops, an ending is told, never acted on.
  EXPECT_TRUE(job.exit(2, std::nullopt, "signal 15 (Terminated)").empty());
  EXPECT_EQ(job.host.story(2), std::vector<std::string>{"incarnation 0 ended with signal 15 (Terminated) while the job stopped"});
}

TEST(ElasticHost, AnErrorARestartWouldMeetAgainStopsTheJob) {
  Job job(opts(2, 5, 1, 0));
  const auto events = job.exit(1, comm::kNoRestartStatus, "exit status 2");
  ASSERT_EQ(kinds(events), std::vector{HostEvent::Kind::stop});
  EXPECT_NE(events[0].line.find("which a restart would meet again"), std::string::npos) << events[0].line;
  EXPECT_TRUE(job.control.started.empty());
  EXPECT_EQ(job.host.restarts_left(), 5);
}

TEST(ElasticHost, NoMemberLeftToHealARestartStopsTheJob) {
  Job job(opts(2, 5, 1, 0));
  EXPECT_EQ(kinds(job.exit(0, 1, "exit status 1")), std::vector{HostEvent::Kind::restarted});
  // Rank 0's new incarnation is still a joiner: rank 1 was the last member.
  const auto events = job.exit(1, 1, "exit status 1");
  ASSERT_EQ(kinds(events), std::vector{HostEvent::Kind::stop});
  EXPECT_NE(events[0].line.find("no member of the job is left"), std::string::npos) << events[0].line;
}

TEST(ElasticHost, AnInterruptedJobRestartsNobody) {
  Job job(opts(3, 5, 1, 4.0));
  job.tend(1.0, {0, 1, 2});
  job.host.interrupt();
  EXPECT_TRUE(job.exit(0, 0, "exit status 0").empty());
  EXPECT_TRUE(job.exit(1, 130, "exit status 130").empty());
  EXPECT_TRUE(job.exit(2, 1, "exit status 1").empty());
  // Nor is anyone judged by heartbeats while it stops.
  EXPECT_TRUE(job.tend(20.0, {}).empty());
  EXPECT_TRUE(job.control.started.empty());
  EXPECT_TRUE(job.control.killed.empty());
  EXPECT_EQ(job.host.story(0), std::vector<std::string>{"incarnation 0 stopped as asked"});
  EXPECT_EQ(job.host.story(1), std::vector<std::string>{"incarnation 0 stopped as asked, its checkpoint committed"});
  EXPECT_TRUE(job.host.ended_well(0));
  EXPECT_FALSE(job.host.ended_well(2));
}

TEST(ElasticHost, RefusesImpossibleOptions) {
  comm::StoreServer server{{"127.0.0.1", 0, false, {}}};
  auto store = server.local();
  EXPECT_THROW(comm::ElasticHost(*store, opts(2, -1, 1, 0), nullptr), ConfigError);
  EXPECT_THROW(comm::ElasticHost(*store, opts(2, 0, 3, 0), nullptr), ConfigError);
  EXPECT_THROW(comm::ElasticHost(*store, {2, 3, 0, 1, 0}, nullptr), ConfigError);
}

// The fixed world of `gasloc launch` without --elastic: the same host with no restart and every
// rank needed. Its first failure stops the job, whatever the status and whoever is left.
TEST(ElasticHost, AFixedWorldStopsAtItsFirstFailure) {
  Job job(comm::ElasticHost::Options::fixed_world(3, 0));
  EXPECT_TRUE(job.exit(0, 0, "exit status 0").empty());
  EXPECT_TRUE(job.exit(2, 0, "exit status 0").empty());
  job.now = 7.5;
  // Rank 1 is the last member: an elastic job would have nobody to heal it from; this one just stops.
  const auto events = job.exit(1, 1, "exit status 1");
  ASSERT_EQ(kinds(events), std::vector{HostEvent::Kind::stop});
  EXPECT_EQ(events[0].line, "rank 1 failed with exit status 1 after 7.5 s; stopping the other ranks");
  EXPECT_TRUE(job.host.stopping());
  EXPECT_TRUE(job.control.started.empty());
  EXPECT_FALSE(job.host.ended_well(1));
  ASSERT_TRUE(comm::read_failure(*job.store, 1).has_value());
}

TEST(ElasticHost, AFixedWorldStopsAtAConfigurationErrorLikeAtAnyOther) {
  Job job(comm::ElasticHost::Options::fixed_world(2, 0));
  const auto events = job.exit(1, comm::kNoRestartStatus, "exit status 2");
  ASSERT_EQ(kinds(events), std::vector{HostEvent::Kind::stop});
  EXPECT_EQ(events[0].line, "rank 1 failed with exit status 2 after 0.0 s; stopping the other ranks");
  // A rank that fails while the job stops is recorded for its peers, and stops nothing more.
  EXPECT_TRUE(job.exit(0, std::nullopt, "signal 15 (Terminated)").empty());
  EXPECT_TRUE(comm::read_failure(*job.store, 0).has_value());
}

TEST(ElasticHost, AFixedWorldKillsAStalledRankAndItsEndStopsTheJob) {
  Job job(comm::ElasticHost::Options::fixed_world(3, 4.0));
  EXPECT_TRUE(job.tend(2.0, {0, 1, 2}).empty());
  const auto fenced = job.tend(6.4, {0, 2});
  ASSERT_EQ(kinds(fenced), std::vector{HostEvent::Kind::fenced});
  EXPECT_EQ(fenced[0].line,
            "rank 1 sent no heartbeat for 4 s (stopped, frozen or cut off from the store); the fake launcher killed it");
  EXPECT_EQ(job.control.killed, std::vector{1});
  const auto events = job.exit(1, std::nullopt, "signal 9 (Killed)");
  ASSERT_EQ(kinds(events), std::vector{HostEvent::Kind::stop});
  EXPECT_EQ(events[0].line, "rank 1 failed with signal 9 (Killed) after 6.4 s; stopping the other ranks");
  // Its record is the heartbeat's, written before the kill: its peers read why it went.
  const auto rec = comm::read_failure(*job.store, 1);
  ASSERT_TRUE(rec.has_value());
  EXPECT_NE(rec->what.find("sent no heartbeat"), std::string::npos) << rec->what;
  // Nobody else is judged while the job stops.
  EXPECT_TRUE(job.tend(20.0, {}).empty());
  EXPECT_EQ(job.control.killed, std::vector{1});
  EXPECT_TRUE(job.control.started.empty());
}
