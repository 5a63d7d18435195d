#include "model_source.hpp"

#include <fmt/format.h>

#include "gasloc/core/error.hpp"
#include "gasloc/data/dataset.hpp"
#include "gasloc/model/hf_export.hpp"
#include "gasloc/train/run_files.hpp"

namespace gasloc::app {
namespace fs = std::filesystem;

void add_model_options(CLI::App& app, ModelChoice& c) {
  auto* run = app.add_option("--run", c.runs,
                             "run directory (repeat it for a Gloo run whose ranks wrote checkpoints on several hosts)");
  auto* model = app.add_option("--model", c.model, "a directory written by `gasloc export` (HF safetensors + config.json)")
                    ->check(CLI::ExistingDirectory);
  run->excludes(model);
  app.add_option("--worker", c.worker, "with --run: this worker's own model instead of the average of all workers")
      ->excludes(model);
}

LoadedModel load_model(const ModelChoice& c) {
  LoadedModel m;
  if (c.runs.empty() && c.model.empty()) throw ConfigError("no model given", "pass --run RUN or --model HF_DIR");
  if (!c.runs.empty()) {
    const std::vector<fs::path> dirs(c.runs.begin(), c.runs.end());
    train::RunModel rm = train::load_run_model(dirs, c.worker);
    m.model = rm.model;
    m.flat = std::move(rm.flat);
    m.what = fmt::format("{} ({}, step {})", rm.info.dir.string(), train::describe_worker(rm.worker, rm.info.world), rm.step);
    m.batch_size = rm.info.job.data.batch_size;
    m.seq_len = rm.info.job.data.seq_len;
    m.val_batches = rm.info.job.data.val_batches;
    m.run_data_dir = rm.info.data_dir;
    m.run_data_fingerprint = rm.info.data_fingerprint;
    if (const fs::path d = train::run_dataset_dir(rm.info); !d.empty()) m.tokenizer = data::dataset_tokenizer(d);
  } else {
    const fs::path dir = c.model;
    m.model = model::Llama(model::read_hf_config(dir / "config.json"));
    model::import_hf(dir, m.model);
    m.what = dir.string();
    m.seq_len = std::min<int64_t>(m.seq_len, m.model->config().max_seq_len);
    if (fs::exists(dir / "tokenizer.model")) m.tokenizer = data::Tokenizer::load_sentencepiece(dir / "tokenizer.model");
    else if (m.model->config().vocab_size == data::Tokenizer::byte_level().vocab_size())
      m.tokenizer = data::Tokenizer::byte_level();  // byte-level exports carry no tokenizer file
  }
  m.model->eval();
  return m;
}

}  // namespace gasloc::app
