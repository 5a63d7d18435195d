#include "gasloc/topology/spectral.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/linalg.h>
#include <torch/torch.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <numbers>
#include <string>
#include <vector>

#include "gasloc/core/error.hpp"

namespace gasloc::topology {

double spectral_gap(const Topology& topo, int64_t rounds) {
  const int n = topo.size();
  if (rounds < 1) throw ConfigError("spectral gap needs rounds >= 1, got " + std::to_string(rounds));
  if (n > 4096)
    throw ConfigError("spectral gap for n = " + std::to_string(n) + " is a dense " + std::to_string(n) + "^2 "
                      "eigenvalue problem", "use n <= 4096, or the closed form in docs/topology.md");
  const auto N = static_cast<size_t>(n);
  std::vector<double> m(N * N, 0.0);
  int64_t count = 0;
  if (topo.is_all_reduce()) {
    // W^T W = W = 11^T/n: skip the O(n^3) sum over dense rows.
    std::fill(m.begin(), m.end(), 1.0 / n);
    count = 1;
  } else {
    count = topo.is_random() ? rounds : topo.period();
    for (int64_t t = 0; t < count; ++t) {
      // (W^T W)_jk = sum_i W_ij W_ik: each sparse row adds its outer product, O(n deg^2).
      for (const auto& row : topo.mixing_rows(t))
        for (auto [j, wj] : row)
          for (auto [k, wk] : row) m[j * N + k] += wj * wk;
    }
  }
  // Subtracting 11^T/n sends the consensus direction's eigenvalue (1) to 0 and leaves the
  // others alone (E[W^T W] is symmetric with eigenvector 1), so the largest eigenvalue left is
  // lambda_2, with no need to identify which computed eigenvalue is "the" 1.
  for (auto& v : m) v = v / static_cast<double>(count) - 1.0 / n;
  const auto mat = torch::from_blob(m.data(), {n, n}, torch::kFloat64);
  const double lambda2 = torch::linalg::eigvalsh(mat, "L").max().item<double>();
  return 1.0 - std::max(lambda2, 0.0);
}

double spectral_gap_closed_form(const Topology& topo) {
  const double n = topo.size();
  if (topo.size() <= 2) return 1.0;  // every valid graph on 1 or 2 workers averages exactly
  switch (topo.kind()) {
    case Kind::complete: return 1.0;
    case Kind::ring: {
      // Circulant W: eigenvalues (1 + 2cos(2 pi k/n))/3; for n >= 3, k = 1 has the largest square.
      const double l = (1.0 + 2.0 * std::cos(2.0 * std::numbers::pi / n)) / 3.0;
      return 1.0 - l * l;
    }
    case Kind::exp: return 1.0 / std::countr_zero(static_cast<unsigned>(topo.size()));
    case Kind::one_peer:
      // W^T W = W; E[W] = a I + b (11^T - I) with b = P(i, j paired)/2. Even n: a = 1/2,
      // b = 1/(2(n-1)); odd n: a = (n+1)/(2n), b = 1/(2n). lambda_2 = a - b.
      return topo.size() % 2 == 0 ? 0.5 + 0.5 / (n - 1) : 0.5;
    case Kind::two_peer:
      // W^2 = (3I + 2P + 2P^T + P^2 + P^-2)/9 with P a relabelled n-cycle; each power of P is
      // fixed-point free, so its expectation is (11^T - I)/(n-1): lambda_2 = 1/3 - 2/(3(n-1)).
      return 2.0 / 3.0 + 2.0 / (3.0 * (n - 1));
  }
  return 0.0;
}

int max_degree(const Topology& topo) {
  size_t deg = 0;
  // Degrees do not change from round to round (only who the neighbours are), so round 0 tells.
  for (const auto& row : topo.mixing_rows(0)) deg = std::max(deg, row.size() - 1);
  return static_cast<int>(deg);
}

double bytes_per_worker_per_round(const Topology& topo, int64_t message_bytes) {
  const double p = static_cast<double>(message_bytes);
  if (topo.is_all_reduce()) return 2.0 * (topo.size() - 1) / topo.size() * p;
  return max_degree(topo) * p;
}

const config::Choices& form_choices() {
  static const config::Choices c("GASLoC form", {{"anchor", "mix phi, outer step on theta"},
                                                 {"mix_after", "outer step, then mix"},
                                                 {"accelerated", "mix u, momentum on iterates"}});
  return c;
}

Form parse_form(const std::string& name) { return static_cast<Form>(form_choices().index(name)); }

std::string to_string(Form form) { return form_choices().options().at(static_cast<size_t>(form)).name; }

namespace {

void check_step(const OuterStep& o) {
  if (!(o.lr > 0) || !(o.momentum >= 0 && o.momentum < 1))
    throw ConfigError("the outer step needs lr > 0 and 0 <= momentum < 1");
  if (!(o.gossip_step >= 0 && o.gossip_step <= 1)) throw ConfigError("the gossip step alpha must be in [0, 1]");
}

// Gossip of n vectors of `dim` doubles (row-major), in plain loops: a grid of hundreds of
// settings times thousands of rounds must run in seconds. The consensus mean is projected out
// after every round: W is doubly stochastic, so the disagreement's dynamics do not depend on
// it, and rescaling (below) would otherwise blow it up.
class ConsensusSim {
 public:
  ConsensusSim(const Topology& topo, int64_t dim, uint64_t seed, OuterStep o)
      : n_(topo.size()), dim_(dim), o_(o), gen_(at::detail::createCPUGenerator(seed)) {
    m_.resize(static_cast<size_t>(n_ * dim_));
    draw();
  }

