// The model that `gasloc eval` and `gasloc generate` use: a run's checkpoints (one worker, or
// the average of all) or a directory written by `gasloc export` (or any plain HF Llama).
#pragma once
#include <CLI/CLI.hpp>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "gasloc/core/flat_params.hpp"
#include "gasloc/data/tokenizer.hpp"
#include "gasloc/model/llama.hpp"

namespace gasloc::app {

struct ModelChoice {
  std::vector<std::string> runs;  // --run (several: a Gloo run's hosts)
  std::string model;              // --model HF_DIR
  int worker = -1;                // --worker R; -1: the average model
};

// Declares --run, --model (one of them required) and --worker on `app`.
void add_model_options(CLI::App& app, ModelChoice& choice);

struct LoadedModel {
  model::Llama model{nullptr};
  FlatParams flat;                          // --run: the parameters' buffer
  std::string what;                         // "runs/a (average of 8 workers, step 300)" for messages
  std::optional<data::Tokenizer> tokenizer;  // the one it was trained with, where it is known
  // The run's evaluation settings (--run), defaults otherwise.
  int64_t batch_size = 16, seq_len = 128, val_batches = 0;
  // --run: the dataset it trained on, as recorded, and that dataset's fingerprint then.
  std::filesystem::path run_data_dir;
  std::string run_data_fingerprint;
};

// Throws gasloc errors for a bad choice or unreadable files. A missing tokenizer is not an
// error here (eval works without one); callers that need it check.
LoadedModel load_model(const ModelChoice& choice);

}  // namespace gasloc::app
