// Compressed rounds (algo/compression.hpp, docs/design.md section 12): the pair schedules, the
// modulo codec against hand-computed values, the compressed all-reduce against a reference
// written here from the codec's functions, and training runs against their uncompressed twins.
// Tolerances are stated per test.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <map>
#include <set>

#include "gasloc/algo/algo_config.hpp"
#include "gasloc/algo/compressed_consensus.hpp"
#include "gasloc/algo/compression.hpp"
#include "gasloc/algo/mix/make_mix.hpp"
#include "gasloc/algo/mix/owners_all_reduce.hpp"
#include "gasloc/algo/mix/pair_exchange.hpp"
#include "gasloc/algo/consensus.hpp"
#include "gasloc/algo/modulo_codec.hpp"
#include "gasloc/algo/round_sync.hpp"
#include "gasloc/comm/codec.hpp"
#include "gasloc/comm/inproc.hpp"
#include "gasloc/core/config.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/data/dataset.hpp"
#include "gasloc/train/checkpoint.hpp"
#include "gasloc/train/trainer.hpp"
#include "gasloc/train/worker.hpp"
#include "test_util.hpp"

using namespace gasloc;

namespace {

std::span<const float> span_of(const torch::Tensor& t) { return {t.data_ptr<float>(), static_cast<size_t>(t.numel())}; }

TEST(PairSchedules, RoundRobinMeetsEveryPairOnce) {
  for (int n = 2; n <= 9; ++n) {
    SCOPED_TRACE("n " + std::to_string(n));
    const auto rounds = algo::round_robin(n);
    EXPECT_EQ(static_cast<int>(rounds.size()), n % 2 ? n : n - 1);
    std::set<std::pair<int, int>> met;
    for (const auto& partner : rounds) {
      ASSERT_EQ(static_cast<int>(partner.size()), n);
      int alone = 0;
      for (int k = 0; k < n; ++k) {
        const int p = partner[k];
        if (p < 0) {
          ++alone;
          continue;
        }
        ASSERT_NE(p, k);
        ASSERT_EQ(partner[p], k);
        if (k < p) EXPECT_TRUE(met.insert({k, p}).second) << k << " meets " << p << " twice";
      }
      EXPECT_EQ(alone, n % 2);
    }
    EXPECT_EQ(static_cast<int>(met.size()), n * (n - 1) / 2);
  }
}

TEST(PairSchedules, ColoursAreMatchingsCoveringEveryEdge) {
  // A 6-ring and a 5-ring (odd: three colours), in the ascending-edge greedy order.
  for (int n : {5, 6}) {
    std::vector<std::vector<int>> nb(n);
    for (int i = 0; i < n; ++i) nb[i] = {(i + 1) % n, (i + n - 1) % n};
    const auto colours = algo::pair_colours(nb);
    EXPECT_EQ(colours.size(), n % 2 ? 3u : 2u);
    std::set<std::pair<int, int>> edges;
    for (const auto& c : colours)
      for (int v = 0; v < n; ++v)
        if (c[v] >= 0) {
          ASSERT_EQ(c[c[v]], v);
          edges.insert({std::min(v, c[v]), std::max(v, c[v])});
        }
    EXPECT_EQ(static_cast<int>(edges.size()), n);
  }
}

// ---------------------------------------------------------------------------------------------
// The modulo codec by hand: int4 (L = 7, M = 15), one chunk of 4.

TEST(ModuloCodec, HandComputedDifferenceIsExactlyNegatedAtTheOtherEnd) {
  const algo::ModuloGrid g{7, 4};
  const std::vector<float> si = {0.0f, 0.25f, -0.5f, 1.0f}, sj = {0.1f, 0.2f, -0.4f, 0.9f};
  // Gaps unknown: theta = 5 max|s| = 5, step = 5 / 15 = 1/3.
  const double step = algo::modulo_step(g, 4.0, -1.0f, -1.0f, 1.0f, 0.9f);
  EXPECT_DOUBLE_EQ(step, 5.0 / 15.0);
  EXPECT_EQ(algo::modulo_step(g, 4.0, -1.0f, -1.0f, 0.9f, 1.0f), step);  // symmetric
  // n_i = round(s_i / step) = {0, 1, -2 (half to even), 3}, n_j = {0, 1, -1, 3}: d_ij = {0, 0, 1/3, 0}.
  const std::vector<double> steps = {step};
  std::vector<uint8_t> pi(algo::modulo_payload_bytes(g, 4)), pj(pi.size());
  EXPECT_EQ(pi.size(), 4u + 2u);  // checksum, then two codes a byte
  algo::modulo_encode(g, si, steps, pi);
  algo::modulo_encode(g, sj, steps, pj);
  // Residues of n_j mod 15 = {0, 1, 14, 3}, low nibble first.
  EXPECT_EQ(pj[4], 0x10);
  EXPECT_EQ(pj[5], 0x3e);
  std::vector<float> dij(4), dji(4);
  std::vector<uint8_t> wi(1), wj(1);
  algo::modulo_difference(g, si, steps, pj, dij, wi);
  algo::modulo_difference(g, sj, steps, pi, dji, wj);
  EXPECT_EQ(wi[0], 0);
  EXPECT_EQ(wj[0], 0);
  const std::vector<float> want = {0.0f, 0.0f, static_cast<float>(1.0 / 3.0), 0.0f};
  for (int e = 0; e < 4; ++e) {
    EXPECT_EQ(dij[e], want[e]) << e;
    EXPECT_EQ(dji[e], -dij[e]) << e;  // bit for bit
  }
}

TEST(ModuloCodec, AWrapIsSeenAtBothEndsAndItsChunkGivesNoDifference) {
  const algo::ModuloGrid g{7, 4};
  // Last gaps 0.01 with margin 4: theta = 0.04, so a difference of 0.1 wraps.
  const std::vector<float> si = {0.5f, 0.5f, 0.5f, 0.5f, 0.3f}, sj = {0.5f, 0.6f, 0.5f, 0.5f, 0.305f};
  const std::vector<double> steps = {algo::modulo_step(g, 4.0, 0.01f, 0.01f, 0.5f, 0.6f),
                                     algo::modulo_step(g, 4.0, 0.01f, 0.01f, 0.3f, 0.305f)};
  EXPECT_DOUBLE_EQ(steps[0], 4.0 * static_cast<double>(0.01f) / 15);
  std::vector<uint8_t> pi(algo::modulo_payload_bytes(g, 5)), pj(pi.size());
  algo::modulo_encode(g, si, steps, pi);
  algo::modulo_encode(g, sj, steps, pj);
  std::vector<float> dij(5), dji(5);
  std::vector<uint8_t> wi(2), wj(2);
  algo::modulo_difference(g, si, steps, pj, dij, wi);
  algo::modulo_difference(g, sj, steps, pi, dji, wj);
  EXPECT_EQ(wi, (std::vector<uint8_t>{1, 0}));
  EXPECT_EQ(wj, wi);
  for (int e = 0; e < 4; ++e) EXPECT_EQ(dij[e], 0.0f) << "a wrapped chunk contributes nothing";
  EXPECT_NEAR(dij[4], 0.005, steps[1]);  // the other chunk's gap is within its grid
  EXPECT_EQ(dji[4], -dij[4]);
}

TEST(ModuloCodec, GarbageAndNonFiniteAreRefused) {
  const algo::ModuloGrid g{127, 4};
  const std::vector<float> s = {1, 2, 3, 4};
  const std::vector<double> steps = {0.1};
  std::vector<float> d(4);
  std::vector<uint8_t> w(1);
  std::vector<uint8_t> bad(algo::modulo_payload_bytes(g, 4), 0xff);  // residue 255 > 254
  EXPECT_THROW(algo::modulo_difference(g, s, steps, bad, d, w), comm::BadPayload);
  std::vector<uint8_t> short_payload(3);
  EXPECT_THROW(algo::modulo_difference(g, s, steps, short_payload, d, w), comm::BadPayload);
  const std::vector<float> nan = {1, std::nanf(""), 3, 4};
  EXPECT_THROW(algo::chunk_max_abs(g, nan), comm::NonFiniteChunk);
}

// ---------------------------------------------------------------------------------------------
// The compressed all-reduce against the definition, computed here from the codec's functions.

// What every member must end with: r - Delta^, Delta^ by owners (int8, int4) or by all-gather (topk).
torch::Tensor reference_all_reduce(const comm::Codec& codec, const torch::Tensor& r, const std::vector<torch::Tensor>& xs) {
  const int n = static_cast<int>(xs.size());
  const int64_t P = r.numel(), C = static_cast<int64_t>(codec.chunk);
  const int64_t shard = ((P + C - 1) / C + n - 1) / n * C;
  std::vector<torch::Tensor> u;
  for (const auto& x : xs) {
    auto b = torch::zeros({n * shard});
    b.narrow(0, 0, P).copy_(r).sub_(x);
    u.push_back(b);
  }
  auto delta = torch::zeros({n * shard});
  if (codec.kind == comm::CodecKind::topk) {
    for (int i = 0; i < n; ++i) {
      const auto code = comm::encode(codec, span_of(u[i]));
      comm::decode_add(codec, code, 1.0f, {delta.data_ptr<float>(), static_cast<size_t>(delta.numel())});
    }
    delta.div_(static_cast<float>(n));
  } else {
    for (int k = 0; k < n; ++k) {
      auto mean = torch::zeros({shard});
      for (int i = 0; i < n; ++i) {
        const auto code = comm::encode(codec, span_of(u[i].narrow(0, k * shard, shard).contiguous()));
        comm::decode_add(codec, code, 1.0f, {mean.data_ptr<float>(), static_cast<size_t>(shard)});
      }
      mean.div_(static_cast<float>(n));
      const auto owned = comm::encode(codec, span_of(mean));
      comm::decode(codec, owned, {delta.data_ptr<float>() + k * shard, static_cast<size_t>(shard)});
    }
  }
  return r - delta.narrow(0, 0, P);
}

TEST(CompressedAllReduce, EveryMemberEndsWithTheOwnersDecodedMean) {
  // P = 1000 over chunks of 64 (16 chunks, the last of 40): shards of whole chunks, the last padded.
  for (const auto& codec : {comm::Codec::int8(64), comm::Codec::int4(64), comm::Codec::topk(1.0 / 8, 64)}) {
    for (int n : {2, 3, 4, 5}) {
      SCOPED_TRACE(codec.name() + ", n " + std::to_string(n));
      const int64_t P = 1000;
      torch::manual_seed(7);
      const auto r = torch::randn({P});
      std::vector<torch::Tensor> xs;
      for (int i = 0; i < n; ++i) xs.push_back(r + 0.01 * (i + 1) * torch::randn({P}));
      std::vector<torch::Tensor> got(n);
      std::vector<int> members(n);
      for (int i = 0; i < n; ++i) members[i] = i;
      comm::InProcCluster cluster(n);
      cluster.run([&](int rank, comm::Communicator& c) {
        algo::OwnersAllReduce comp(codec, false, 1.0f);
        got[rank] = comp.run(xs[rank], r, members, c);
      });
      const auto want = reference_all_reduce(codec, r, xs);
      for (int i = 0; i < n; ++i) EXPECT_TRUE(torch::equal(got[i], want)) << "rank " << i;
      // And it is the mean within the codec's error: two int8 roundings of up to max|x| / 254
      // per chunk (int4: / 14); topk drops all but 1/8 of each chunk, so only its bytes are pinned.
      if (codec.kind != comm::CodecKind::topk) {
        auto exact = torch::zeros({P});
        for (const auto& x : xs) exact += x;
        exact /= n;
        const double bound = 2 * 0.01 * n * 4 / (codec.kind == comm::CodecKind::int8 ? 254.0 : 14.0);
        EXPECT_LT((got[0] - exact).abs().max().item<double>(), bound);
      }
      const int64_t sent = cluster.comm(0).stats().bytes_sent;
      EXPECT_EQ(sent, algo::compressed_all_reduce_bytes(codec, P, n));
    }
  }
}

TEST(CompressedAllReduce, ANonFinitePseudoGradientNamesTheWorker) {
  comm::InProcCluster cluster(2);
  try {
    cluster.run([&](int rank, comm::Communicator& c) {
      auto x = torch::zeros({10});
      if (rank == 1) x[3] = std::numeric_limits<float>::infinity();
      algo::OwnersAllReduce comp(comm::Codec::int8(4), false, 1.0f);
      comp.run(x, torch::zeros({10}), {0, 1}, c);
    });
    ADD_FAILURE() << "expected an error";
  } catch (const CommError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("worker 1"), std::string::npos) << what;
    EXPECT_NE(what.find("non-finite"), std::string::npos) << what;
  }
}

