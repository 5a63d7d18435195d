// Judging a claim from runs on several seeds (docs/design.md section 8): the two methods are paired by
// seed, and a verdict is "reproduced" or "not reproduced" only when the difference exceeds the
// seeds' spread; otherwise it is "inconclusive". Pure functions of the numbers, so the rules are
// tested on hand-made values.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace gasloc::study {

struct Stats {
  int n = 0;
  double mean = 0, lo = 0, hi = 0;
};
// Mean and min-max of the finite values (an infinite one, a target never reached, is left out).
Stats stats_of(const std::vector<double>& v);
// "mean" or "mean (lo-hi)" with the format f, "-" when empty.
std::string fmt_stats(const Stats& s, const char* f);

// One variant's value per seed: a final loss, or the steps or seconds to a target (+inf when the
// run never reached it).
using BySeed = std::map<int64_t, double>;

struct Judgement {
  std::string verdict;  // reproduced | not reproduced | inconclusive (why)
  std::string numbers;  // the evidence: both means with their ranges, the paired differences, the spread
};

// The seeds' spread: the larger of the two variants' min-max ranges over the seeds both ran.
double seed_spread(const BySeed& a, const BySeed& b);

// "a ends lower than b": every paired difference a - b is negative and their mean's size exceeds
// the spread (reproduced); every one positive and the mean above the spread (not reproduced).
Judgement judge_lower(const BySeed& a, const BySeed& b);
// "a is within tolerance of b": |mean(a - b)| + spread <= tolerance * |mean b| (reproduced);
// |mean(a - b)| - spread > tolerance * |mean b| (not reproduced).
Judgement judge_within(const BySeed& a, const BySeed& b, double tolerance);
// "a is no worse than b by more than tolerance": mean(a - b) + spread <= tolerance * |mean b|
// (reproduced); mean(a - b) - spread > tolerance * |mean b| (not reproduced).
Judgement judge_no_worse(const BySeed& a, const BySeed& b, double tolerance);
// "a reaches the target at least (1 + tolerance) times sooner than b", on times (steps or
// seconds) per seed: judged like judge_lower on a * (1 + tolerance) - b. `unit` names them.
Judgement judge_faster(const BySeed& a, const BySeed& b, double tolerance, const std::string& unit);

}  // namespace gasloc::study
