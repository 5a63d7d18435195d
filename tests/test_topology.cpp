// Gossip graphs: agreement between workers, the properties every W_t must have, degrees,
// fallbacks and errors, and spectral gaps against independently derived closed forms.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <set>

#include "gasloc/algo/consensus.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/model/llama.hpp"
#include "gasloc/topology/spectral.hpp"
#include "gasloc/topology/topology.hpp"

using namespace gasloc;
using namespace gasloc::topology;
using namespace gasloc::algo;  // the forms and their consensus simulation

namespace {

const Kind kAll[] = {Kind::complete, Kind::one_peer, Kind::two_peer, Kind::ring, Kind::exp};

bool valid(Kind k, int n) {
  if (n < 1) return false;
  switch (k) {
    case Kind::complete: return true;
    case Kind::one_peer:
    case Kind::two_peer:
    case Kind::ring: return n >= 2;
    case Kind::exp: return (n & (n - 1)) == 0;
  }
  return false;
}

}  // namespace

TEST(Topology, ParseAndPrintNames) {
  for (Kind k : kAll) EXPECT_EQ(parse_kind(to_string(k)), k);
  EXPECT_EQ(parse_kind("1peer"), Kind::one_peer);
  EXPECT_EQ(parse_kind("2peer"), Kind::two_peer);
  try {
    parse_kind("star");
    FAIL() << "parse_kind accepted an unknown name";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.hint()).find("1peer"), std::string::npos) << "hint should list valid names";
  }
}

TEST(Topology, BadInputsThrow) {
  EXPECT_THROW(Topology(Kind::one_peer, 1, 0), ConfigError);
  EXPECT_THROW(Topology(Kind::two_peer, 1, 0), ConfigError);
  EXPECT_THROW(Topology(Kind::ring, 1, 0), ConfigError);
  EXPECT_THROW(Topology(Kind::exp, 6, 0), ConfigError);
  EXPECT_THROW(Topology(Kind::exp, 12, 0), ConfigError);
  EXPECT_THROW(Topology(Kind::complete, 0, 0), ConfigError);
  EXPECT_THROW(Topology(Kind::one_peer, -3, 0), ConfigError);
  EXPECT_THROW(parse_kind("ring "), ConfigError);
  Topology t(Kind::two_peer, 5, 0);
  EXPECT_THROW(t.peers(5, 0), ConfigError);
  EXPECT_THROW(t.peers(-1, 0), ConfigError);
  EXPECT_THROW(t.mixing_row(0, -1), ConfigError);
  EXPECT_THROW(spectral_gap(t, 0), ConfigError);
}

TEST(Topology, TwoPeerWithTwoWorkersFallsBackToOnePeer) {
  Topology t(Kind::two_peer, 2, 7);
  EXPECT_TRUE(t.fell_back());
  EXPECT_EQ(t.kind(), Kind::one_peer);
  EXPECT_EQ(t.requested_kind(), Kind::two_peer);
  for (int64_t r = 0; r < 5; ++r) {
    EXPECT_EQ(t.peers(0, r), std::vector<int>{1});
    EXPECT_EQ(t.mixing_matrix(r), (std::vector<double>{0.5, 0.5, 0.5, 0.5}));
  }
  EXPECT_FALSE(Topology(Kind::two_peer, 3, 7).fell_back());
  EXPECT_EQ(Topology(Kind::two_peer, 3, 7).kind(), Kind::two_peer);
}

TEST(Topology, RingOfTwoIsThePairWithHalfWeights) {
  Topology t(Kind::ring, 2, 0);
  EXPECT_FALSE(t.fell_back());
  EXPECT_EQ(t.peers(1, 3), std::vector<int>{0});
  EXPECT_EQ(t.mixing_matrix(0), (std::vector<double>{0.5, 0.5, 0.5, 0.5}));
}