  // Independent standard normal vectors (the generator continues), momentum state at rest.
  void draw() {
    torch::NoGradGuard no_grad;
    const auto x0 = torch::randn({n_, dim_}, gen_, torch::kFloat64).contiguous();
    x_.assign(x0.data_ptr<double>(), x0.data_ptr<double>() + n_ * dim_);
    center(x_);
    if (o_.form == Form::anchor && o_.momentum != 0.0) b_.assign(x_.size(), 0.0);
    if (o_.form == Form::accelerated && o_.momentum != 0.0) u_prev_ = x_;
  }

  // Mean over workers of ||x_i - xbar||^2.
  double distance() const {
    double d = 0.0;
    for (int64_t k = 0; k < dim_; ++k) {
      double mean = 0.0;
      for (int i = 0; i < n_; ++i) mean += x_[i * dim_ + k];
      mean /= n_;
      for (int i = 0; i < n_; ++i) d += (x_[i * dim_ + k] - mean) * (x_[i * dim_ + k] - mean);
    }
    return d / n_;
  }

  void step(const std::vector<Row>& rows) {
    // m = W x (for accelerated u = x: no pseudo-gradient without training; for mix_after the
    // outer step on a zero pseudo-gradient leaves x as it is, so the round is plain gossip).
    std::fill(m_.begin(), m_.end(), 0.0);
    for (int i = 0; i < n_; ++i) {
      double* mi = &m_[i * dim_];
      for (auto [j, w] : rows[i]) {
        const double* xj = &x_[j * dim_];
        for (int64_t k = 0; k < dim_; ++k) mi[k] += w * xj[k];
      }
    }
    const double lr = o_.lr, mu = o_.momentum, alpha = o_.gossip_step;
    const size_t N = x_.size();
    switch (o_.form) {
      case Form::mix_after: x_.swap(m_); break;
      case Form::anchor:
        if (lr == 1.0 && mu == 0.0) {
          x_.swap(m_);  // exactly m, not x - (x - m)
        } else {
          for (size_t k = 0; k < N; ++k) {
            const double delta = x_[k] - m_[k];
            double step = delta;
            if (mu != 0.0) {
              b_[k] = mu * b_[k] + delta;
              step += mu * b_[k];
            }
            x_[k] -= lr * step;
          }
        }
        break;
      case Form::accelerated:
        for (size_t k = 0; k < N; ++k) {
          const double u = x_[k];
          double next = u - alpha * (u - m_[k]);
          if (mu != 0.0) {
            next += mu * (u - u_prev_[k]);
            u_prev_[k] = u;
          }
          x_[k] = next;
        }
        break;
    }
    center(x_);
    if (!b_.empty()) center(b_);
    if (!u_prev_.empty()) center(u_prev_);
  }

  // Multiplies the whole state by s (the dynamics are linear in it).
  void scale(double s) {
    for (auto* v : {&x_, &b_, &u_prev_})
      for (auto& e : *v) e *= s;
  }

 private:
  void center(std::vector<double>& v) const {
    for (int64_t k = 0; k < dim_; ++k) {
      double mean = 0.0;
      for (int i = 0; i < n_; ++i) mean += v[i * dim_ + k];
      mean /= n_;
      for (int i = 0; i < n_; ++i) v[i * dim_ + k] -= mean;
    }
  }

  int n_;
  int64_t dim_;
  OuterStep o_;
  at::Generator gen_;
  std::vector<double> x_, m_, b_, u_prev_;
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

}  // namespace gasloc::topology
