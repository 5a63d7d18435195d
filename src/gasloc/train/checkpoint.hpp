// Checkpoints. One file holds every tensor of one worker's state (parameters, optimizer moments,
// algorithm state, RNG, sampler position) plus a JSON header (model shape, step, counters) and a
// checksum of the tensor data, verified when it is loaded: a damaged file is an error, never a
// run that trains on garbage. Files are written atomically (a crash or a full disk leaves the
// previous file).
//
// A run keeps its checkpoints in two phases (docs/design.md section 9), so that a rank killed while
// saving never leaves the ranks at different steps:
//   RUN/checkpoints/step-00000120/rank0.pt   phase 1: every rank writes its file for the step
//   RUN/checkpoints/rank0.committed          phase 2: after a barrier (every rank has written the
//                                            step), each rank records the commit
// One rank's commit of step S proves that every rank wrote S, so a run resumes from the newest
// step committed by any rank. Each rank keeps its files of its two newest committed steps (the
// older one is the fallback when the newer is damaged) and deletes older ones.
#pragma once
#include <nlohmann/json.hpp>
#include <torch/types.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace gasloc::train {

using StateDict = std::map<std::string, torch::Tensor>;

struct Checkpoint {
  nlohmann::json meta;  // format, step, model config, optimizer/algorithm names, counters
  StateDict tensors;
};

void save_checkpoint(const std::filesystem::path& path, const Checkpoint& ckpt);
// Throws CheckpointError if the file is missing, damaged (its checksum does not match) or not a
// gasloc checkpoint.
Checkpoint load_checkpoint(const std::filesystem::path& path);

// The checkpoints of one run directory with `world` ranks.
class RunCheckpoints {
 public:
  RunCheckpoints(std::filesystem::path run_dir, int world);

  std::filesystem::path file(int64_t step, int rank) const;
  // Phase 1: this rank's state at `step`.
  void write(int64_t step, int rank, const Checkpoint& ckpt) const;
  // Phase 2, after every rank has written `step`: records the commit (with the newest committed
  // step before it) and removes this rank's files of every other step; a committed step after
  // `step` is a branch the run abandoned by resuming an earlier step, and is dropped.
  void commit(int64_t step, int rank) const;
  // A damaged record: keeps the committed steps whose files load (checksums verified), removes
  // this rank's files of other steps, and returns one line for each thing it dropped.
  std::vector<std::string> repair(int rank) const;
  // A run that goes on from `step` although this rank committed later ones: forgets them (the
  // commit record keeps the steps up to `step`) and removes this rank's files of later steps, so
  // that neither a prune nor a later resume can take that abandoned branch for the run.
  void rewind(int rank, int64_t step) const;
  // This rank's committed steps, newest first (at most two); empty if none.
  std::vector<int64_t> committed(int rank) const;
  // The step to resume from given every rank's committed steps: the newest step any rank
  // committed. Throws CheckpointError naming the ranks when one of `local_ranks` (the ranks whose
  // files this process can see) lacks its file for it.
  int64_t resume_step(const std::vector<std::vector<int64_t>>& committed_by_rank, const std::vector<int>& local_ranks) const;
  // Anything checkpoint-like in the directory (this layout or an older gasloc's checkpoint*.pt);
  // with `ranks`, only those ranks' files (and an older gasloc's): an elastic rank that starts
  // late must not take the files its running peers already wrote for another run's.
  bool any(const std::vector<int>* ranks = nullptr) const;
  // Removes this rank's files of steps it never committed (a run that died during its first
  // checkpoint), and the step directories that leaves empty.
  void discard_uncommitted(int rank) const;
  // Removes all of them, with the temporary files of a failed write; returns the bytes freed.
  // A finished run's results live in metrics.jsonl, so a sweep may reclaim the space.
  uintmax_t remove_all() const;

  const std::filesystem::path& dir() const { return dir_; }

 private:
  // Writes this rank's commit record; `what` names the operation in the error.
  void record(int rank, const std::vector<int64_t>& steps, const std::string& what) const;
  std::filesystem::path run_dir_, dir_;
  int world_;
};

}  // namespace gasloc::train
