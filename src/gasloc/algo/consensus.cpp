// The consensus simulation of the GASLoC forms; see consensus.hpp.
#include "gasloc/algo/consensus.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "gasloc/core/error.hpp"

namespace gasloc::algo {

using topology::Row;
using topology::Topology;

namespace {

void check_step(const OuterStep& o) {
  if (!(o.lr > 0) || !(o.momentum >= 0 && o.momentum < 1))
    throw ConfigError("the outer step needs lr > 0 and 0 <= momentum < 1");
  if (!(o.gossip_step >= 0 && o.gossip_step <= 1)) throw ConfigError("the gossip step alpha must be in [0, 1]");
}

// The entries of a contiguous float64 tensor, which the loops below walk.
double* entries(const torch::Tensor& t) {
  if (t.scalar_type() != torch::kFloat64 || !t.is_contiguous())
    throw Error("consensus simulation: the state must be contiguous float64");
  return t.data_ptr<double>();
}

// Mean over workers of ||x_i - xbar||^2, for n vectors of dim doubles (row-major).
double mean_distance(const double* x, int n, int64_t dim) {
  double d = 0.0;
  for (int64_t k = 0; k < dim; ++k) {
    double mean = 0.0;
    for (int i = 0; i < n; ++i) mean += x[i * dim + k];
    mean /= n;
    for (int i = 0; i < n; ++i) d += (x[i * dim + k] - mean) * (x[i * dim + k] - mean);
  }
  return d / n;
}

void center(double* v, int n, int64_t dim) {
  for (int64_t k = 0; k < dim; ++k) {
    double mean = 0.0;
    for (int i = 0; i < n; ++i) mean += v[i * dim + k];
    mean /= n;
    for (int i = 0; i < n; ++i) v[i * dim + k] -= mean;
  }
}

// n independent standard normal vectors of dim entries from `gen` (which continues), their
// mean removed: one float64 tensor of n * dim entries, row-major.
torch::Tensor draw_centered(at::Generator& gen, int n, int64_t dim) {
  torch::NoGradGuard no_grad;
  auto x = torch::randn({n, dim}, gen, torch::kFloat64).contiguous().reshape({-1});
  center(entries(x), n, dim);
  return x;
}

// Gossip of n vectors of `dim` doubles (row-major). The mix, the centering and the rescaling run
// in plain loops, a round's form in its few tensor operations on all n vectors at once: a grid of
// hundreds of settings times thousands of rounds must run in seconds. The consensus mean is
// projected out after every round: W is doubly stochastic, so the disagreement's dynamics do not
// depend on it, and rescaling (below) would otherwise blow it up.
class ConsensusSim {
 public:
  ConsensusSim(const Topology& topo, int64_t dim, uint64_t seed, OuterStep o)
      : n_(topo.size()), dim_(dim), o_(o), gen_(at::detail::createCPUGenerator(seed)) {
    draw();
  }

  // Independent standard normal vectors (the generator continues), the form's state at rest there.
  void draw() {
    x_ = draw_centered(gen_, n_, dim_);
    const bool plain = o_.form == Form::anchor && o_.lr == 1.0 && o_.momentum == 0.0;
    form_ = plain ? make_mix_only_form() : make_round_form(o_, x_);
  }

  double distance() const { return mean_distance(entries(x_), n_, dim_); }

  void step(const std::vector<Row>& rows) {
    torch::NoGradGuard no_grad;
    // phi = x: no training moves the parameters between rounds (for accelerated u = x; for
    // mix_after the outer step on a zero pseudo-gradient leaves x as it is, so the round is plain
    // gossip).
    const Sent sent = form_->send(x_);
    x_.copy_(form_->land(mix(rows, sent.x), sent));
    for (const auto& t : state()) center(entries(t), n_, dim_);
  }

  // Multiplies the whole state by s (the dynamics are linear in it).
  void scale(double s) {
    for (const auto& t : state()) {
      double* v = entries(t);
      for (int64_t k = 0; k < t.numel(); ++k) v[k] *= s;
    }
  }

 private:
  // m_i = sum_j W_t[i,j] s_j, j ascending.
  torch::Tensor mix(const std::vector<Row>& rows, const torch::Tensor& sent) const {
    auto m = torch::zeros_like(x_);
    const double* s = entries(sent);
    double* out = entries(m);
    for (int i = 0; i < n_; ++i) {
      double* mi = out + i * dim_;
      for (auto [j, w] : rows[i]) {
        const double* sj = s + j * dim_;
        for (int64_t k = 0; k < dim_; ++k) mi[k] += w * sj[k];
      }
    }
    return m;
  }

  // x and the form's own tensors (its anchor equals x after every round).
  std::vector<torch::Tensor> state() const {
    std::vector<torch::Tensor> all = {x_};
    for (const auto& [name, t] : form_->state()) all.push_back(t);
    return all;
  }