TEST(Topology, EveryWorkerComputesTheSameGraph) {
  // n workers each build their own Topology from the shared (kind, n, seed), as real ranks do.
  for (Kind k : {Kind::one_peer, Kind::two_peer, Kind::ring, Kind::exp, Kind::complete}) {
    const int n = 16;
    std::vector<Topology> workers;
    for (int r = 0; r < n; ++r) workers.emplace_back(k, n, 2024);
    for (int64_t round = 0; round < 100; ++round) {
      const auto pi = workers[0].permutation(round);
      const auto w = workers[0].mixing_matrix(round);
      for (int r = 0; r < n; ++r) {
        EXPECT_EQ(workers[r].permutation(round), pi);
        const auto row = workers[r].mixing_row(r, round);
        // Each worker's own view of its row matches the shared matrix, and its peers are
        // exactly the nonzero off-diagonal entries; and j's row agrees that i is its peer.
        std::vector<int> from_row;
        for (auto [j, v] : row) {
          EXPECT_EQ(v, w[r * n + j]);
          if (j != r) from_row.push_back(j);
        }
        EXPECT_EQ(workers[r].peers(r, round), from_row);
        for (int j : from_row) {
          const auto pj = workers[j].peers(j, round);
          EXPECT_TRUE(std::count(pj.begin(), pj.end(), r) == 1) << to_string(k) << " round " << round;
        }
        int nonzero = 0;
        for (int j = 0; j < n; ++j) nonzero += w[r * n + j] != 0.0;
        EXPECT_EQ(nonzero, static_cast<int>(row.size()));
      }
    }
  }
}

TEST(Topology, MixingMatricesAreSymmetricDoublyStochastic) {
  for (Kind k : kAll) {
    for (int n = 0; n <= 33; ++n) {
      if (!valid(k, n)) {
        EXPECT_THROW(Topology(k, n, 1), ConfigError) << to_string(k) << " n=" << n;
        continue;
      }
      Topology t(k, n, 1);
      for (int64_t round : {0, 1, 2, 3, 7, 1000, 123456789}) {
        const auto w = t.mixing_matrix(round);
        ASSERT_EQ(w.size(), static_cast<size_t>(n * n));
        for (int i = 0; i < n; ++i) {
          double rs = 0, cs = 0;
          for (int j = 0; j < n; ++j) {
            EXPECT_GE(w[i * n + j], 0.0);
            EXPECT_EQ(w[i * n + j], w[j * n + i]) << to_string(k) << " n=" << n << " round " << round;
            rs += w[i * n + j];
            cs += w[j * n + i];
          }
          EXPECT_NEAR(rs, 1.0, 1e-12) << to_string(k) << " n=" << n;
          EXPECT_NEAR(cs, 1.0, 1e-12) << to_string(k) << " n=" << n;
          EXPECT_GT(w[i * n + i], 0.0);
          // Rows come ordered by column, self included: that is the summation order callers use.
          const auto row = t.mixing_row(i, round);
          for (size_t a = 1; a < row.size(); ++a) EXPECT_LT(row[a - 1].first, row[a].first);
        }
      }
    }
  }
}

TEST(Topology, DefinitionsMatchDesign) {
  // 1peer: pairs (pi(2k), pi(2k+1)); 2peer: ring along pi; exp: XOR 2^(t mod log2 n).
  Topology one(Kind::one_peer, 10, 5), two(Kind::two_peer, 10, 5), ex(Kind::exp, 16, 5), ring(Kind::ring, 10, 5);
  for (int64_t round = 0; round < 20; ++round) {
    const auto pi = one.permutation(round);
    for (int k = 0; k < 5; ++k) EXPECT_EQ(one.peers(pi[2 * k], round), std::vector<int>{pi[2 * k + 1]});
    const auto p2 = two.permutation(round);
    for (int p = 0; p < 10; ++p) {
      std::vector<int> expect{p2[(p + 9) % 10], p2[(p + 1) % 10]};
      std::sort(expect.begin(), expect.end());
      EXPECT_EQ(two.peers(p2[p], round), expect);
      EXPECT_EQ(two.mixing_row(p2[p], round).front().second, 1.0 / 3.0);
    }
    for (int i = 0; i < 16; ++i) EXPECT_EQ(ex.peers(i, round), std::vector<int>{i ^ (1 << (round % 4))});
    EXPECT_EQ(ring.peers(0, round), (std::vector<int>{1, 9}));
  }
  EXPECT_TRUE(Topology(Kind::exp, 1, 0).peers(0, 3).empty());
  EXPECT_EQ(Topology(Kind::exp, 1, 0).mixing_matrix(3), std::vector<double>{1.0});
  const auto c = Topology(Kind::complete, 5, 0);
  EXPECT_TRUE(c.is_all_reduce());
  EXPECT_EQ(c.peers(2, 0), (std::vector<int>{0, 1, 3, 4}));
  for (double v : c.mixing_matrix(4)) EXPECT_DOUBLE_EQ(v, 0.2);
}