// ---------------------------------------------------------------------------------------------
// Gossip: the lossless and fine-grid limits reduce to today's mix; the mean is kept.

// Values that differ per worker without the global generator, which the cluster's threads share.
torch::Tensor wave(int64_t n, int rank) {
  return torch::sin(torch::arange(n, torch::kFloat) * (0.37f * static_cast<float>(rank + 1)) + static_cast<float>(rank));
}

struct GossipRun {
  std::vector<torch::Tensor> m;
  int64_t resends = 0;
};

// `rounds` rounds from start values about 1 apart by 1%, each followed by a local drift.
GossipRun gossip_round(int n, const std::string& topo, const std::optional<algo::CompressionOptions>& o, int rounds = 1,
                       double drift = 1e-3) {
  GossipRun out;
  out.m.resize(n);
  comm::InProcCluster cluster(n);
  const topology::Topology t(topology::parse_kind(topo), n, 11);
  cluster.run([&](int rank, comm::Communicator& c) {
    const auto mixer = algo::make_mix({.topology = t, .compression = o});
    auto x = wave(777, rank) * 0.01 + 1.0;
    for (int k = 0; k < rounds; ++k) x = mixer->mix({.t = k, .x = x}, c) + drift * wave(777, 7 * k + rank);
    out.m[rank] = x;
    out.resends += mixer->stats().codec_resends.value_or(0);
  });
  return out;
}

