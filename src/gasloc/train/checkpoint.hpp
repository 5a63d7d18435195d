// Checkpoints: one file RUN/checkpoint.pt holding every tensor of a worker's state (parameters,
// optimizer moments, algorithm state, RNG, sampler position) plus a JSON header describing the
// model shape and step, written atomically (a crash or a full disk leaves the previous file).
#pragma once
#include <nlohmann/json.hpp>
#include <torch/types.h>

#include <filesystem>
#include <map>
#include <string>

namespace gasloc::train {

using StateDict = std::map<std::string, torch::Tensor>;

struct Checkpoint {
  nlohmann::json meta;  // format, step, model config, optimizer/algorithm names
  StateDict tensors;
};

void save_checkpoint(const std::filesystem::path& path, const Checkpoint& ckpt);
// Throws CheckpointError if the file is missing, corrupt or not a gasloc checkpoint.
Checkpoint load_checkpoint(const std::filesystem::path& path);

}  // namespace gasloc::train