TEST(Topology, ExpAveragesExactlyOverOnePeriod) {
  // The product of log2 n consecutive exp rounds is 11^T/n: exact consensus.
  const int n = 16;
  Topology t(Kind::exp, n, 0);
  EXPECT_EQ(t.period(), 4);
  std::vector<double> prod(n * n, 0.0);
  for (int i = 0; i < n; ++i) prod[i * n + i] = 1.0;
  for (int64_t round = 0; round < 4; ++round) {
    const auto w = t.mixing_matrix(round);
    std::vector<double> next(n * n, 0.0);
    for (int i = 0; i < n; ++i)
      for (int k = 0; k < n; ++k)
        for (int j = 0; j < n; ++j) next[i * n + j] += w[i * n + k] * prod[k * n + j];
    prod = next;
  }
  for (double v : prod) EXPECT_NEAR(v, 1.0 / n, 1e-15);
}

TEST(Topology, OnePeerOddLeavesExactlyOneAlone) {
  for (int n : {3, 5, 9, 33}) {
    Topology t(Kind::one_peer, n, 11);
    for (int64_t round = 0; round < 50; ++round) {
      int alone = 0, paired = 0, alone_rank = -1;
      for (int i = 0; i < n; ++i) {
        const auto p = t.peers(i, round);
        if (p.empty()) {
          ++alone;
          alone_rank = i;
          EXPECT_EQ(t.mixing_row(i, round), (Row{{i, 1.0}}));
        } else {
          EXPECT_EQ(p.size(), 1u);
          ++paired;
        }
      }
      EXPECT_EQ(alone, 1);
      EXPECT_EQ(paired, n - 1);
      EXPECT_EQ(alone_rank, t.permutation(round)[n - 1]);
    }
  }
  // Even n: nobody sits out.
  Topology even(Kind::one_peer, 8, 11);
  for (int64_t round = 0; round < 20; ++round)
    for (int i = 0; i < 8; ++i) EXPECT_EQ(even.peers(i, round).size(), 1u);
}

TEST(Topology, TwoPeerHasDegreeTwo) {
  for (int n = 3; n <= 33; ++n) {
    Topology t(Kind::two_peer, n, 3);
    EXPECT_EQ(max_degree(t), 2);
    for (int64_t round = 0; round < 10; ++round)
      for (int i = 0; i < n; ++i) EXPECT_EQ(t.peers(i, round).size(), 2u) << "n=" << n;
  }
}

TEST(Topology, PermutationsVaryWithRoundAndSeed) {
  const int n = 32;
  Topology a(Kind::one_peer, n, 1), b(Kind::one_peer, n, 2);
  std::set<std::vector<int>> seen;
  for (int64_t round = 0; round < 200; ++round) {
    auto pa = a.permutation(round);
    EXPECT_NE(pa, b.permutation(round)) << "round " << round;
    seen.insert(pa);
    std::sort(pa.begin(), pa.end());
    for (int i = 0; i < n; ++i) ASSERT_EQ(pa[i], i);  // a permutation of 0..n-1
  }
  EXPECT_EQ(seen.size(), 200u);
  // Rough uniformity: each worker lands at position 0 about 1/n of the time.
  std::vector<int> first(8, 0);
  Topology c(Kind::two_peer, 8, 9);
  for (int64_t round = 0; round < 8000; ++round) ++first[c.permutation(round)[0]];
  for (int f : first) EXPECT_NEAR(f, 1000, 150);
}

TEST(Spectral, FixedRingMatchesClosedForm) {
  for (int n = 3; n <= 20; ++n) {
    const double l = (1.0 + 2.0 * std::cos(2.0 * std::numbers::pi / n)) / 3.0;
    Topology t(Kind::ring, n, 0);
    EXPECT_NEAR(spectral_gap(t, 1), 1.0 - l * l, 1e-9) << "n=" << n;
    EXPECT_NEAR(spectral_gap_closed_form(t), 1.0 - l * l, 1e-12) << "n=" << n;
  }
  EXPECT_NEAR(spectral_gap(Topology(Kind::ring, 2, 0), 1), 1.0, 1e-9);
}

TEST(Spectral, CompleteGivesOne) {
  for (int n : {1, 2, 5, 16, 33}) EXPECT_NEAR(spectral_gap(Topology(Kind::complete, n, 0), 10), 1.0, 1e-9);
}

