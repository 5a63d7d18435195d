#include "gasloc/train/checkpoint.hpp"

#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <sstream>

#include "gasloc/core/atomic_file.hpp"
#include "gasloc/core/error.hpp"

namespace gasloc::train {

static constexpr const char* kFormat = "gasloc-checkpoint-1";

void save_checkpoint(const std::filesystem::path& path, const Checkpoint& ckpt) {
  torch::serialize::OutputArchive archive;
  nlohmann::json meta = ckpt.meta;
  meta["format"] = kFormat;
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

Checkpoint load_checkpoint(const std::filesystem::path& path) {
  if (!std::filesystem::exists(path))
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
    throw CheckpointError("corrupt checkpoint '" + path.string() + "': " + msg,
                          "the file is damaged or not a gasloc checkpoint; start a new run or restore a copy");
  }
  if (ckpt.meta.value("format", "") != kFormat)
    throw CheckpointError("'" + path.string() + "' is not a " + kFormat + " file");
  return ckpt;
}

}  // namespace gasloc::train