TEST(CompressedGossip, DirectWithALosslessCodecIsTodayBitForBit) {
  algo::CompressionOptions o{comm::Codec::fp32(64)};
  o.gossip = algo::GossipCodec::direct;
  for (const std::string topo : {"1peer", "2peer"}) {
    const auto today = gossip_round(4, topo, std::nullopt, 3), lossless = gossip_round(4, topo, o, 3);
    for (int r = 0; r < 4; ++r) EXPECT_TRUE(torch::equal(today.m[r], lossless.m[r])) << topo << " rank " << r;
  }
}

TEST(CompressedGossip, ModuloKeepsTheMeanAndFollowsTheGap) {
  // int8 over 2peer rings (3 colours for n = 5), 6 rounds from values near 1 that differ by
  // about 1%. Modulo: the workers' mean is today's up to fp32 rounding (2e-6), and each worker is
  // within 5% of the consensus gap of today's values: its grid step is margin / 255 of the last
  // gap (1.6%), and successive rounds' errors add before gossip contracts them. Direct int8
  // rounds the whole value (steps of max|s| / 127, about 1/127 here): over 10x further off.
  algo::CompressionOptions o{comm::Codec::int8(64)};
  o.gossip = algo::GossipCodec::modulo;
  auto direct = o;
  direct.gossip = algo::GossipCodec::direct;
  for (int n : {4, 5}) {
    SCOPED_TRACE(n);
    const auto today = gossip_round(n, "2peer", std::nullopt, 6), mod = gossip_round(n, "2peer", o, 6),
               dir = gossip_round(n, "2peer", direct, 6);
    auto mean_t = torch::zeros({777}), mean_m = torch::zeros({777});
    for (int r = 0; r < n; ++r) mean_t += today.m[r] / n, mean_m += mod.m[r] / n;
    EXPECT_LT((mean_t - mean_m).abs().max().item<double>(), 2e-6);
    double gap = 0, err = 0, err_direct = 0;
    for (int r = 0; r < n; ++r) {
      gap = std::max(gap, (today.m[r] - mean_t).abs().max().item<double>());
      err = std::max(err, (today.m[r] - mod.m[r]).abs().max().item<double>());
      err_direct = std::max(err_direct, (today.m[r] - dir.m[r]).abs().max().item<double>());
    }
    EXPECT_LT(err, 0.05 * gap) << "gap " << gap << " resends " << mod.resends;
    EXPECT_GT(err_direct, 10 * err);
  }
}

TEST(CompressedGossip, DeltaWithALosslessCodecIsTodayWithinFp32) {
  // s^ = r + (s - r) rounds twice: within 2 ulps of values about 1 (5e-7) of today's mix.
  algo::CompressionOptions o{comm::Codec::fp32(64)};
  o.gossip = algo::GossipCodec::delta;
  for (const std::string topo : {"1peer", "2peer"}) {
    const auto today = gossip_round(4, topo, std::nullopt, 3), lossless = gossip_round(4, topo, o, 3);
    for (int r = 0; r < 4; ++r) EXPECT_LT((today.m[r] - lossless.m[r]).abs().max().item<double>(), 5e-7) << topo << " rank " << r;
  }
}

