#include "gasloc/study/verdict.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace gasloc::study {

Stats stats_of(const std::vector<double>& v) {
  Stats s;
  std::vector<double> f;
  for (double x : v)
    if (std::isfinite(x)) f.push_back(x);
  s.n = static_cast<int>(f.size());
  if (f.empty()) return s;
  s.lo = *std::min_element(f.begin(), f.end());
  s.hi = *std::max_element(f.begin(), f.end());
  for (double x : f) s.mean += x / static_cast<double>(f.size());
  return s;
}

std::string fmt_stats(const Stats& s, const char* f) {
  if (s.n == 0) return "-";
  const std::string m = fmt::format(fmt::runtime(f), s.mean);
  return s.n == 1 ? m : m + " (" + fmt::format(fmt::runtime(f), s.lo) + "-" + fmt::format(fmt::runtime(f), s.hi) + ")";
}

namespace {

struct Paired {
  std::vector<int64_t> seeds;
  std::vector<double> a, b;
};
Paired paired(const BySeed& a, const BySeed& b) {
  Paired p;
  for (const auto& [seed, va] : a)
    if (auto it = b.find(seed); it != b.end()) {
      p.seeds.push_back(seed);
      p.a.push_back(va);
      p.b.push_back(it->second);
    }
  return p;
}

// a - b on every paired seed.
std::vector<double> differences(const Paired& p) {
  std::vector<double> d;
  for (size_t i = 0; i < p.a.size(); ++i) d.push_back(p.a[i] - p.b[i]);
  return d;
}

// The evidence line: means and ranges, each seed's difference, the spread.
std::string evidence(const Paired& p, const std::vector<double>& d, double spread, const char* f, const std::string& what) {
  std::string per;
  for (size_t i = 0; i < d.size(); ++i) {
    const std::string v = std::isfinite(d[i]) ? fmt::format(fmt::runtime(std::string("{:+") + (f + 2)), d[i])
                          : std::isnan(d[i])  ? std::string("neither reached")
                          : d[i] > 0          ? std::string("only b reached")
                                              : std::string("only a reached");
    per += p.seeds[i] == 0 ? fmt::format("{}one run: {}", per.empty() ? "" : ", ", v)
                           : fmt::format("{}seed {}: {}", per.empty() ? "" : ", ", p.seeds[i], v);
  }
  return fmt::format("a {}, b {}; {} per seed: {}; seeds' spread {}{}", fmt_stats(stats_of(p.a), f), fmt_stats(stats_of(p.b), f),
                     what, per, fmt::format(fmt::runtime(f), spread), d.size() == 1 ? " (one seed: no spread to exceed)" : "");
}

// The sign rule over differences where a negative one supports the claim.
std::string sign_verdict(const std::vector<double>& d, double spread) {
  if (d.empty()) return "inconclusive (no seed ran both)";
  const bool all_neg = std::all_of(d.begin(), d.end(), [](double x) { return x < 0; });
  const bool all_pos = std::all_of(d.begin(), d.end(), [](double x) { return x > 0; });
  double mean = 0;
  for (double x : d) mean += x / static_cast<double>(d.size());
  if (all_neg && -mean > spread) return "reproduced";
  if (all_pos && mean > spread) return "not reproduced";
  if (!all_neg && !all_pos) return "inconclusive (the seeds disagree)";
  return "inconclusive (the difference is within the seeds' spread)";
}

}  // namespace

double seed_spread(const BySeed& a, const BySeed& b) {
  const Paired p = paired(a, b);
  const Stats sa = stats_of(p.a), sb = stats_of(p.b);
  return std::max(sa.n ? sa.hi - sa.lo : 0.0, sb.n ? sb.hi - sb.lo : 0.0);
}

Judgement judge_lower(const BySeed& a, const BySeed& b) {
  const Paired p = paired(a, b);
  const std::vector<double> d = differences(p);
  const double spread = seed_spread(a, b);
  return {sign_verdict(d, spread), evidence(p, d, spread, "{:.4f}", "a - b")};
}

namespace {
// within (two-sided: the gap |a - b|) and no_worse (one-sided: the excess a - b) against
// tolerance * |mean b|, the spread taken against the claim both ways.
Judgement judge_gap(const BySeed& a, const BySeed& b, double tolerance, bool one_sided) {
  const Paired p = paired(a, b);
  const std::vector<double> d = differences(p);
  const double spread = seed_spread(a, b);
  Judgement j{"", evidence(p, d, spread, "{:.4f}", "a - b")};
  const Stats sd = stats_of(d), sb = stats_of(p.b);
  if (sd.n == 0) {
    j.verdict = "inconclusive (no seed ran both)";
    return j;
  }
  const char* what = one_sided ? "excess" : "gap";
  const double allowed = tolerance * std::abs(sb.mean), gap = one_sided ? sd.mean : std::abs(sd.mean);
  j.numbers += fmt::format("; allowed {} {:.4f}", what, allowed);
  if (gap + spread <= allowed) j.verdict = "reproduced";
  else if (gap - spread > allowed) j.verdict = "not reproduced";
  else j.verdict = fmt::format("inconclusive (the {} is within the seeds' spread of the tolerance)", what);
  return j;
}
}  // namespace

Judgement judge_within(const BySeed& a, const BySeed& b, double tolerance) { return judge_gap(a, b, tolerance, false); }

Judgement judge_no_worse(const BySeed& a, const BySeed& b, double tolerance) { return judge_gap(a, b, tolerance, true); }

Judgement judge_faster(const BySeed& a, const BySeed& b, double tolerance, const std::string& unit) {
  const Paired p = paired(a, b);
  std::vector<double> d;
  for (size_t i = 0; i < p.a.size(); ++i) {
    const double ta = p.a[i], tb = p.b[i];
    if (!std::isfinite(ta) && !std::isfinite(tb)) d.push_back(std::numeric_limits<double>::quiet_NaN());
    else if (!std::isfinite(ta)) d.push_back(std::numeric_limits<double>::infinity());
    else if (!std::isfinite(tb)) d.push_back(-std::numeric_limits<double>::infinity());
    else d.push_back(ta * (1 + tolerance) - tb);
  }
  const double spread = seed_spread(a, b);
  const char* f = unit == "steps" ? "{:.0f}" : "{:.1f}";
  Judgement j{"", evidence(p, d, spread, f, fmt::format("a x {:.2f} - b ({})", 1 + tolerance, unit))};
  if (std::any_of(d.begin(), d.end(), [](double x) { return std::isnan(x); }))
    j.verdict = "inconclusive (on some seed neither reached the target)";
  else
    j.verdict = sign_verdict(d, spread);
  return j;
}

}  // namespace gasloc::study
