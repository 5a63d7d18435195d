// Overlapped compressed rounds (algo/relayed_mix.hpp): a blocking mix of several exchanges run
// against a relay, its exchanges started and landed between inner steps. The relay's clock is
// pinned to hand-computed values, its failures to the blocking mix's, and every codec's
// overlapped round to its blocking round (algo/mix/codec_mix.hpp), bit for bit.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <optional>
#include <string>
#include <vector>

#include "gasloc/algo/compression.hpp"
#include "gasloc/algo/mix/make_mix.hpp"
#include "gasloc/algo/relayed_mix.hpp"
#include "gasloc/comm/inproc.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/topology/topology.hpp"

using namespace gasloc;

namespace {

// Three exchanges in a chain, each message built from what the last one brought: 6000 floats,
// 24000 bytes a message.
torch::Tensor chained(comm::Communicator& c) {
  auto x = torch::full({6000}, static_cast<float>(c.rank() + 1));
  for (int k = 0; k < 3; ++k) {
    std::vector<torch::Tensor> recv;
    c.exchange({1 - c.rank()}, x, recv);
    x = x * 0.25 + recv.at(0) * (0.5 + k);
  }
  return x;
}

comm::NetworkModel one_and_a_half_seconds_a_message() {
  comm::NetworkModel net;
  net.step_time_s = 1.0;
  net.latency_s = 0.0;
  net.bandwidth_Bps = 16000.0;  // 24000 bytes: 1.5 s a pair exchange
  return net;
}

}  // namespace

// Exchange 1 travels over [0, 1.5]; it has landed at the boundary of step 2, so exchange 2 goes
// over [2, 3.5] and exchange 3 over [4, 5.5]; finish() after step 5 waits 0.5 s. The blocking mix
// pays 3 x 1.5 s on top of the 5 steps. The results are the same bits.
TEST(RelayedMix, EachExchangeStartsAtTheFirstStepBoundaryAfterTheLastLanded) {
  const auto net = one_and_a_half_seconds_a_message();
  std::vector<torch::Tensor> relayed(2), blocking(2);
  comm::InProcCluster overlapped(2, net);
  overlapped.run([&](int r, comm::Communicator& c) {
    algo::RelayedMix mix(c, chained);
    for (int k = 0; k < 5; ++k) {
      c.compute(1);
      mix.progress();
    }
    relayed[r] = mix.finish();
  });
  comm::InProcCluster plain(2, net);
  plain.run([&](int r, comm::Communicator& c) {
    blocking[r] = chained(c);
    c.compute(5);
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(torch::equal(relayed[r], blocking[r])) << "rank " << r;
    EXPECT_NEAR(overlapped.clock(r), 5.5, 1e-12);
    EXPECT_NEAR(overlapped.stats(r).idle_s, 0.5, 1e-12);
    EXPECT_NEAR(overlapped.stats(r).compute_s, 5.0, 1e-12);
    EXPECT_EQ(overlapped.stats(r).bytes_sent, 3 * 24000);
    EXPECT_NEAR(plain.clock(r), 9.5, 1e-12);
  }
  // Not one relayed bit in a row of the same values: the chain mixed both ranks.
  EXPECT_FALSE(torch::equal(relayed[0], relayed[1]));
}

// Without steps between them (finish() at once) the exchanges go back to back: the blocking price.
TEST(RelayedMix, FinishedAtOnceItCostsWhatTheBlockingMixCosts) {
  comm::InProcCluster cluster(2, one_and_a_half_seconds_a_message());
  cluster.run([&](int, comm::Communicator& c) { algo::RelayedMix(c, chained).finish(); });
  for (int r = 0; r < 2; ++r) EXPECT_NEAR(cluster.clock(r), 4.5, 1e-12);
}

// The mix's own error comes back from finish(), its type kept; a mix that calls anything but
// exchange() is an internal error naming the call; a relay dropped before finish() (its worker
// failed) makes the mix's pending exchange throw, and its thread ends: nothing hangs.
TEST(RelayedMix, ErrorsComeBackFromFinishAndADroppedRelayEndsItsMix) {
  comm::InProcCluster cluster(1);
  cluster.run([&](int, comm::Communicator& c) {
    algo::RelayedMix fails(c, [](comm::Communicator& rc) -> torch::Tensor {
      std::vector<torch::Tensor> recv;
      rc.exchange({}, torch::zeros({4}), recv);
      throw ConfigError("a setting the mix refused");
    });
    EXPECT_THROW(fails.finish(), ConfigError);

    algo::RelayedMix calls_barrier(c, [](comm::Communicator& rc) -> torch::Tensor {
      rc.barrier();
      return {};
    });
    try {
      calls_barrier.finish();
      ADD_FAILURE() << "expected an error for a barrier in a relayed mix";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("barrier"), std::string::npos) << e.what();
    }

    bool saw_cancel = false;
    {
      algo::RelayedMix dropped(c, [&](comm::Communicator& rc) -> torch::Tensor {
        std::vector<torch::Tensor> recv;
        try {
          rc.exchange({}, torch::zeros({4}), recv);
          rc.exchange({}, torch::zeros({4}), recv);
        } catch (const CommError&) {
          saw_cancel = true;
          throw;
        }
        return {};
      });
    }
    EXPECT_TRUE(saw_cancel);
  });
}

