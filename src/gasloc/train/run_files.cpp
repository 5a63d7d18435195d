#include "gasloc/train/run_files.hpp"

#include <fmt/format.h>
#include <torch/torch.h>

#include "gasloc/core/atomic_file.hpp"
#include "gasloc/data/dataset.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/train/checkpoint.hpp"

namespace gasloc::train {
namespace fs = std::filesystem;

namespace {
std::string dir_list(const std::vector<fs::path>& dirs) {
  std::string s;
  for (const auto& d : dirs) s += (s.empty() ? "'" : ", '") + d.string() + "'";
  return s;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}
}  // namespace

std::vector<fs::path> rank_checkpoint_files(const std::vector<fs::path>& dirs, int world, std::vector<int> ranks) {
  if (dirs.empty()) throw ConfigError("no run directory given", "pass --run RUN");
  if (world < 1) throw CheckpointError(fmt::format("a run of {} workers has no checkpoints", world));
  if (ranks.empty())
    for (int r = 0; r < world; ++r) ranks.push_back(r);
  // The newest step any rank committed, in any of the directories: one rank's commit proves
  // that every rank wrote the step (checkpoint.hpp).
  int64_t step = -1;
  for (const auto& d : dirs) {
    const RunCheckpoints c(d, world);
    for (int r = 0; r < world; ++r)
      if (const auto s = c.committed(r); !s.empty()) step = std::max(step, s.front());
  }
  if (step < 0)
    throw CheckpointError(fmt::format("no committed checkpoint in {}", dir_list(dirs)),
                          "pass the run directory of a run that saved a checkpoint (train.checkpoint_every, or "
                          "the end of training)");
  std::vector<fs::path> files;
  std::vector<int> missing, twice;
  for (int r : ranks) {
    fs::path found;
    for (const auto& d : dirs) {
      const fs::path p = RunCheckpoints(d, world).file(step, r);
      std::error_code ec;
      if (!fs::is_regular_file(p, ec)) continue;
      if (found.empty()) found = p;
      else if (!fs::equivalent(found, p, ec)) twice.push_back(r);
    }
    if (found.empty()) missing.push_back(r);
    files.push_back(found);
  }
  if (!twice.empty())
    throw CheckpointError(fmt::format("rank(s) {} have a checkpoint in more than one of {}", rank_list(twice), dir_list(dirs)),
                          "pass each host's run directory once, and only directories of this one run");
  if (!missing.empty())
    throw CheckpointError(fmt::format("the run has {} workers but rank(s) {} have no checkpoint of step {} in {}", world,
                                      rank_list(missing), step, dir_list(dirs)),
                          "a Gloo run over several hosts leaves each rank's checkpoint on its own host: copy them "
                          "over, or pass every host's run directory (--run DIR --run DIR2 ...); or choose one "
                          "worker with --worker R");
  return files;
}

RunInfo read_run_info(const std::vector<fs::path>& dirs) {
  for (const auto& d : dirs) {
    if (!fs::exists(d / "run.json")) continue;
    RunInfo info;
    info.dir = d;
    info.doc = nlohmann::json::parse(read_file(d / "run.json"), nullptr, false);
    if (info.doc.is_discarded() || !info.doc.contains("config"))
      throw CheckpointError("corrupt run.json in '" + d.string() + "'", "restore it from the run's host, or train again");
    info.job = job_from_json(info.doc["config"], {});
    info.model = info.job.model.resolve(info.doc.value("model", nlohmann::json::object()).value("vocab_size", int64_t{0}));
    info.world = info.doc.value("world", 1);
    const auto dataset = info.doc.value("dataset", nlohmann::json::object());
    info.data_dir = dataset.value("dir", std::string());
    info.data_fingerprint = dataset.value("fingerprint", std::string());
    return info;
  }
  throw CheckpointError("no run.json in " + dir_list(dirs),
                        "pass a directory written by `gasloc train` (under Gloo, rank 0's host holds run.json)");
}

fs::path run_dataset_dir(const RunInfo& info) {
  const fs::path copy = info.dir / "dataset";
  if (fs::exists(copy / "dataset.json")) return copy;
  if (info.data_dir.empty() || !fs::exists(info.data_dir / "dataset.json")) return {};
  if (!info.data_fingerprint.empty()) {
    const std::string now = data::Dataset::open(info.data_dir).fingerprint;
    if (now != info.data_fingerprint)
      throw DataError(fmt::format("'{}' no longer holds the dataset run '{}' trained on: its fingerprint is {} now, {} "
                                  "in the run's run.json (it was prepared again)",
                                  info.data_dir.string(), info.dir.string(), now, info.data_fingerprint),
                      "prepare the run's corpus again into another directory with the same options, or restore the "
                      "old one; runs since this version carry their own copy of the tokenizer");
  }
  return info.data_dir;
}

std::string describe_worker(int worker, int world) {
  if (world == 1) return "the model";
  if (worker == kAverageModel) return fmt::format("average of {} workers", world);
  return fmt::format("worker {} of {}", worker, world);
}

RunModel load_run_model(const std::vector<fs::path>& dirs, int worker) {
  RunModel rm;
  rm.info = read_run_info(dirs);
  const int world = rm.info.world;
  if (worker != kAverageModel && (worker < 0 || worker >= world))
    throw ConfigError(fmt::format("--worker {} is not a rank of this {}-worker run", worker, world),
                      fmt::format("choose a rank in 0..{}, or leave --worker out for the average model", world - 1));
  // One worker needs only its own file; the others' may be on other hosts.
  const auto files = worker == kAverageModel ? rank_checkpoint_files(dirs, world) : rank_checkpoint_files(dirs, world, {worker});

  rm.model = model::Llama(rm.info.model);
  rm.flat = FlatParams(rm.model->hf_parameters());
  rm.worker = worker;
  torch::NoGradGuard no_grad;
  torch::Tensor sum;
  for (size_t i = 0; i < files.size(); ++i) {
    const Checkpoint c = load_checkpoint(files[i]);
    const int64_t step = c.meta.value("step", int64_t{0});
    if (i == 0) rm.step = step;
    else if (step != rm.step)
      throw CheckpointError(fmt::format("'{}' is from step {} but '{}' from step {}", files[i].string(), step,
                                        files[0].string(), rm.step),
                            "the ranks' checkpoints must come from the same step: restore a consistent set");
    if (c.meta.value("world", 1) != world)
      throw CheckpointError(fmt::format("'{}' was written by a {}-worker run, run.json says {}", files[i].string(),
                                        c.meta.value("world", 1), world),
                            "pass only directories of this one run");
    const auto it = c.tensors.find("params");
    if (it == c.tensors.end() || it->second.numel() != rm.flat.numel())
      throw CheckpointError("checkpoint '" + files[i].string() + "' does not match the model in run.json",
                            "pass the run directory the checkpoint was written in");
    const torch::Tensor p = it->second.to(torch::kFloat32).reshape({-1});
    // The same order of operations as the in-process evaluation's all-reduce: rank 0, plus
    // the others in rank order, then one division.
    if (i == 0) sum = p.clone();
    else sum.add_(p);
  }
  if (files.size() > 1) sum.div_(static_cast<double>(files.size()));
  rm.flat.data().copy_(sum);
  return rm;
}

}  // namespace gasloc::train