TEST(CompressedGossip, DeltaKeepsTheMeanAndFollowsItsReference) {
  // int4 delta over 2peer rings, 6 rounds. The pair terms are exact negations, so the mean is
  // today's up to fp32 rounding (2e-6). With the reference refreshed every round (K = 1) it sits
  // at the workers' mean and the codec's step follows the consensus gap; set once (K = 0) it stays
  // where the first round's int8 all-reduce put it, and int4's 15 levels span the drift since:
  // K = 1 must end at least 2x closer to today's values than K = 0.
  algo::CompressionOptions o{comm::Codec::int4(64)};
  o.gossip = algo::GossipCodec::delta;
  auto once = o;
  once.reference_every = 0;
  o.reference_every = 1;
  const auto today = gossip_round(5, "2peer", std::nullopt, 6, 0.01), every = gossip_round(5, "2peer", o, 6, 0.01),
             first = gossip_round(5, "2peer", once, 6, 0.01);
  auto mean_t = torch::zeros({777}), mean_e = torch::zeros({777});
  for (int r = 0; r < 5; ++r) mean_t += today.m[r] / 5, mean_e += every.m[r] / 5;
  EXPECT_LT((mean_t - mean_e).abs().max().item<double>(), 2e-6);
  double err_every = 0, err_first = 0;
  for (int r = 0; r < 5; ++r) {
    err_every = std::max(err_every, (today.m[r] - every.m[r]).abs().max().item<double>());
    err_first = std::max(err_first, (today.m[r] - first.m[r]).abs().max().item<double>());
  }
  EXPECT_LT(2 * err_every, err_first) << "K = 1: " << err_every << ", K = 0: " << err_first;
}

TEST(CompressedGossip, WrapsAreResentAndKeepTheMean) {
  // A drift 20 times the start's gap after the first round: the grids, sized by the last gaps,
  // wrap, and the pairs resend the wrapped chunks in fp32. The mean stays today's (2e-5 of values
  // about 1, after fp32 rounding of larger increments). Each worker stays within half the
  // consensus gap of today's: int4's step is 4 / 15 of the last gap, and rounds' errors add before
  // gossip contracts them (a chunk that sat a wrapped round out would be a whole gap off).
  algo::CompressionOptions o{comm::Codec::int4(64)};
  o.gossip = algo::GossipCodec::modulo;
  const auto today = gossip_round(5, "2peer", std::nullopt, 6, 0.2), mod = gossip_round(5, "2peer", o, 6, 0.2);
  EXPECT_GT(mod.resends, 0);
  auto mean_t = torch::zeros({777}), mean_m = torch::zeros({777});
  for (int r = 0; r < 5; ++r) mean_t += today.m[r] / 5, mean_m += mod.m[r] / 5;
  EXPECT_LT((mean_t - mean_m).abs().max().item<double>(), 2e-5);
  double gap = 0, err = 0;
  for (int r = 0; r < 5; ++r) {
    gap = std::max(gap, (today.m[r] - mean_t).abs().max().item<double>());
    err = std::max(err, (today.m[r] - mod.m[r]).abs().max().item<double>());
  }
  EXPECT_LT(err, 0.5 * gap) << "gap " << gap << " resends " << mod.resends;
}

TEST(CompressedGossip, AWrappedChunkIsResentExactly) {
  // Two workers: the first round goes in fp32 and measures gaps of at most 0.02 (values 1 +-
  // 0.01); then each drifts by 0.2 x its own wave, so every chunk of 64 differs by far more than
  // theta / 2 = 2 x 0.02 somewhere and wraps. All 13 chunks are resent at both ends (26), and the
  // mix is today's up to fp32 rounding of s_i + (s_j - s_i) / 2 against s_i / 2 + s_j / 2 (2 ulps).
  algo::CompressionOptions o{comm::Codec::int8(64)};
  o.gossip = algo::GossipCodec::modulo;
  const auto today = gossip_round(2, "1peer", std::nullopt, 2, 0.2), mod = gossip_round(2, "1peer", o, 2, 0.2);
  EXPECT_EQ(mod.resends, 26);
  for (int r = 0; r < 2; ++r) EXPECT_LT((today.m[r] - mod.m[r]).abs().max().item<double>(), 5e-7) << "rank " << r;
}

TEST(ModuloCodec, OnManyShapesPairIncrementsAreExactNegationsWithinOneStep) {
  // Random s_i, s_j = s_i + gap noise, with known and unknown gaps, on int8 and int4 grids:
  // d_ji = -d_ij bit for bit, both ends flag the same chunks, and an unwrapped d is s_j - s_i
  // within one step (each end's rounding to the grid is at most half a step), in doubles.
  torch::manual_seed(3);
  int wrapped_chunks = 0;
  for (int levels : {7, 127})
    for (size_t C : {4u, 64u, 256u})
      for (int64_t n : {1, 5, 300, 1000}) {
        SCOPED_TRACE(fmt::format("L {} C {} n {}", levels, C, n));
        const algo::ModuloGrid g{levels, C};
        const auto si = torch::randn({n}), sj = si + 0.01 * torch::randn({n});
        const size_t chunks = (n + C - 1) / C;
        const auto mi = algo::chunk_max_abs(g, span_of(si)), mj = algo::chunk_max_abs(g, span_of(sj));
        std::vector<double> steps(chunks);
        for (size_t c = 0; c < chunks; ++c) {
          const float gap_i = c % 3 == 0 ? -1.0f : 0.01f * static_cast<float>(c % 5), gap_j = 0.012f;
          steps[c] = algo::modulo_step(g, 4.0, gap_i, gap_j, mi[c], mj[c]);
          ASSERT_EQ(steps[c], algo::modulo_step(g, 4.0, gap_j, gap_i, mj[c], mi[c]));
        }
        std::vector<uint8_t> pi(algo::modulo_payload_bytes(g, n)), pj(pi.size()), wi(chunks), wj(chunks);
        algo::modulo_encode(g, span_of(si), steps, pi);
        algo::modulo_encode(g, span_of(sj), steps, pj);
        std::vector<float> dij(n), dji(n);
        algo::modulo_difference(g, span_of(si), steps, pj, dij, wi);
        algo::modulo_difference(g, span_of(sj), steps, pi, dji, wj);
        ASSERT_EQ(wi, wj);
        for (int64_t e = 0; e < n; ++e) {
          ASSERT_EQ(dji[e], -dij[e]) << e;
          const size_t c = e / C;
          if (wi[c]) continue;
          const double want = static_cast<double>(sj[e].item<float>()) - si[e].item<float>();
          ASSERT_LE(std::fabs(dij[e] - want), steps[c] * (1 + 1e-6) + 1e-7 * std::fabs(want)) << e;
        }
        for (auto w : wi) wrapped_chunks += w;
      }
  EXPECT_GT(wrapped_chunks, 0) << "the gaps of 0 (c % 5 == 0) must wrap somewhere: the check was never exercised";
}