// ---------------------------------------------------------------------------------------------
// Every codec's round, overlapped (start_mix, progress() after each of 3 steps, finish_mix)
// against the blocking mix(), over several rounds so that the codec's state (grids, references,
// feedback) carries: the same bits, the same resends, and a clock that hid part of the transfer.

namespace {

torch::Tensor wave(int64_t n, int rank) {
  return torch::sin(torch::arange(n, torch::kFloat) * (0.37f * static_cast<float>(rank + 1)) + static_cast<float>(rank));
}

struct Rounds {
  std::vector<torch::Tensor> m;
  std::vector<int64_t> resends;
  std::vector<double> clock;
  std::vector<std::vector<int64_t>> clipped;  // algo.clip_peers' counts by sender, per rank
};

Rounds run_rounds(int n, const algo::MixOptions& options, bool overlapped, int rounds = 4) {
  comm::NetworkModel net;
  net.step_time_s = 0.01;
  net.latency_s = 0.002;
  net.bandwidth_Bps = 1e5;
  comm::InProcCluster cluster(n, net);
  const topology::Topology& t = options.topology;
  Rounds out{std::vector<torch::Tensor>(n), std::vector<int64_t>(n), {}, std::vector<std::vector<int64_t>>(n)};
  cluster.run([&](int rank, comm::Communicator& c) {
    algo::MixOptions o = options;
    o.overlapped = overlapped;
    const auto mixer = algo::make_mix(o);
    auto x = wave(777, rank) * 0.01 + 1.0;
    // The all-reduce's anchor: theta, the same on every worker, moved to each round's result.
    auto anchor = torch::ones({777}) + 0.001 * wave(777, 99);
    for (int k = 0; k < rounds; ++k) {
      torch::Tensor m;
      if (overlapped) {
        algo::MixFlight f = mixer->start({.t = k, .x = x, .anchor = anchor, .overlapped = true}, c);
        for (int s = 0; s < 3; ++s) {
          c.compute(1);
          mixer->progress(f);
        }
        m = mixer->finish(f);
      } else {
        m = mixer->mix({.t = k, .x = x, .anchor = anchor}, c);
        c.compute(3);
      }
      if (t.is_all_reduce()) anchor = m.clone();
      x = m + 1e-3 * wave(777, 7 * k + rank);
    }
    out.m[rank] = x;
    out.resends[rank] = mixer->stats().codec_resends.value_or(0);
    out.clipped[rank] = mixer->stats().clipped_from.value_or(std::vector<int64_t>{});
  });
  for (int r = 0; r < n; ++r) out.clock.push_back(cluster.clock(r));
  return out;
}

Rounds run_rounds(int n, const std::string& topo, const algo::CompressionOptions& o, bool overlapped, int rounds = 4) {
  return run_rounds(n, {.topology = topology::Topology(topology::parse_kind(topo), n, 11), .compression = o}, overlapped, rounds);
}

}  // namespace

