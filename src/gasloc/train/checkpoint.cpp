#include "gasloc/train/checkpoint.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <algorithm>
#include <sstream>

#include "gasloc/core/atomic_file.hpp"
#include "gasloc/core/checksum.hpp"
#include "gasloc/core/error.hpp"

namespace gasloc::train {
namespace fs = std::filesystem;

static constexpr const char* kFormat = "gasloc-checkpoint-1";

namespace {
// Names and bytes of every tensor, in the map's (sorted) order.
std::string tensors_checksum(const StateDict& tensors) {
  Checksum sum;
  for (const auto& [name, t] : tensors) {
    const torch::Tensor c = t.detach().cpu().contiguous();
    sum.update(name.data(), name.size());
    const int64_t dtype = static_cast<int64_t>(c.scalar_type());
    sum.update(&dtype, sizeof dtype);
    for (const int64_t d : c.sizes()) sum.update(&d, sizeof d);
    sum.update(c.data_ptr(), static_cast<size_t>(c.numel()) * c.element_size());
  }
  return sum.hex();
}

const char* kDamagedHint = "the file is damaged; resume from the previous committed step (the error names it) or restore a copy";
}  // namespace

void save_checkpoint(const fs::path& path, const Checkpoint& ckpt) {
  torch::serialize::OutputArchive archive;
  nlohmann::json meta = ckpt.meta;
  meta["format"] = kFormat;
  meta["checksum"] = tensors_checksum(ckpt.tensors);
  archive.write("meta", c10::IValue(meta.dump()));
  for (const auto& [name, t] : ckpt.tensors) archive.write("t/" + name, t.detach().cpu().contiguous(), /*is_buffer=*/true);
  std::ostringstream out;
  archive.save_to(out);
  try {
    write_file_atomic(path, out.str());
  } catch (const Error& e) {
    throw CheckpointError("checkpoint not written: " + std::string(e.what()), e.hint());
  }
}

Checkpoint load_checkpoint(const fs::path& path) {
  if (!fs::exists(path))
    throw CheckpointError("no checkpoint at '" + path.string() + "'", "pass the run directory of a run that saved a checkpoint");
  Checkpoint ckpt;
  torch::serialize::InputArchive archive;
  try {
    std::istringstream in(read_file(path));
    archive.load_from(in);
    c10::IValue meta;
    archive.read("meta", meta);
    ckpt.meta = nlohmann::json::parse(meta.toStringRef());
    for (const auto& key : archive.keys()) {
      if (key.rfind("t/", 0) != 0) continue;
      torch::Tensor t;
      archive.read(key, t, /*is_buffer=*/true);
      ckpt.tensors[key.substr(2)] = t;
    }
  } catch (const CheckpointError&) {
    throw;
  } catch (const std::exception& e) {
    std::string msg = e.what();
    msg = msg.substr(0, msg.find('\n'));
    throw CheckpointError("corrupt checkpoint '" + path.string() + "': " + msg, kDamagedHint);
  }
  if (ckpt.meta.value("format", "") != kFormat)
    throw CheckpointError("'" + path.string() + "' is not a " + kFormat + " file");
  // The archive format checks its structure but not the tensor bytes (LibTorch 1.13 ignores the
  // zip CRCs): without this, 4 KB overwritten in place would load and train on garbage.
  if (!ckpt.meta.contains("checksum"))
    throw CheckpointError("checkpoint '" + path.string() + "' carries no checksum (written by an older gasloc)",
                          "start a new run; checkpoints are verified since gasloc 0.2");
  if (tensors_checksum(ckpt.tensors) != ckpt.meta["checksum"].get<std::string>())
    throw CheckpointError("corrupt checkpoint '" + path.string() + "': its tensor data does not match its checksum",
                          kDamagedHint);
  return ckpt;
}

// ---------------------------------------------------------------------------------------------

RunCheckpoints::RunCheckpoints(fs::path run_dir, int world)
    : run_dir_(std::move(run_dir)), dir_(run_dir_ / "checkpoints"), world_(world) {}

namespace {
// The step-S directories under `dir` with their steps (an unreadable name is skipped).
std::vector<std::pair<int64_t, fs::path>> step_dirs(const fs::path& dir) {
  std::vector<std::pair<int64_t, fs::path>> out;
  std::error_code ec;
  for (const auto& d : fs::directory_iterator(dir, ec)) {
    const std::string name = d.path().filename().string();
    if (!d.is_directory() || name.rfind("step-", 0) != 0) continue;
    try {
      out.emplace_back(std::stoll(name.substr(5)), d.path());
    } catch (const std::exception&) {
    }
  }
  return out;
}
}  // namespace

fs::path RunCheckpoints::file(int64_t step, int rank) const {
  return dir_ / fmt::format("step-{:08d}", step) / fmt::format("rank{}.pt", rank);
}

void RunCheckpoints::write(int64_t step, int rank, const Checkpoint& ckpt) const { save_checkpoint(file(step, rank), ckpt); }

std::vector<int64_t> RunCheckpoints::committed(int rank) const {
  const fs::path marker = dir_ / fmt::format("rank{}.committed", rank);
  if (!fs::exists(marker)) return {};
  auto j = nlohmann::json::parse(read_file(marker), nullptr, false);
  if (j.is_discarded() || !j.contains("steps") || !j["steps"].is_array())
    throw CheckpointError("corrupt commit record '" + marker.string() + "'",
                          "remove it to fall back to rank files by hand, or start a new run");
  return j["steps"].get<std::vector<int64_t>>();
}

void RunCheckpoints::record(int rank, const std::vector<int64_t>& steps, const std::string& what) const {
  try {
    write_file_atomic(dir_ / fmt::format("rank{}.committed", rank), nlohmann::json({{"steps", steps}}).dump() + "\n");
  } catch (const Error& e) {
    throw CheckpointError(what + ": " + e.what(), e.hint());
  }
}

void RunCheckpoints::commit(int64_t step, int rank) const {
  // The step just written and the newest committed one before it (the fallback). A committed step
  // after `step` belongs to a branch this run abandoned (it resumed from an earlier step): it is
  // forgotten, and its files go with the others below.
  std::vector<int64_t> steps{step};
  for (int64_t s : committed(rank))
    if (s < step) {
      steps.push_back(s);
      break;
    }
  record(rank, steps, "checkpoint not committed");
  // This rank's files of steps it no longer keeps; a step directory goes with its last file.
  std::error_code ec;
  for (const auto& [s, path] : step_dirs(dir_)) {
    // A write that a kill interrupted leaves its temporary file behind.
    fs::remove(path / fmt::format("rank{}.pt.tmp", rank), ec);
    if (s >= steps.back() && s <= step) continue;
    fs::remove(path / fmt::format("rank{}.pt", rank), ec);
    if (fs::is_empty(path, ec)) fs::remove(path, ec);
  }
}

int64_t RunCheckpoints::resume_step(const std::vector<std::vector<int64_t>>& committed_by_rank,
                                    const std::vector<int>& local_ranks) const {
  int64_t step = -1;
  for (const auto& steps : committed_by_rank)
    if (!steps.empty()) step = std::max(step, steps.front());
  if (step < 0)
    throw CheckpointError("'" + run_dir_.string() + "' holds no committed checkpoint",
                          "the run stopped before its first checkpoint committed: run the same command without --resume "
                          "(it starts over in this directory)");
  std::string missing;
  for (const int r : local_ranks) {
    const auto& steps = committed_by_rank.at(static_cast<size_t>(r));
    if (fs::exists(file(step, r))) continue;
    missing += fmt::format("{}rank {} (committed: {})", missing.empty() ? "" : ", ", r,
                           steps.empty() ? std::string("none") : fmt::format("{}", fmt::join(steps, ", ")));
  }
  if (!missing.empty())
    throw CheckpointError(fmt::format("the checkpoints in '{}' are from mixed steps: step {} is committed, but {} {} no "
                                      "file for it",
                                      run_dir_.string(), step, missing, missing.find(',') == std::string::npos ? "has" : "have"),
                          "restore the missing files, or resume an earlier step with --resume-step, or let --repair drop "
                          "what is missing (it names what it drops)");
  return step;
}

std::vector<std::string> RunCheckpoints::repair(int rank) const {
  std::vector<std::string> dropped;
  std::vector<int64_t> kept;
  for (int64_t s : committed(rank)) {
    try {
      load_checkpoint(file(s, rank));
      kept.push_back(s);
    } catch (const CheckpointError& e) {
      dropped.push_back(fmt::format("rank {}: committed step {} dropped: {}", rank, s, e.what()));
    }
  }
  if (!dropped.empty()) record(rank, kept, "cannot repair the commit record");
  std::error_code ec;
  for (const auto& [s, path] : step_dirs(dir_)) {
    if (std::find(kept.begin(), kept.end(), s) != kept.end()) continue;
    for (const char* suffix : {".pt", ".pt.tmp"}) {
      const fs::path f = path / fmt::format("rank{}{}", rank, suffix);
      if (fs::exists(f, ec) && fs::remove(f, ec))
        dropped.push_back(fmt::format("rank {}: removed '{}', a file of no committed step", rank, f.string()));
    }
    if (fs::is_empty(path, ec)) fs::remove(path, ec);
  }
  return dropped;
}

void RunCheckpoints::rewind(int rank, int64_t step) const {
  std::vector<int64_t> steps = committed(rank);
  std::erase_if(steps, [step](int64_t s) { return s > step; });
  record(rank, steps, "cannot rewind the commit record");
  std::error_code ec;
  for (const auto& [s, path] : step_dirs(dir_)) {
    if (s <= step) continue;
    for (const char* suffix : {".pt", ".pt.tmp"}) fs::remove(path / fmt::format("rank{}{}", rank, suffix), ec);
    if (fs::is_empty(path, ec)) fs::remove(path, ec);
  }
}

void RunCheckpoints::discard_uncommitted(int rank) const {
  const std::vector<int64_t> kept = committed(rank);
  std::error_code ec;
  for (const auto& [s, path] : step_dirs(dir_)) {
    if (std::find(kept.begin(), kept.end(), s) != kept.end()) continue;
    for (const char* suffix : {".pt", ".pt.tmp"}) fs::remove(path / fmt::format("rank{}{}", rank, suffix), ec);
    if (fs::is_empty(path, ec)) fs::remove(path, ec);
  }
  if (fs::is_empty(dir_, ec)) fs::remove(dir_, ec);
}

bool RunCheckpoints::any(const std::vector<int>* ranks) const {
  std::error_code ec;
  if (ranks) {
    for (int r : *ranks) {
      if (fs::exists(dir_ / fmt::format("rank{}.committed", r), ec)) return true;
      for (const auto& [s, path] : step_dirs(dir_))
        for (const char* suffix : {".pt", ".pt.tmp"})
          if (fs::exists(path / fmt::format("rank{}{}", r, suffix), ec)) return true;
    }
  } else if (fs::exists(dir_, ec) && !fs::is_empty(dir_, ec)) {
    return true;
  }
  for (const auto& e : fs::directory_iterator(run_dir_, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("checkpoint", 0) == 0 && e.path().extension() == ".pt") return true;
  }
  return false;
}

uintmax_t RunCheckpoints::remove_all() const {
  uintmax_t freed = 0;
  std::error_code ec;
  if (fs::exists(dir_, ec)) {
    for (const auto& e : fs::recursive_directory_iterator(dir_, ec))
      if (e.is_regular_file()) freed += e.file_size();
    fs::remove_all(dir_, ec);
  }
  for (const auto& e : fs::directory_iterator(run_dir_)) {
    const std::string name = e.path().filename().string();
    if (e.is_regular_file() && name.rfind("checkpoint", 0) == 0 &&
        (name.ends_with(".pt") || name.ends_with(".pt.tmp"))) {
      freed += e.file_size();
      fs::remove(e.path());
    }
  }
  return freed;
}

}  // namespace gasloc::train