  int n_;
  int64_t dim_;
  OuterStep o_;
  at::Generator gen_;
  torch::Tensor x_;
  std::unique_ptr<RoundForm> form_;
};

std::vector<std::vector<Row>> rows_of(const Topology& topo, int64_t rounds) {
  std::vector<std::vector<Row>> rows;
  const int64_t distinct = topo.is_random() ? rounds : std::min<int64_t>(rounds, topo.period());
  rows.reserve(static_cast<size_t>(distinct));
  for (int64_t t = 0; t < distinct; ++t) rows.push_back(topo.mixing_rows(t));
  return rows;
}

// The per-round ratios d_{t+1}/d_t for t = 0..rounds-1. After exact consensus (d = 0, which a
// few random matchings of a power-of-two n can reach) the ratios are 0, or with `restart` the
// state is drawn afresh and the run goes on (*restarts counts it).
std::vector<double> ratios(const Topology& topo, const std::vector<std::vector<Row>>& rows, int64_t rounds,
                           int64_t dim, uint64_t seed, OuterStep o, bool restart = false, int64_t* restarts = nullptr) {
  if (rounds < 0 || dim < 1) throw ConfigError("consensus simulation needs rounds >= 0 and dim >= 1");
  check_step(o);
  c10::InferenceMode no_autograd;  // the forms' tensor operations on small vectors: dispatch is their cost
  ConsensusSim sim(topo, dim, seed, o);
  std::vector<double> out;
  out.reserve(static_cast<size_t>(rounds));
  double d = sim.distance();
  if (!(d > 0)) throw ConfigError("consensus simulation needs n >= 2 workers (one worker has nothing to agree on)");
  sim.scale(1.0 / std::sqrt(d));
  for (int64_t t = 0; t < rounds; ++t) {
    if (d == 0.0) {
      if (!restart) {
        out.push_back(0.0);
        continue;
      }
      sim.draw();
      sim.scale(1.0 / std::sqrt(sim.distance()));
      if (restarts) ++*restarts;
    }
    sim.step(rows[static_cast<size_t>(t % static_cast<int64_t>(rows.size()))]);
    d = sim.distance();
    // Exact consensus up to rounding (the state had distance 1): a form that mixes exactly as W
    // in exact arithmetic but rounds differently must not score a 1e-30 ratio where W scores 0.
    if (d < 1e-24) d = 0.0;
    out.push_back(d);  // the state had distance 1 before this round
    if (!std::isfinite(d)) {
      out.back() = std::numeric_limits<double>::infinity();
      d = 0.0;
    } else if (d > 0) {
      sim.scale(1.0 / std::sqrt(d));
    }
  }
  return out;
}

ConsensusRate rate_of(const std::vector<double>& r, int64_t restarts) {
  ConsensusRate c;
  c.restarts = restarts;
  double sum = 0.0, log_sum = 0.0;
  int64_t nonzero = 0;
  for (double v : r) {
    sum += v;
    if (v > 0.0) log_sum += std::log(v), ++nonzero;
  }
  c.mean = sum / static_cast<double>(r.size());
  c.geometric = nonzero > 0 ? std::exp(log_sum / static_cast<double>(nonzero)) : 0.0;
  return c;
}

}  // namespace

std::vector<double> consensus_start(int n, int64_t dim, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  const auto x = draw_centered(gen, n, dim);
  return std::vector<double>(x.data_ptr<double>(), x.data_ptr<double>() + x.numel());
}

double consensus_distance(const std::vector<double>& x, int n, int64_t dim) { return mean_distance(x.data(), n, dim); }

std::vector<double> simulate_consensus(const Topology& topo, int64_t rounds, int64_t dim, uint64_t seed, OuterStep outer) {
  std::vector<double> out = {1.0};
  if (rounds <= 0) return out;
  for (double r : ratios(topo, rows_of(topo, rounds), rounds, dim, seed, outer)) out.push_back(out.back() * r);
  return out;
}

ConsensusRate consensus_contraction(const Topology& topo, int64_t rounds, int64_t dim, uint64_t seed, OuterStep outer) {
  if (rounds < 1) throw ConfigError("the consensus contraction needs rounds >= 1");
  int64_t restarts = 0;
  const auto r = ratios(topo, rows_of(topo, rounds), rounds, dim, seed, outer, true, &restarts);
  return rate_of(r, restarts);
}

Optimum optimize_consensus(const Topology& topo, Form form, int64_t rounds, int64_t dim, uint64_t seed) {
  if (rounds < 1) throw ConfigError("the consensus contraction needs rounds >= 1");
  const auto rows = rows_of(topo, rounds);
  Optimum best;
  best.rate.geometric = std::numeric_limits<double>::infinity();
  for (int a = 1; a <= 10; ++a) {
    for (int m = 0; m < 20; ++m) {
      OuterStep o;
      o.form = form;
      o.momentum = 0.05 * m;
      if (form == Form::accelerated) o.gossip_step = 0.1 * a;
      else o.lr = 0.1 * a;
      int64_t restarts = 0;
      const auto c = rate_of(ratios(topo, rows, rounds, dim, seed, o, true, &restarts), restarts);
      ++best.points;
      if (c.geometric < best.rate.geometric) best.rate = c, best.best = o;
    }
  }
  return best;
}

}  // namespace gasloc::algo