TEST(OverlappedCompressedRounds, EveryCodecGivesTheBlockingRoundsBits) {
  struct Case {
    std::string name, topo;
    algo::CompressionOptions o;
  };
  auto gossip = [](comm::Codec codec, algo::GossipCodec g) {
    algo::CompressionOptions o{codec};
    o.gossip = g;
    o.reference_every = 2;
    o.margin = 2.0;  // narrow grids: wraps, and so resends, happen
    return o;
  };
  auto reduce = [](comm::Codec codec, bool feedback) {
    algo::CompressionOptions o{codec};
    o.error_feedback = feedback;
    return o;
  };
  const std::vector<Case> cases = {
      {"direct int8 1peer", "1peer", gossip(comm::Codec::int8(64), algo::GossipCodec::direct)},
      {"delta int8 2peer", "2peer", gossip(comm::Codec::int8(64), algo::GossipCodec::delta)},
      {"delta int4 1peer", "1peer", gossip(comm::Codec::int4(64), algo::GossipCodec::delta)},
      {"modulo int8 2peer", "2peer", gossip(comm::Codec::int8(64), algo::GossipCodec::modulo)},
      {"modulo int4 1peer", "1peer", gossip(comm::Codec::int4(64), algo::GossipCodec::modulo)},
      {"owners' int8 all-reduce", "complete", reduce(comm::Codec::int8(64), false)},
      {"owners' int4 all-reduce, feedback", "complete", reduce(comm::Codec::int4(64), true)},
      {"topk all-reduce, feedback", "complete", reduce(comm::Codec::topk(1.0 / 16, 256), true)}};
  int64_t resends = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const int n = 5;
    const Rounds blocking = run_rounds(n, c.topo, c.o, false), overlapped = run_rounds(n, c.topo, c.o, true);
    for (int r = 0; r < n; ++r) {
      EXPECT_TRUE(torch::equal(blocking.m[r], overlapped.m[r])) << "rank " << r;
      EXPECT_EQ(blocking.resends[r], overlapped.resends[r]) << "rank " << r;
      EXPECT_LT(overlapped.clock[r], blocking.clock[r]) << "rank " << r << ": nothing of the transfer was hidden";
      resends += blocking.resends[r];
    }
  }
  EXPECT_GT(resends, 0) << "no modulo chunk wrapped: the resend exchange was never relayed";
}

// Issue 63: a clipped all-reduce (an exchange with every worker, then the clipped sum) overlaps
// through the relay, as compressed rounds do: the blocking round's bits and clipping decisions,
// with transfer hidden. Worker 2's message is scaled by 50 at rounds 1 and 2 (faults.poison).
TEST(OverlappedClippedAllReduce, GivesTheBlockingRoundsBitsAndClipsAlike) {
  const int n = 5;
  const algo::MixOptions o{.topology = topology::Topology(topology::Kind::complete, n, 0),
                           .clip = 2.0,
                           .poisons = {{.worker = 2, .round = 1, .factor = 50.0}, {.worker = 2, .round = 2, .factor = 50.0}}};
  const Rounds blocking = run_rounds(n, o, false), overlapped = run_rounds(n, o, true);
  for (int r = 0; r < n; ++r) {
    EXPECT_TRUE(torch::equal(blocking.m[r], overlapped.m[r])) << "rank " << r;
    EXPECT_EQ(blocking.clipped[r], overlapped.clipped[r]) << "rank " << r;
    EXPECT_LT(overlapped.clock[r], blocking.clock[r]) << "rank " << r << ": nothing of the transfer was hidden";
    if (r != 2) EXPECT_GE(overlapped.clipped[r].at(2), 2) << "rank " << r << " did not clip the poisoned messages";
  }
}
