// Compressed gossip with no training; see compressed_consensus.hpp.
#include "gasloc/algo/compressed_consensus.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <mutex>
#include <vector>

#include "gasloc/algo/consensus.hpp"
#include "gasloc/comm/inproc.hpp"
#include "gasloc/core/error.hpp"

namespace gasloc::algo {

namespace {
constexpr int kMaxThreads = 250;  // as cluster.workers: a thread per worker
}

CompressedConsensus simulate_compressed_consensus(AlgoConfig cfg, int n, int64_t rounds, int64_t dim, uint64_t seed,
                                                  double common_scale) {
  if (n < 2 || n > kMaxThreads)
    throw ConfigError(fmt::format("compressed consensus simulation: n = {} workers; it runs a thread per worker, for n in [2, {}]",
                                  n, kMaxThreads),
                      "the uncompressed simulation (without --compression) runs any n");
  if (rounds < 0 || dim < 1) throw ConfigError("compressed consensus simulation needs rounds >= 0 and dim >= 1");
  if (!(common_scale >= 0)) throw ConfigError(fmt::format("the shared component's scale must be >= 0, not {}", common_scale));
  cfg.H = 1;
  cfg.validate(n);
  if (algorithm(cfg.name).all_reduces(cfg.topology))
    throw ConfigError(fmt::format("compressed consensus simulation: algo.topology = {} is averaged by an all-reduce, which "
                                  "reaches consensus in one round", cfg.topology.str()),
                      "pick a gossip graph (1peer, 2peer, ring, exp)");

  // x_i = c + e_i, row-major, in fp32 as the workers hold it.
  const auto e = consensus_start(n, dim, seed);
  at::Generator gen = at::detail::createCPUGenerator(seed + 1);
  const auto c = (torch::randn({dim}, gen, torch::kFloat64) * common_scale).contiguous();
  std::vector<std::vector<double>> x(static_cast<size_t>(rounds + 1), std::vector<double>(static_cast<size_t>(n * dim)));
  std::vector<std::vector<int64_t>> sent(static_cast<size_t>(rounds + 1), std::vector<int64_t>(static_cast<size_t>(n), 0));
  std::vector<int64_t> resends(static_cast<size_t>(n), 0);

  comm::InProcCluster cluster(n);
  cluster.run([&](int r, comm::Communicator& comm) {
    auto mine = torch::empty({dim}, torch::kFloat);
    const double* cd = c.data_ptr<double>();
    float* m = mine.data_ptr<float>();
    for (int64_t k = 0; k < dim; ++k) m[k] = static_cast<float>(cd[k] + e[static_cast<size_t>(r * dim + k)]);
    FlatParams fp({{"x", mine}});
    auto sync = make_synchronizer(cfg, n, seed);
    sync->init(fp);
    const auto record = [&](int64_t t) {
      const float* v = fp.data().data_ptr<float>();
      for (int64_t k = 0; k < dim; ++k) x[static_cast<size_t>(t)][static_cast<size_t>(r * dim + k)] = v[k];
      sent[static_cast<size_t>(t)][static_cast<size_t>(r)] = comm.stats().bytes_sent;
    };
    record(0);
    for (int64_t t = 0; t < rounds; ++t) {
      if (!sync->after_step(1, fp, comm)) throw Error("compressed consensus simulation: H = 1 ended no round");
      record(t + 1);
    }
    resends[static_cast<size_t>(r)] = sync->codec_resends().value_or(0);
  });

  CompressedConsensus out;
  const double d0 = consensus_distance(x[0], n, dim);
  for (int64_t t = 0; t <= rounds; ++t) {
    out.distance.push_back(d0 > 0 ? consensus_distance(x[static_cast<size_t>(t)], n, dim) / d0 : 0.0);
    double bytes = 0;
    if (t > 0)
      for (int r = 0; r < n; ++r) bytes += static_cast<double>(sent[t][r] - sent[t - 1][r]);
    out.bits.push_back(8.0 * bytes / n / static_cast<double>(dim));
  }
  for (int64_t v : resends) out.resends += v;
  return out;
}

}  // namespace gasloc::algo
