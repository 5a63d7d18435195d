// Helpers shared by tests: a small byte-level dataset and a nano job configuration.
#pragma once
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "gasloc/data/prepare.hpp"
#include "gasloc/train/job_config.hpp"
#include "gasloc/train/trainer.hpp"
#include "test_paths.hpp"

namespace gasloc::test_util {

// A unique directory for this process under the build tree.
inline std::filesystem::path temp_root(const std::string& name) {
  auto p = gasloc::test_paths::binary_dir() / (name + "_tmp") / std::to_string(::getpid());
  std::filesystem::create_directories(p);
  return p;
}

// Prepares a byte-level dataset of varied, learnable text in dir/data and returns its path.
inline std::filesystem::path make_byte_dataset(const std::filesystem::path& dir) {
  std::ofstream f(dir / "corpus.txt");
  for (int i = 0; i < 400; ++i)
    f << "Document " << i << ": the quick brown fox " << (i % 7) << " jumps over the lazy dog " << (i * 13 % 11) << ".\n\n";
  f.close();
  data::PrepareOptions o;
  o.inputs = {dir / "corpus.txt"};
  o.out = dir / "data";
  o.byte_level = true;
  o.val_fraction = 0.1;
  data::prepare(o);
  return o.out;
}

// The nano job used by trainer and algorithm tests (one worker; algorithms are set by tests).
inline train::JobConfig nano_job(const std::filesystem::path& data_dir, std::vector<std::string> extra = {}) {
  std::vector<std::string> o = {"model.preset=nano", "data.dir=" + data_dir.string(), "data.seq_len=32",
                                "data.batch_size=4", "data.val_batches=2", "train.steps=100", "optim.lr=0.003",
                                "optim.warmup_steps=5", "train.threads=1"};
  o.insert(o.end(), extra.begin(), extra.end());
  return train::load_job("", o);
}

// A quiet trainer request for the nano job on root/data (make_byte_dataset), 100 steps into
// root/run; `extra` settings come last, so they override these.
inline train::TrainRequest nano_request(const std::filesystem::path& root, const std::string& run,
                                        std::vector<std::string> extra = {}) {
  train::TrainRequest r;
  r.quiet = true;
  r.overrides = {"model.preset=nano", "data.dir=" + (root / "data").string(), "data.seq_len=32", "data.batch_size=4",
                 "data.val_batches=2", "train.steps=100", "train.eval_every=25", "train.checkpoint_every=0",
                 "train.log_every=10", "optim.lr=0.003", "optim.warmup_steps=5", "train.threads=1",
                 "train.run_dir=" + (root / run).string()};
  r.overrides.insert(r.overrides.end(), extra.begin(), extra.end());
  return r;
}

}  // namespace gasloc::test_util