// ---------------------------------------------------------------------------------------------
// Training with compression, against the uncompressed twin.

class Compressed : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = test_util::temp_root("test_compression");
    data_ = test_util::make_byte_dataset(root_);
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(root_); }

  struct Run {
    std::vector<std::vector<double>> losses;
    std::vector<torch::Tensor> params;
    std::vector<int64_t> bytes_sent;
    std::vector<int64_t> resends;  // modulo: chunks resent in fp32 after a wrap
  };
  static Run run(int n, const algo::AlgoConfig& a, int64_t steps) {
    const auto job = test_util::nano_job(data_);
    const auto ds = data::Dataset::open(job.data.dir);
    const auto mc = job.model.resolve(ds.vocab_size);
    comm::InProcCluster cluster(n, job.network.model(n));
    std::vector<std::unique_ptr<train::Worker>> workers;
    for (int r = 0; r < n; ++r)
      workers.push_back(std::make_unique<train::Worker>(job, mc, ds, cluster.comm(r), algo::make_synchronizer(a, n, job.train.seed)));
    Run out;
    out.losses.resize(n);
    cluster.run([&](int r, comm::Communicator&) {
      for (int64_t s = 0; s < steps; ++s) out.losses[r].push_back(workers[r]->step().loss);
    });
    for (int r = 0; r < n; ++r) {
      out.params.push_back(workers[r]->params().data().clone());
      out.bytes_sent.push_back(cluster.comm(r).stats().bytes_sent);
      out.resends.push_back(workers[r]->sync().codec_resends().value_or(0));
    }
    return out;
  }
  static algo::AlgoConfig cfg(const std::string& name, const std::string& topo, const std::string& compression,
                              const std::string& gossip_codec = "modulo") {
    algo::AlgoConfig a;
    a.name = name;
    a.H = 5;
    a.topology = topo;
    a.compression = compression;
    a.gossip_codec = gossip_codec;
    return a;
  }
  static inline std::filesystem::path root_, data_;
};

TEST_F(Compressed, EveryAlgorithmTrainsLikeItsUncompressedTwinOnFewerBytes) {
  // 4 workers, 20 steps (4 rounds of H = 5; 20 DAdam rounds). Each compressed run's last loss is
  // within 2% of its twin's (losses about 3.3 after 20 steps), and a round's bytes fall by at
  // least the stated factor: int8 about 4x, int4 about 8x (C = 256: 8 + 32/C and 4 + 32/C bits
  // against 32), modulo pays 3 floats a chunk besides its codes, and its first round goes in fp32
  // to measure the gaps. Modulo's resends of wrapped chunks (4 bytes a value) are accounted apart:
  // the bytes beyond its rounds' payloads are those of the resent chunks, to the byte but for
  // the shorter last chunk of the parameters.
  struct Case {
    algo::AlgoConfig a;
    double min_ratio;
  };
  const char* only = std::getenv("GASLOC_TEST_CASE");  // one case, by its trace, when debugging
  const std::vector<Case> cases = {
      {cfg("diloco", "complete", "int8"), 3.8},           {cfg("diloco", "complete", "int4"), 7.0},
      {cfg("gasloc", "complete", "int8"), 3.8},
      {cfg("gasloc", "1peer", "int8"), 3.6},              {cfg("gasloc", "2peer", "int4"), 6.8},
      {cfg("gasloc", "2peer", "int8", "direct"), 3.8},    {cfg("gasloc", "2peer", "int8", "delta"), 3.3},
      {cfg("gasloc", "1peer", "int4", "delta"), 4.2},
      {cfg("local_dadam", "1peer", "int8"), 3.6},
      {cfg("dadam", "1peer", "int8"), 3.6},
  };
  for (const auto& c : cases) {
    const std::string trace = c.a.name.str() + " " + c.a.topology.str() + " " + c.a.compression.str() + " " + c.a.gossip_codec.str();
    SCOPED_TRACE(trace);
    if (only && trace.find(only) == std::string::npos) continue;
    auto plain = c.a;
    plain.compression = "none";
    const auto want = run(4, plain, 20), got = run(4, c.a, 20);
    const double rounds = c.a.name == "dadam" ? 20 : 4;
    // modulo's first round is fp32 (it measures the gaps); delta's refreshes of its reference (an
    // int8 all-reduce on rounds 0 and 5 of 5) are in its bytes.
    const bool measures_gaps = c.a.topology != "complete" && c.a.gossip_codec == "modulo";
    const algo::CompressionOptions codec = *algo::compression_options(c.a);
    const int64_t P = got.params[0].numel(), C = 256, peers = c.a.topology == "1peer" ? 1 : 2;
    for (int r = 0; r < 4; ++r) {
      EXPECT_NEAR(got.losses[r].back(), want.losses[r].back(), 0.02 * want.losses[r].back()) << "rank " << r;
      const double plain_round = static_cast<double>(want.bytes_sent[r]) / rounds;
      double sent = static_cast<double>(got.bytes_sent[r]);
      if (measures_gaps) {
        const int64_t resent = got.bytes_sent[r] - static_cast<int64_t>(plain_round) -
                               static_cast<int64_t>(rounds - 1) * peers * algo::gossip_message_bytes(codec, P);
        const int64_t most = 4 * C * got.resends[r], tails = static_cast<int64_t>(rounds - 1) * peers;
        EXPECT_LE(resent, most) << "rank " << r;
        EXPECT_GE(resent, most - 4 * (C - P % C) * tails) << "rank " << r;
        sent -= static_cast<double>(resent) + plain_round;
      }
      const double round = sent / (measures_gaps ? rounds - 1 : rounds);
      EXPECT_GE(plain_round / round, c.min_ratio) << "rank " << r << " resends " << got.resends[r];
    }
    if (c.a.name == "diloco" || c.a.topology == "complete")
      for (int r = 1; r < 4; ++r) EXPECT_TRUE(torch::equal(got.params[0], got.params[r])) << "theta differs on rank " << r;
  }
}

