// Opening a dataset: the memory-mapped token stream (what gasloc trains from) side by side with
// the reference that reads every shard into one vector, in one run. For each: the time to open
// (both validate every token), the anonymous memory the process gained (the job's own memory;
// mapped pages live in the shared page cache instead), and the rate of drawing training batches.
//
//   build/bench_data [--tokens 200000000] [--shard-tokens 50000000] [--dir bench_data_tmp]
//
// The shards are written first, so both paths read them from the page cache.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gasloc/core/rng.hpp"
#include "gasloc/data/sampler.hpp"
#include "gasloc/data/shard.hpp"
#include "gasloc/data/token_stream.hpp"

namespace fs = std::filesystem;
using namespace gasloc::data;
using Clock = std::chrono::steady_clock;

namespace {

// The process's anonymous resident memory in MB (RssAnon in /proc/self/status).
double anon_mb() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("RssAnon:", 0) == 0) return std::stod(line.substr(8)) / 1024.0;
  return -1;
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Training batches of B 8, T 1024 per second.
double batches_per_s(std::shared_ptr<const TokenStream> tokens) {
  WindowSampler s(std::move(tokens), 8, 1024, 1);
  const int n = 2000;
  const auto t0 = Clock::now();
  int64_t sum = 0;
  for (int i = 0; i < n; ++i) sum += s.next().inputs[0][0].item<int64_t>();
  if (sum < 0) fmt::print("");  // keep the loop
  return n / seconds_since(t0);
}

struct Row {
  double open_s, anon_mb, batches_per_s;
};

}  // namespace

int main(int argc, char** argv) {
  int64_t tokens = 200'000'000, shard_tokens = 50'000'000;
  std::string dir_arg = "bench_data_tmp";
  CLI::App app{"Opening a token dataset memory-mapped against reading it into memory"};
  app.add_option("--tokens", tokens, "tokens to write")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--shard-tokens", shard_tokens, "tokens per shard")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--dir", dir_arg, "scratch directory (removed and recreated)")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  const fs::path dir = dir_arg;
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::vector<fs::path> paths;
  for (int64_t done = 0, k = 0; done < tokens; done += shard_tokens, ++k) {
    std::vector<uint16_t> part(static_cast<size_t>(std::min(shard_tokens, tokens - done)));
    for (size_t i = 0; i < part.size(); ++i) part[i] = static_cast<uint16_t>(gasloc::random_below(3, done + i, 50257));
    paths.push_back(dir / fmt::format("train_{:06d}.bin", k));
    write_shard(paths.back(), part);
  }

  Row mapped{}, read{};
  {
    const double a0 = anon_mb();
    const auto t0 = Clock::now();
    auto s = TokenStream::map_shards(paths, 50257);
    mapped.open_s = seconds_since(t0);
    mapped.anon_mb = anon_mb() - a0;
    mapped.batches_per_s = batches_per_s(s);
  }
  {
    const double a0 = anon_mb();
    const auto t0 = Clock::now();
    std::vector<uint16_t> all;
    for (const auto& p : paths) {
      auto part = read_shard(p, 50257);
      all.insert(all.end(), part.begin(), part.end());
    }
    auto s = std::make_shared<TokenStream>(std::move(all));
    read.open_s = seconds_since(t0);
    read.anon_mb = anon_mb() - a0;
    read.batches_per_s = batches_per_s(s);
  }
  fs::remove_all(dir);

  fmt::print("{} tokens ({:.0f} MB of uint16) in {} shards; batches of B 8, T 1024\n\n", tokens, tokens * 2 / 1e6,
             paths.size());
  fmt::print("| stream | open (s) | anonymous memory gained (MB) | batches/s |\n|---|---:|---:|---:|\n");
  fmt::print("| mapped (gasloc) | {:.2f} | {:.0f} | {:.0f} |\n", mapped.open_s, mapped.anon_mb, mapped.batches_per_s);
  fmt::print("| read into memory (reference) | {:.2f} | {:.0f} | {:.0f} |\n", read.open_s, read.anon_mb,
             read.batches_per_s);
  fmt::print("\nmapped / read: open time {:.2f}x, batches/s {:.2f}x\n", mapped.open_s / read.open_s,
             mapped.batches_per_s / read.batches_per_s);
  return 0;
}
