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

std::vector<double> values(const BySeed& m) {
  std::vector<double> v;
  for (const auto& kv : m) v.push_back(kv.second);
  return v;
}

// a - b on every paired seed.
std::vector<double> differences(const Paired& p) {
  std::vector<double> d;
  for (size_t i = 0; i < p.a.size(); ++i) d.push_back(p.a[i] - p.b[i]);
  return d;
}

double range_of(const Stats& s) { return s.n ? s.hi - s.lo : 0.0; }

// The noise a claim's difference must exceed, and which rule measured it (docs/experiments.md,
// "Seeds and verdicts").
struct Noise {
  bool paired = true;
  double mean = 0;    // paired: the mean paired difference; unpaired: mean a - mean b
  double spread = 0;  // paired: the min-max range of the finite paired differences; unpaired: seed_spread
};

// Paired: runs on a shared seed share their initialization and data order, so the noise of a
// difference is the spread of the differences themselves, not either side's own spread. The mean
// holds the infinite differences of targets never reached; the spread leaves them out.
Noise paired_noise(const std::vector<double>& d) {
  const Stats s = stats_of(d);
  double mean = 0;
  for (double x : d) mean += x / static_cast<double>(d.size());
  return {true, d.empty() ? 0.0 : mean, range_of(s)};
}

// Unpaired (the sides share no seed): today's rule, the means' difference against the larger of
// the two sides' own min-max ranges.
Noise unpaired_noise(const BySeed& a, const BySeed& b) {
  const Stats sa = stats_of(values(a)), sb = stats_of(values(b));
  return {false, sa.mean - sb.mean, std::max(range_of(sa), range_of(sb))};
}

// The rule's line printed beside the verdict.
std::string noise_text(const Noise& n, size_t pairs, const char* f) {
  const std::string mean = fmt::format(fmt::runtime(std::string("{:+") + (f + 2)), n.mean);
  const std::string spread = fmt::format(fmt::runtime(f), n.spread);
  if (!n.paired)
    return fmt::format("unpaired rule (no seed ran both; docs/experiments.md): mean a - mean b {}, seeds' spread {} (the larger "
                       "min-max range)",
                       mean, spread);
  return fmt::format("paired rule (docs/experiments.md): mean paired difference {}, spread of the paired differences {}{}", mean,
                     spread, pairs == 1 ? " (one seed: no spread to exceed)" : "");
}

// The evidence line: means and ranges, each seed's difference, the rule and its numbers.
std::string evidence(const BySeed& a, const BySeed& b, const Paired& p, const std::vector<double>& d, const Noise& noise, const char* f,
                     const std::string& what) {
  std::string per;
  for (size_t i = 0; i < d.size(); ++i) {
    const std::string v = std::isfinite(d[i]) ? fmt::format(fmt::runtime(std::string("{:+") + (f + 2)), d[i])
                          : std::isnan(d[i])  ? std::string("neither reached")
                          : d[i] > 0          ? std::string("only b reached")
                                              : std::string("only a reached");
    per += p.seeds[i] == 0 ? fmt::format("{}one run: {}", per.empty() ? "" : ", ", v)
                           : fmt::format("{}seed {}: {}", per.empty() ? "" : ", ", p.seeds[i], v);
  }
  const Stats sa = stats_of(noise.paired ? p.a : values(a)), sb = stats_of(noise.paired ? p.b : values(b));
  return fmt::format("a {}, b {}; {} per seed: {}; {}", fmt_stats(sa, f), fmt_stats(sb, f), what, per.empty() ? "none" : per,
                     noise_text(noise, d.size(), f));
}

// The sign rule where a negative difference supports the claim: paired, every difference has the
// sign and their mean's size exceeds the spread; unpaired, the means' difference does.
std::string sign_verdict(const std::vector<double>& d, const Noise& n) {
  if (n.paired && d.empty()) return "inconclusive (no seed ran both)";
  const bool all_neg = n.paired ? std::all_of(d.begin(), d.end(), [](double x) { return x < 0; }) : n.mean < 0;
  const bool all_pos = n.paired ? std::all_of(d.begin(), d.end(), [](double x) { return x > 0; }) : n.mean > 0;
  if (all_neg && -n.mean > n.spread) return "reproduced";
  if (all_pos && n.mean > n.spread) return "not reproduced";
  if (!all_neg && !all_pos) return n.paired ? "inconclusive (the seeds disagree)" : "inconclusive (the means are equal)";
  return n.paired ? "inconclusive (the difference is within the spread of the paired differences)"
                  : "inconclusive (the difference is within the seeds' spread)";
}

// The noise of a claim on a and b: paired where they share a seed (only the shared seeds count),
// else unpaired; nothing to judge when a side has no run.
Noise noise_of(const BySeed& a, const BySeed& b, const Paired& p, const std::vector<double>& d) {
  return p.seeds.empty() ? unpaired_noise(a, b) : paired_noise(d);
}

}  // namespace

double seed_spread(const BySeed& a, const BySeed& b) {
  const Paired p = paired(a, b);
  return std::max(range_of(stats_of(p.a)), range_of(stats_of(p.b)));
}

double paired_spread(const BySeed& a, const BySeed& b) { return paired_noise(differences(paired(a, b))).spread; }

Judgement judge_lower(const BySeed& a, const BySeed& b) {
  const Paired p = paired(a, b);
  const std::vector<double> d = differences(p);
  if (a.empty() || b.empty()) return {"inconclusive (no seed ran both)", "a side has no runs"};
  const Noise n = noise_of(a, b, p, d);
  return {sign_verdict(d, n), evidence(a, b, p, d, n, "{:.4f}", "a - b")};
}

namespace {
// within (two-sided: the gap |a - b|) and no_worse (one-sided: the excess a - b) against
// tolerance * |mean b|, the spread taken against the claim both ways.
Judgement judge_gap(const BySeed& a, const BySeed& b, double tolerance, bool one_sided) {
  const Paired p = paired(a, b);
  const std::vector<double> d = differences(p);
  if (a.empty() || b.empty()) return {"inconclusive (no seed ran both)", "a side has no runs"};
  const Noise n = noise_of(a, b, p, d);
  Judgement j{"", evidence(a, b, p, d, n, "{:.4f}", "a - b")};
  const Stats sb = stats_of(n.paired ? p.b : values(b));
  const char* what = one_sided ? "excess" : "gap";
  const double allowed = tolerance * std::abs(sb.mean), gap = one_sided ? n.mean : std::abs(n.mean);
  j.numbers += fmt::format("; allowed {} {:.4f}", what, allowed);
  if (gap + n.spread <= allowed) j.verdict = "reproduced";
  else if (gap - n.spread > allowed) j.verdict = "not reproduced";
  else j.verdict = fmt::format("inconclusive (the {} is within the {} of the tolerance)", what,
                               n.paired ? "spread of the paired differences" : "seeds' spread");
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
  // Times are judged paired only: unpaired, a target some runs never reach has no mean.
  if (p.seeds.empty()) return {"inconclusive (no seed ran both)", fmt::format("a and b share no seed ({})", unit)};
  const Noise n = paired_noise(d);
  const char* f = unit == "steps" ? "{:.0f}" : "{:.1f}";
  Judgement j{"", evidence(a, b, p, d, n, f, fmt::format("a x {:.2f} - b ({})", 1 + tolerance, unit))};
  if (std::any_of(d.begin(), d.end(), [](double x) { return std::isnan(x); }))
    j.verdict = "inconclusive (on some seed neither reached the target)";
  else
    j.verdict = sign_verdict(d, n);
  return j;
}

}  // namespace gasloc::study