TEST_F(Compressed, TopkCarriesAllAtDensityOneAndLearnsWithFeedbackAtOneSixteenth) {
  // topk at density 1 sends every value (int8 under a scale per chunk): it trains like its
  // uncompressed twin (2%). At density 1/16 a round's bytes fall at least 10x (an all-gather of
  // n - 1 payloads of about 1.3 bits a parameter, against a ring all-reduce's 2 (n - 1) / n x 32
  // bits), and a 20-step run pays for the coordinates it holds back: error feedback must recover
  // part of it (a lower loss than without), and the model must learn (0.5 nats below step 1's).
  auto dense = cfg("diloco", "complete", "topk");
  dense.topk_density = 1.0;
  auto plain = dense;
  plain.compression = "none";
  const auto want = run(4, plain, 20), all = run(4, dense, 20);
  auto sparse = dense;
  sparse.topk_density = 1.0 / 16;
  auto without = sparse;
  without.error_feedback = "off";
  const auto with_feedback = run(4, sparse, 20), no_feedback = run(4, without, 20);
  for (int r = 0; r < 4; ++r) {
    EXPECT_NEAR(all.losses[r].back(), want.losses[r].back(), 0.02 * want.losses[r].back()) << "rank " << r;
    EXPECT_GE(static_cast<double>(want.bytes_sent[r]) / with_feedback.bytes_sent[r], 10.0) << "rank " << r;
    EXPECT_LT(with_feedback.losses[r].back(), no_feedback.losses[r].back()) << "rank " << r;
    EXPECT_LT(with_feedback.losses[r].back(), with_feedback.losses[r].front() - 0.5) << "rank " << r;
  }
}

TEST_F(Compressed, FeedbackGridsAndReferencesResumeBitExactly) {
  // Stopped mid-round at step 12 and resumed: the same losses as the run that did not stop, bit
  // for bit, for each piece of codec state the checkpoint must carry.
  struct Setting {
    std::string name, saved;
    std::vector<std::string> keys;
  };
  const std::vector<Setting> settings = {
      {"diloco_int4", "sync.compression_owner_feedback", {"algo.name=diloco", "algo.compression=int4"}},
      {"gasloc_modulo", "sync.compression_gaps", {"algo.name=gasloc", "algo.compression=int4", "algo.gossip_codec=modulo"}},
      {"gasloc_delta", "sync.compression_reference",
       {"algo.name=gasloc", "algo.compression=int8", "algo.gossip_codec=delta", "algo.reference_every=2"}}};
  for (const auto& setting : settings) {
    SCOPED_TRACE(setting.name);
    auto request = [&](const std::string& run, std::vector<std::string> extra) {
      auto r = test_util::nano_request(root_, run, {"train.steps=30", "train.eval_every=15", "cluster.workers=2", "algo.H=5",
                                                    "algo.topology=1peer", "data.dir=" + data_.string()});
      r.overrides.insert(r.overrides.end(), setting.keys.begin(), setting.keys.end());
      r.overrides.insert(r.overrides.end(), extra.begin(), extra.end());
      return r;
    };
    const std::string dir = "resume_" + setting.name;
    const auto full = train::run_training(request(dir + "_full", {}));
    train::run_training(request(dir + "_halves", {"train.stop_at=12"}));
    train::TrainRequest again;
    again.quiet = true;
    again.resume_dir = (root_ / (dir + "_halves")).string();
    const auto second = train::run_training(again);
    ASSERT_EQ(second.train_losses.size(), 18u);
    for (size_t i = 0; i < 18; ++i) EXPECT_EQ(second.train_losses[i], full.train_losses[12 + i]) << "step " << 13 + i;
    EXPECT_EQ(second.final_val_loss, full.final_val_loss);
    const train::RunCheckpoints ck(root_ / (dir + "_full"), 2);
    const auto saved = train::load_checkpoint(ck.file(ck.committed(0).at(0), 0));
    EXPECT_EQ(saved.tensors.count(setting.saved), 1u);
  }
}

