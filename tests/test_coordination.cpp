// The coordination interface the trainer asks (train/coordination.hpp), each implementation on
// its own: the collective one over an in-process cluster, the store one over a store served in
// this process. The runs themselves are tests/test_train.cpp and the shell tests.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "gasloc/comm/cluster.hpp"
#include "gasloc/comm/elastic_roster.hpp"
#include "gasloc/comm/store.hpp"
#include "gasloc/train/coordination.hpp"
#include "test_util.hpp"

using namespace gasloc;

namespace {

std::unique_ptr<comm::Cluster> inproc_cluster(int workers) {
  comm::ClusterOptions o;
  o.backend = "inproc";
  o.workers = workers;
  o.timeout_s = 30;
  o.network = [](int) { return comm::NetworkModel{}; };
  return comm::make_cluster(o);
}

// Each rank steps to `steps`, meeting the others at every step as an algorithm's round would, and
// asks to stop at `ask_at` when it is `asker`; returns the step each rank stopped after (steps
// when none did).
std::vector<int64_t> stop_steps(comm::Cluster& cluster, train::Coordination& coord, int asker, int64_t ask_at,
                                int64_t steps) {
  std::vector<int64_t> stopped(static_cast<size_t>(cluster.world()), steps);
  cluster.run([&](int r, comm::Communicator&) {
    for (int64_t step = 1; step <= steps; ++step) {
      cluster.control(r).barrier();
      if (coord.should_stop(r, step, r == asker && step >= ask_at)) {
        stopped[static_cast<size_t>(r)] = step;
        return;
      }
    }
  });
  return stopped;
}

}  // namespace

// Ctrl+C seen by one thread: every rank of the process stops after the same step, the one after
// the latest step any rank had checked (so none has passed it).
TEST(CollectiveCoordination, RanksOfOneProcessStopAfterTheSameStep) {
  auto cluster = inproc_cluster(2);
  train::CollectiveCoordination coord(*cluster, /*stop_check_every=*/10, /*local_eval=*/false);
  coord.open_evaluation({});
  EXPECT_TRUE(coord.leader());
  EXPECT_FALSE(coord.joiner());
  EXPECT_TRUE(coord.one_process());
  EXPECT_EQ(coord.store_views(), nullptr);
  for (int asker : {0, 1}) {
    train::CollectiveCoordination fresh(*cluster, 10, false);
    fresh.open_evaluation({});
    EXPECT_EQ(stop_steps(*cluster, fresh, asker, 3, 10), (std::vector<int64_t>{4, 4})) << "asked by rank " << asker;
  }
}

// A commit is the second phase: a rank commits only once every rank has written the step, so
// rank 0, quick, waits for rank 1, slow, to have written its file.
TEST(CollectiveCoordination, ARankCommitsOnlyOnceEveryRankHasWritten) {
  auto cluster = inproc_cluster(2);
  const auto dir = test_util::temp_root("coordination_commit");
  const train::RunCheckpoints ckpts(dir, 2);
  train::CollectiveCoordination coord(*cluster, 10, false);
  const train::Checkpoint c{{{"step", 5}}, {{"x", torch::ones({3})}}};
  bool peer_written_at_commit = false;
  cluster->run([&](int r, comm::Communicator&) {
    if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ckpts.write(5, r, c);
    coord.commit(r, 5, ckpts);
    if (r == 0) peer_written_at_commit = std::filesystem::exists(ckpts.file(5, 1));
  });
  EXPECT_TRUE(peer_written_at_commit);
  EXPECT_EQ(ckpts.committed(0), std::vector<int64_t>{5});
  EXPECT_EQ(ckpts.committed(1), std::vector<int64_t>{5});
  std::filesystem::remove_all(dir);
}

TEST(CollectiveCoordination, OneWorkerStopsAtTheStepItWasAskedAt) {
  auto cluster = inproc_cluster(1);
  train::CollectiveCoordination coord(*cluster, 10, false);
  coord.open_evaluation({});
  EXPECT_EQ(stop_steps(*cluster, coord, 0, 3, 10), (std::vector<int64_t>{3}));
}

TEST(CollectiveCoordination, IsChosenForTheInProcessCluster) {
  auto cluster = inproc_cluster(2);
  train::JobConfig job;
  const auto coord = train::make_coordination(*cluster, job);
  EXPECT_NE(dynamic_cast<train::CollectiveCoordination*>(coord.get()), nullptr);
}

// Elastic Gloo ranks have no collective: the stop is proposed in the store, two rounds ahead, and
// every rank stops there; each rank commits its own checkpoint without waiting for another.
TEST(StoreCoordination, EveryRankStopsAtTheStepTheFirstInterruptProposed) {
  comm::StoreServer server{{"127.0.0.1", 0, false, {}}};
  c10::intrusive_ptr<c10d::Store> store = server.local();
  comm::RosterWriter writer{*store, 2};
  for (int id = 0; id < 2; ++id) writer.started(id, 0, /*member=*/true);
  comm::ElasticRoster r0(store, 0, 0), r1(store, 1, 0);
  train::StoreCoordination c0(r0, 2, 5, 10.0), c1(r1, 2, 5, 10.0);
  EXPECT_TRUE(c0.leader());
  EXPECT_FALSE(c1.leader());
  EXPECT_FALSE(c0.joiner());
  EXPECT_FALSE(c0.one_process());
  EXPECT_NE(c0.store_views(), nullptr);
  EXPECT_FALSE(c1.should_stop(1, 6, false));
  EXPECT_FALSE(c0.should_stop(0, 7, true));  // rounds of 5 steps: stop at 15
  EXPECT_FALSE(c1.should_stop(1, 14, false));
  EXPECT_TRUE(c1.should_stop(1, 15, false));
  EXPECT_TRUE(c0.should_stop(0, 15, false));
}

TEST(StoreCoordination, ARankCommitsWithoutWaitingForAnother) {
  comm::StoreServer server{{"127.0.0.1", 0, false, {}}};
  c10::intrusive_ptr<c10d::Store> store = server.local();
  comm::RosterWriter writer{*store, 2};
  for (int id = 0; id < 2; ++id) writer.started(id, 0, /*member=*/true);
  comm::ElasticRoster r0(store, 0, 0);
  train::StoreCoordination c0(r0, 2, 5, 10.0);
  const auto dir = test_util::temp_root("coordination_store_commit");
  const train::RunCheckpoints ckpts(dir, 2);
  ckpts.write(5, 0, train::Checkpoint{{{"step", 5}}, {{"x", torch::ones({3})}}});
  c0.commit(0, 5, ckpts);  // rank 1 never writes
  EXPECT_EQ(ckpts.committed(0), std::vector<int64_t>{5});
  EXPECT_TRUE(ckpts.committed(1).empty());
  std::filesystem::remove_all(dir);
}
