// Reading a run back as a model: where each rank's checkpoint is, the run's configuration, and
// the model to evaluate, export or sample from (one worker's own, or the average of all).
//
// Each rank writes RUN/checkpoints/step-S/rank{r}.pt and commits it (checkpoint.hpp). Under Gloo
// over several hosts every rank writes into its own host's run_dir (each with run.json and the
// dataset's copy), so a run may be spread over several directories.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "gasloc/core/flat_params.hpp"
#include "gasloc/model/llama.hpp"
#include "gasloc/train/job_config.hpp"

namespace gasloc::train {

// The checkpoint file of each of `ranks` (empty: every rank 0..world-1, in rank order) of a
// run of `world` workers at the newest step any rank committed, found in `dirs` (the run
// directory, or each host's copy of it). Throws CheckpointError naming the ranks that are
// missing, or found in two directories.
std::vector<std::filesystem::path> rank_checkpoint_files(const std::vector<std::filesystem::path>& dirs, int world,
                                                         std::vector<int> ranks = {});

struct RunInfo {
  std::filesystem::path dir;  // the directory holding run.json
  nlohmann::json doc;         // run.json
  JobConfig job;
  model::LlamaConfig model;
  int world = 1;
  std::filesystem::path data_dir;  // the dataset it trained on, as recorded (may be relative)
  std::string data_fingerprint;    // that dataset's fingerprint when the run started
};

// Where a run's dataset description and tokenizer are: its own copy (RUN/dataset, since runs
// carry one), else data_dir while it still holds the dataset the run trained on; "" when there
// is neither (llm.c shards: no tokenizer; a dataset moved away). Throws DataError naming both
// fingerprints when data_dir holds another dataset now (prepared again into the same directory).
std::filesystem::path run_dataset_dir(const RunInfo& info);

// Reads run.json from the first of `dirs` that has one. CheckpointError if none does.
RunInfo read_run_info(const std::vector<std::filesystem::path>& dirs);

constexpr int kAverageModel = -1;

struct RunModel {
  RunInfo info;
  model::Llama model{nullptr};
  FlatParams flat;      // the model's parameters, in the checkpoints' layout
  int64_t step = 0;
  int worker = kAverageModel;  // whose model: a rank, or kAverageModel
};

// The model of a run at its last checkpoint: worker `worker`'s own (0 <= worker < world), or
// with kAverageModel the mean of every rank's parameters (summed in rank order, as the trainer's
// evaluation does, so it scores the same loss). A one-worker run's average is its model.
// Throws CheckpointError for a missing or mismatched checkpoint, ConfigError for a bad worker.
RunModel load_run_model(const std::vector<std::filesystem::path>& dirs, int worker = kAverageModel);

// "average of 8 workers" / "worker 3 of 8" / "the model": for messages.
std::string describe_worker(int worker, int world);

}  // namespace gasloc::train