// The compressed consensus simulation (`gasloc topo --consensus --compression`) runs the
// training synchronizers with frozen parameters: uncompressed, it is the float64 simulation.
algo::AlgoConfig gossip_config(const std::string& topology, const std::string& compression, const std::string& codec) {
  algo::AlgoConfig a;
  a.name = "gasloc";
  a.topology = topology;
  a.outer_lr = 1.0;
  a.outer_momentum = 0.0;
  a.compression = compression;
  a.gossip_codec = codec;
  return a;
}

// Issue 62, item 4: a chunk beyond the model padded every int8 message to the chunk (400 MB for a
// 0.47 MB message), a chunk of 1 sent more than fp32, and 2^63 - 1 died in a c10 error; each is
// now a ConfigError naming the key and the model's size.
TEST(CompressionSettings, AChunkIsCheckedAgainstTheModel) {
  auto expect = [](const std::string& codec, int64_t chunk, int64_t params, const std::string& needle) {
    algo::AlgoConfig a;
    a.name = "diloco";
    a.topology = "complete";
    a.compression = codec;
    a.compression_chunk = chunk;
    try {
      algo::check_compression_for_model(a, params);
      ADD_FAILURE() << codec << " chunk " << chunk << ": expected a ConfigError mentioning " << needle;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("algo.compression_chunk"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect("int8", 100001, 100000, "100000 parameters");                    // beyond the model
  expect("int8", std::numeric_limits<int64_t>::max(), 100000, "100000 parameters");
  expect("topk", std::numeric_limits<int64_t>::max(), 100000, "100000 parameters");
  expect("int4", 0, 100, "the default, 256");                             // the default beyond a tiny model
  expect("int8", 1, 100000, "40.00 bits");                                // 8 + 32/1: more than fp32
  expect("int4", 1, 100000, "40.00 bits");                                // 4 + 32 bits: a nibble pads to a byte
  auto fits = [](const std::string& codec, int64_t chunk) {
    algo::AlgoConfig a;
    a.name = "diloco";
    a.topology = "complete";
    a.compression = codec;
    a.compression_chunk = chunk;
    algo::check_compression_for_model(a, 100000);
  };
  EXPECT_NO_THROW(fits("int8", 2));  // 24 bits
  EXPECT_NO_THROW(fits("int4", 100000));
  EXPECT_NO_THROW(fits("topk", 0));
  EXPECT_NO_THROW(fits("none", std::numeric_limits<int64_t>::max()));  // no codec, nothing chunked
}

// ... and the trainer checks it, once the model's size is known: before anything is allocated.
TEST_F(Compressed, TheTrainerRefusesAChunkBeyondTheModel) {
  train::TrainRequest r = test_util::nano_request(root_, "chunk_beyond",
                                                  {"cluster.workers=2", "algo.name=diloco", "algo.compression=int8",
                                                   "algo.compression_chunk=9223372036854775807", "train.steps=5", "algo.H=5"});
  r.overrides.at(1) = "data.dir=" + data_.string();
  try {
    train::run_training(r);
    ADD_FAILURE() << "expected a ConfigError naming algo.compression_chunk";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("algo.compression_chunk"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("parameters"), std::string::npos) << e.what();
  }
}

TEST(CompressedConsensus, UncompressedIsTheFloat64Simulation) {
  // fp32 against float64: 1e-4 relative, as Algo.GossipSyncWithFrozenParametersIsTheConsensusSimulation.
  const int n = 6;
  const int64_t dim = 16, rounds = 8;
  const uint64_t seed = 5;
  auto a = gossip_config("2peer", "none", "delta");
  a.outer_lr = 0.7;
  a.outer_momentum = 0.9;
  const auto got = algo::simulate_compressed_consensus(a, n, rounds, dim, seed, 0.0);
  const auto want = algo::simulate_consensus(topology::Topology(topology::Kind::two_peer, n, seed), rounds, dim, seed,
                                             algo::OuterStep{0.7, 0.9, algo::Form::anchor, 1.0});
  ASSERT_EQ(got.distance.size(), want.size());
  for (int64_t t = 1; t <= rounds; ++t) {
    EXPECT_NEAR(got.distance[t], want[t], 1e-4 * want[t] + 1e-7) << "round " << t;
    EXPECT_DOUBLE_EQ(got.bits[t], 64.0) << "2peer sends its fp32 parameters to two peers";
  }
  EXPECT_LT(want[rounds], 0.5);  // it mixed
}

TEST(CompressedConsensus, ModuloFollowsTheGapWhereDirectStallsAndBytesAreTheCodecs) {
  // 6 workers on 1peer (everyone paired every round; not a power of two, so that no sequence of
  // matchings averages exactly), x_i = c + e_i with |c| 10x the disagreement.
  const int n = 6;
  const int64_t dim = 1024, rounds = 12;
  const uint64_t seed = 3;
  const double common = 10.0;
  const auto fp32 = algo::simulate_compressed_consensus(gossip_config("1peer", "none", "delta"), n, rounds, dim, seed, common);
  const auto direct = algo::simulate_compressed_consensus(gossip_config("1peer", "int8", "direct"), n, rounds, dim, seed, common);
  const auto modulo = algo::simulate_compressed_consensus(gossip_config("1peer", "int8", "modulo"), n, rounds, dim, seed, common);
  const auto delta = algo::simulate_compressed_consensus(gossip_config("1peer", "int8", "delta"), n, rounds, dim, seed, common);
  for (int64_t t = 1; t <= rounds; ++t) {
    SCOPED_TRACE("round " + std::to_string(t));
    // Direct sends one int8 payload a round: 8 + 32/256 bits a parameter.
    EXPECT_DOUBLE_EQ(direct.bits[t], 8.0 * comm::payload_bytes(comm::Codec::int8(), dim) / dim);
    EXPECT_DOUBLE_EQ(fp32.bits[t], 32.0);
  }
  // Modulo: round 1 in fp32; then per chunk two floats of grid (gap, max |s|), the residues and
  // their checksum, and 256 fp32 values for each chunk resent after a wrap (the count is per end).
  EXPECT_DOUBLE_EQ(modulo.bits[1], 32.0);
  double later = 0;
  for (int64_t t = 2; t <= rounds; ++t) later += modulo.bits[t];
  const double chunks = dim / 256.0;
  const double per_round = 8.0 * (8.0 * chunks + algo::modulo_payload_bytes(algo::ModuloGrid{}, dim)) / dim;
  EXPECT_NEAR(later, (rounds - 1) * per_round + 8.0 * 4.0 * 256.0 * modulo.resends / n / dim, 1e-9);
  // Direct's grid is set by |c|: its rounding error stays while fp32 gossip keeps contracting.
  // Modulo's grid follows the pair's gap, so its distance tracks fp32's; delta's error is that of
  // x - r, the reference refreshed towards the mean every 5 rounds, between the two.
  const double f = fp32.distance[rounds];
  EXPECT_LT(f, 1e-2);
  EXPECT_GT(direct.distance[rounds], 10 * f) << "direct should stall at its rounding floor";
  EXPECT_LT(modulo.distance[rounds], 2 * f);
  EXPECT_LT(delta.distance[rounds], direct.distance[rounds]);
}

TEST(CompressedConsensus, NonsenseIsRefused) {
  EXPECT_THROW(algo::simulate_compressed_consensus(gossip_config("complete", "int8", "delta"), 4, 2, 8, 1, 1.0), ConfigError);
  EXPECT_THROW(algo::simulate_compressed_consensus(gossip_config("1peer", "int8", "delta"), 1, 2, 8, 1, 1.0), ConfigError);
  EXPECT_THROW(algo::simulate_compressed_consensus(gossip_config("1peer", "int8", "delta"), 251, 2, 8, 1, 1.0), ConfigError);
  EXPECT_THROW(algo::simulate_compressed_consensus(gossip_config("1peer", "topk", "delta"), 4, 2, 8, 1, 1.0), ConfigError);
  EXPECT_THROW(algo::simulate_compressed_consensus(gossip_config("1peer", "int8", "delta"), 4, 2, 8, 1, -1.0), ConfigError);
}

TEST(CompressionSettings, NonsenseIsRefusedNamingTheKey) {
  auto expect = [](algo::AlgoConfig a, const std::string& needle) {
    try {
      a.validate(4);
      ADD_FAILURE() << "expected ConfigError mentioning " << needle;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  auto a = [](const std::string& name, const std::string& topo, const std::string& c) {
    algo::AlgoConfig x;
    x.name = name;
    x.topology = topo;
    x.compression = c;
    return x;
  };
  expect(a("allreduce", "2peer", "int8"), "algo.compression");     // gradients stay fp32
  expect(a("gasloc", "2peer", "topk"), "algo.compression");        // no top-k in gossip
  expect(a("local_dadam", "complete", "int8"), "algo.compression"); // no anchor
  auto d = a("gasloc", "2peer", "int4");
  d.gossip_codec = "direct";
  expect(d, "algo.gossip_codec");
  auto w = a("diloco", "complete", "int8");
  w.wire_dtype = "bf16";
  expect(w, "algo.wire_dtype");
  auto ov = a("diloco", "complete", "int8");
  ov.overlap_steps = 2;
  EXPECT_NO_THROW(ov.validate(4));  // compressed rounds overlap (test_relayed_mix.cpp)
  auto m = a("gasloc", "2peer", "int8");
  m.modulo_margin = 1.5;
  expect(m, "algo.modulo_margin");
  auto dens = a("diloco", "complete", "topk");
  dens.topk_density = 0;
  expect(dens, "algo.topk_density");
  EXPECT_NO_THROW(a("dadam", "1peer", "int4").validate(4));
}

}  // namespace

// Issue 63: algo.clip_peers in compressed gossip. Worker 2's parameters are 1000 times the
// others': each codec's receivers clip what worker 2's decoded message adds (2peer: a receiver's
// two norms set its bar), so its neighbours move by a bounded amount and count the clip.
TEST(CompressedGossip, EveryCodecClipsAFarOffPeer) {
  const int n = 4;
  const topology::Topology topo(topology::Kind::two_peer, n, 11);
  for (const auto codec : {algo::GossipCodec::direct, algo::GossipCodec::delta, algo::GossipCodec::modulo}) {
    SCOPED_TRACE(static_cast<int>(codec));
    algo::CompressionOptions o{comm::Codec::int8(64)};
    o.gossip = codec;
    auto moved = [&](std::optional<double> clip, std::vector<std::vector<int64_t>>& clipped) {
      std::vector<double> by_rank(n);
      clipped.assign(n, {});
      comm::InProcCluster cluster(n);
      cluster.run([&](int rank, comm::Communicator& c) {
        const auto mixer = algo::make_mix({.topology = topo, .compression = o, .clip = clip});
        const auto x = (wave(777, rank) * 0.01 + 1.0) * (rank == 2 ? 1000.0 : 1.0);
        by_rank[rank] = (mixer->mix({.t = 0, .x = x}, c) - x).abs().max().item<double>();
        clipped[rank] = mixer->stats().clipped_from.value_or(std::vector<int64_t>{});
      });
      return by_rank;
    };
    std::vector<std::vector<int64_t>> clipped, unclipped;
    const auto bounded = moved(2.0, clipped), free = moved(std::nullopt, unclipped);
    for (int r : topo.peers(2, 0)) {
      EXPECT_EQ(clipped[r].at(2), 1) << "rank " << r;
      EXPECT_LT(bounded[r], free[r] / 100) << "rank " << r;
    }
    EXPECT_TRUE(unclipped[0].empty());  // without algo.clip_peers nothing is counted
  }
}
