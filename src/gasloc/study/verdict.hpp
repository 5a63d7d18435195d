// Judging a claim from runs on several seeds (docs/experiments.md, "Seeds and verdicts"): where the
// two methods ran on shared seeds they are paired by seed, and a verdict is "reproduced" or "not
// reproduced" only when the mean paired difference exceeds the spread of the paired differences;
// where they share no seed (unpaired), only when the means' difference exceeds the larger of
// either side's own spread. Otherwise it is "inconclusive". Pure functions of the numbers, so
// the rules are tested on hand-made values.
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

// The seeds' spread: the larger of the two variants' min-max ranges over the seeds both ran (the
// unpaired rule's noise, over all their seeds, when they share none).
double seed_spread(const BySeed& a, const BySeed& b);
// The paired rule's noise: the min-max range of the finite paired differences a - b.
double paired_spread(const BySeed& a, const BySeed& b);

// Below, d = a - b on each shared seed, m its mean and s the spread of the d (paired); with no
// shared seed, m = mean a - mean b and s = seed_spread over every run (unpaired). Each verdict's
// numbers name the rule that judged it.
// "a ends lower than b": every d < 0 (unpaired: m < 0) and -m > s (reproduced); every d > 0 and
// m > s (not reproduced).
Judgement judge_lower(const BySeed& a, const BySeed& b);
// "a is within tolerance of b": |m| + s <= tolerance * |mean b| (reproduced);
// |m| - s > tolerance * |mean b| (not reproduced).
Judgement judge_within(const BySeed& a, const BySeed& b, double tolerance);
// "a is no worse than b by more than tolerance": m + s <= tolerance * |mean b| (reproduced);
// m - s > tolerance * |mean b| (not reproduced).
Judgement judge_no_worse(const BySeed& a, const BySeed& b, double tolerance);
// "a reaches the target at least (1 + tolerance) times sooner than b", on times (steps or
// seconds) per seed: judged like judge_lower on d = a * (1 + tolerance) - b, paired only (a run
// that never reaches the target makes its d infinite, left out of s). `unit` names them.
Judgement judge_faster(const BySeed& a, const BySeed& b, double tolerance, const std::string& unit);

}  // namespace gasloc::study