TEST(Spectral, ExpIsOneOverLogN) {
  // E[W^T W] = mean_k (I + X_k)/2; on the character s of (Z_2)^L its eigenvalue is 1 - |s|/L.
  for (int L = 1; L <= 6; ++L) {
    Topology t(Kind::exp, 1 << L, 0);
    EXPECT_NEAR(spectral_gap(t, 1), 1.0 / L, 1e-9) << "n=" << (1 << L);
  }
  EXPECT_NEAR(spectral_gap(Topology(Kind::exp, 1, 0), 1), 1.0, 1e-12);
}

TEST(Spectral, OnePeerEstimateNearExpectation) {
  // Random matching: W^T W = W (each pair block is an averaging projection), and
  // E[W] = I/2 + (11^T - I)/(2(n-1)) for even n, so lambda_2 = 1/2 - 1/(2(n-1)).
  for (int n : {8, 32}) {
    const double expect = 0.5 + 0.5 / (n - 1);
    Topology t(Kind::one_peer, n, 42);
    const double gap = spectral_gap(t, 20000);
    EXPECT_NEAR(gap, expect, 0.03 * expect) << "n=" << n;
    EXPECT_NEAR(spectral_gap_closed_form(t), expect, 1e-12);
  }
  // Odd n: a worker sits out with probability 1/n; E[W] = (n+1)/(2n) I + (11^T - I)/(2n).
  Topology odd(Kind::one_peer, 9, 42);
  EXPECT_NEAR(spectral_gap(odd, 20000), 0.5, 0.03 * 0.5);
}

TEST(Spectral, TwoPeerEstimateNearExpectation) {
  for (int n : {4, 8, 16}) {
    const double expect = 2.0 / 3.0 + 2.0 / (3.0 * (n - 1));
    EXPECT_NEAR(spectral_gap(Topology(Kind::two_peer, n, 5), 20000), expect, 0.03 * expect) << "n=" << n;
  }
  // n = 3: the only ring on 3 nodes is the triangle, W = 11^T/3.
  EXPECT_NEAR(spectral_gap(Topology(Kind::two_peer, 3, 5), 50), 1.0, 1e-9);
}

TEST(Cost, BytesPerWorkerPerRound) {
  const int64_t p = 1000;
  EXPECT_DOUBLE_EQ(bytes_per_worker_per_round(Topology(Kind::complete, 4, 0), p), 1500.0);
  EXPECT_DOUBLE_EQ(bytes_per_worker_per_round(Topology(Kind::complete, 1, 0), p), 0.0);
  EXPECT_DOUBLE_EQ(bytes_per_worker_per_round(Topology(Kind::one_peer, 7, 0), p), 1000.0);
  EXPECT_DOUBLE_EQ(bytes_per_worker_per_round(Topology(Kind::two_peer, 7, 0), p), 2000.0);
  EXPECT_DOUBLE_EQ(bytes_per_worker_per_round(Topology(Kind::ring, 2, 0), p), 1000.0);
  EXPECT_DOUBLE_EQ(bytes_per_worker_per_round(Topology(Kind::exp, 8, 0), p), 1000.0);
  EXPECT_EQ(max_degree(Topology(Kind::complete, 6, 0)), 5);
  EXPECT_EQ(max_degree(Topology(Kind::exp, 1, 0)), 0);
  // A model preset's bf16 message, as `gasloc topo` computes it.
  const auto params = model::LlamaConfig::preset("nano").num_params();
  EXPECT_DOUBLE_EQ(bytes_per_worker_per_round(Topology(Kind::two_peer, 8, 0), params * 2), 4.0 * params);
}

TEST(Spectral, GossipAveragingDecaysAsTheGapPredicts) {
  using namespace gasloc::topology;
  // Complete: exact consensus after one round.
  EXPECT_LT(simulate_consensus(Topology(Kind::complete, 16, 1), 1, 64, 3)[1], 1e-20);
  // 1peer and 2peer: E[W^T W] is a multiple of the identity on 1's complement, so each round
  // shrinks the distance by (1 - gap) in expectation; with 64 workers x 4096 entries one round is
  // within 5% of it, and ten rounds within 30% of (1 - gap)^10.
  for (auto kind : {Kind::one_peer, Kind::two_peer}) {
    const Topology t(kind, 64, 7);
    const double rate = 1 - spectral_gap_closed_form(t);
    const auto d = simulate_consensus(t, 10, 4096, 11);
    ASSERT_EQ(d.size(), 11u);
    EXPECT_DOUBLE_EQ(d[0], 1.0);
    EXPECT_NEAR(d[1] / rate, 1.0, 0.05) << to_string(kind);
    EXPECT_NEAR(d[10] / std::pow(rate, 10), 1.0, 0.3) << to_string(kind);
  }
  // A fixed graph: the gap bounds every round's contraction (here far from tight: random vectors
  // are mostly fast modes).
  const Topology ring(Kind::ring, 64, 1);
  const double rate = 1 - spectral_gap_closed_form(ring);
  const auto d = simulate_consensus(ring, 20, 256, 5);
  for (size_t r = 1; r < d.size(); ++r) EXPECT_LE(d[r], d[r - 1] * rate * (1 + 1e-12)) << "round " << r;
}

