// bench_comm --codec: the codecs' speed (src/gasloc/comm/codec.hpp) on one core, in GB/s of
// fp32 input, beside memcpy of the same buffer measured in the same run. Kept apart from
// bench_comm.cpp's Gloo benches because it needs nothing but the codecs.
#pragma once
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "gasloc/comm/codec.hpp"

namespace gasloc::bench {

// Median seconds of `reps` timed calls of fn after one warm-up (which also faults the pages in).
template <class Fn>
double median_seconds(int reps, Fn&& fn) {
  fn();
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// For each size (millions of elements): memcpy, then encode and decode of int8, int4 and topk
// (density 1/64) on normal values, one thread.
inline void run_codec_bench(const std::vector<double>& sizes_m, int reps) {
  using comm::Codec;
  fmt::print("bench_comm --codec: one thread ({} cores here), normal(0, 1) values, median of {} after a warm-up; "
             "GB/s of fp32 input (4 bytes an element)\n\n",
             std::thread::hardware_concurrency(), reps);
  fmt::print("| elements | op | ms | GB/s | / memcpy |\n|---|---|---|---|---|\n");
  for (double m : sizes_m) {
    const auto n = static_cast<size_t>(m * 1e6);
    std::vector<float> x(n), y(n);
    std::mt19937 rng(1);
    std::normal_distribution<float> normal(0, 1);
    for (auto& v : x) v = normal(rng);
    const double gb = 4.0 * static_cast<double>(n) / 1e9;
    const double t_copy = median_seconds(reps, [&] { std::memcpy(y.data(), x.data(), 4 * n); });
    auto row = [&](const std::string& op, double t) {
      fmt::print("| {:g}M | {} | {:.2f} | {:.2f} | {:.0f}% |\n", m, op, t * 1e3, gb / t, 100 * t_copy / t);
      std::fflush(stdout);
    };
    row("memcpy", t_copy);
    for (const Codec& c : {Codec::int8(), Codec::int4(), Codec::topk()}) {
      std::vector<uint8_t> p(comm::payload_bytes(c, n));
      const double te = median_seconds(reps, [&] { comm::encode_into(c, x, p); });
      const double td = median_seconds(reps, [&] { comm::decode(c, p, y); });
      const std::string name = c.kind == comm::CodecKind::topk ? "topk 1/64" : c.kind == comm::CodecKind::int8 ? "int8" : "int4";
      row(name + " encode", te);
      row(name + " decode", td);
      row(name + " encode + decode", te + td);
    }
  }
}

}  // namespace gasloc::bench