TEST(Spectral, OuterMomentumOnDisagreementFollowsTheHandComputedRecursion) {
  using namespace gasloc::topology;
  // The complete graph sends every disagreement mode to 0 (lambda = 0), so with GASLoC's outer
  // step (lr 0.7, momentum 0.9) each mode's amplitude e follows, from e = 1 and b = 0:
  //   Delta = e; b = 0.9 b + Delta; e -= 0.7 (Delta + 0.9 b)
  //   e1 = 1 - 0.7 * 1.9 = -0.33; b1 = 1
  //   b2 = 0.9 - 0.33 = 0.57; e2 = -0.33 - 0.7 * (-0.33 + 0.513) = -0.4581
  //   b3 = 0.513 - 0.4581 = 0.0549; e3 = -0.4581 - 0.7 * (-0.4581 + 0.04941) = -0.172017
  // and the consensus distance ratio is e^2: it rises in round 2, as GASLoC's curves do.
  const auto d = simulate_consensus(Topology(Kind::complete, 16, 1), 3, 64, 3, OuterStep{0.7, 0.9});
  ASSERT_EQ(d.size(), 4u);
  EXPECT_NEAR(d[1], 0.33 * 0.33, 1e-12);
  EXPECT_NEAR(d[2], 0.4581 * 0.4581, 1e-12);
  EXPECT_NEAR(d[3], 0.172017 * 0.172017, 1e-12);
  // Plain averaging is the {1, 0} step.
  EXPECT_EQ(simulate_consensus(Topology(Kind::two_peer, 16, 1), 4, 64, 3),
            simulate_consensus(Topology(Kind::two_peer, 16, 1), 4, 64, 3, OuterStep{1.0, 0.0}));
  EXPECT_THROW(simulate_consensus(Topology(Kind::two_peer, 16, 1), 4, 64, 3, OuterStep{0.7, 1.0}), ConfigError);
}

// ---------------------------------------------------------------------------------------------
// The GASLoC forms under pure consensus (`gasloc topo --consensus --form`, docs/topology.md).

TEST(Forms, ParseAndPrintNames) {
  using namespace gasloc::topology;
  for (auto f : {Form::anchor, Form::mix_after, Form::accelerated}) EXPECT_EQ(parse_form(to_string(f)), f);
  try {
    parse_form("sideways");
    ADD_FAILURE() << "unknown form accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(e.hint().find("mix_after"), std::string::npos) << e.hint();
  }
}

TEST(Forms, AcceleratedOnTheCompleteGraphFollowsTheHandComputedRecursion) {
  using namespace gasloc::topology;
  // Every disagreement mode has lambda = 0, so with alpha 0.5, gamma 0.9 its amplitude follows
  // e' = (1 - alpha) e + gamma (e - e_prev), e_prev starting at e0 = 1:
  //   e1 = 0.5; e2 = 0.25 + 0.9 (0.5 - 1) = -0.2; e3 = -0.1 + 0.9 (-0.2 - 0.5) = -0.73.
  const auto d = simulate_consensus(Topology(Kind::complete, 8, 1), 3, 32, 3, OuterStep{1.0, 0.9, Form::accelerated, 0.5});
  ASSERT_EQ(d.size(), 4u);
  EXPECT_NEAR(d[1], 0.25, 1e-12);
  EXPECT_NEAR(d[2], 0.04, 1e-12);
  EXPECT_NEAR(d[3], 0.73 * 0.73, 1e-12);
  // alpha = 1, gamma = 0 mixes exactly as W: plain gossip up to one rounding per round.
  const Topology t(Kind::two_peer, 16, 1);
  const auto plain = simulate_consensus(t, 5, 64, 3);
  const auto acc = simulate_consensus(t, 5, 64, 3, OuterStep{1.0, 0.0, Form::accelerated, 1.0});
  for (size_t r = 0; r < plain.size(); ++r) EXPECT_NEAR(acc[r], plain[r], 1e-12 + 1e-9 * plain[r]) << "round " << r;
  // mix_after without training takes its outer step on a zero pseudo-gradient: plain gossip, bit for bit.
  EXPECT_EQ(simulate_consensus(t, 5, 64, 3, OuterStep{0.7, 0.9, Form::mix_after}), plain);
}

TEST(Forms, PerRoundContractionAgainstPlainGossipAndTheGap) {
  using namespace gasloc::topology;
  // 1peer, n = 32, 2000 rounds, 64 entries per worker. Plain gossip's mean per-round ratio is
  // 1 - gap in expectation (measured 0.488 against 0.484); its geometric mean, the long-run
  // rate, is lower (Jensen: the ratios vary from round to round). DiLoCo's outer step (0.7, 0.9)
  // contracts at nearly twice plain gossip's rate, and the accelerated form at alpha 1, gamma 0.9
  // diverges.
  const Topology t(Kind::one_peer, 32, 1337);
  const double gap_rate = 1 - spectral_gap_closed_form(t);
  const auto plain = consensus_contraction(t, 2000, 64, 1);
  EXPECT_NEAR(plain.mean / gap_rate, 1.0, 0.03);
  EXPECT_LT(plain.geometric, plain.mean);
  EXPECT_EQ(plain.restarts, 0);
  const auto anchor = consensus_contraction(t, 2000, 64, 1, OuterStep{0.7, 0.9});
  EXPECT_GT(anchor.geometric, 1.7 * plain.geometric);
  EXPECT_LT(anchor.geometric, 1.0);
  EXPECT_GT(consensus_contraction(t, 2000, 64, 1, OuterStep{1.0, 0.9, Form::accelerated, 1.0}).geometric, 1.0);
  // Thousands of rounds neither underflow nor overflow: the state is rescaled every round.
  EXPECT_TRUE(std::isfinite(consensus_contraction(t, 5000, 8, 1, OuterStep{1.0, 0.9, Form::accelerated, 1.0}).mean));
  // 1peer on 8 workers reaches exact consensus now and then (three matchings can form a cube):
  // such a round counts as 0 and the run goes on from fresh vectors, near 1 - gap still.
  const Topology t8(Kind::one_peer, 8, 1337);
  const auto p8 = consensus_contraction(t8, 2000, 64, 1);
  EXPECT_GT(p8.restarts, 0);
  EXPECT_NEAR(p8.mean / (1 - spectral_gap_closed_form(t8)), 1.0, 0.05);
  const auto complete = consensus_contraction(Topology(Kind::complete, 8, 1), 10, 8, 1);
  EXPECT_EQ(complete.mean, 0.0);  // exact consensus every round
  EXPECT_EQ(complete.restarts, 9);
  EXPECT_THROW(consensus_contraction(t, 10, 8, 1, OuterStep{1.0, 0.9, Form::accelerated, 1.5}), ConfigError);
}

TEST(Forms, OptimizeFindsLittleMomentumBestOnRandomGraphs) {
  using namespace gasloc::topology;
  // The spectral gap of 1peer is O(1), so momentum cannot accelerate it: the best grid point
  // has momentum <= 0.3 in both forms (DiLoCo uses 0.9) and matches plain gossip within 3%.
  const Topology t(Kind::one_peer, 32, 1337);
  const double plain = consensus_contraction(t, 400, 16, 1).geometric;
  for (auto f : {Form::anchor, Form::accelerated}) {
    const auto best = optimize_consensus(t, f, 400, 16, 1);
    EXPECT_EQ(best.points, 200) << to_string(f);
    EXPECT_LE(best.best.momentum, 0.3 + 1e-12) << to_string(f);
    EXPECT_NEAR(best.rate.geometric / plain, 1.0, 0.03) << to_string(f);
    EXPECT_EQ(best.best.form, f);
    // It is the minimum of what it scanned: the default outer step is no better.
    EXPECT_LE(best.rate.geometric, consensus_contraction(t, 400, 16, 1, OuterStep{0.7, 0.9, f, 0.7}).geometric);
  }
  // On the fixed ring with many workers (slow modes, lambda near 1) momentum does help.
  const Topology ring(Kind::ring, 32, 1);
  const auto best = optimize_consensus(ring, Form::anchor, 400, 16, 1);
  EXPECT_GT(best.best.momentum, 0.3);
  EXPECT_LT(best.rate.geometric, consensus_contraction(ring, 400, 16, 1).geometric);
}
