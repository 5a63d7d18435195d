#include <fmt/format.h>

#include <filesystem>

#include "commands.hpp"
#include "gasloc/core/atomic_file.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/core/flat_params.hpp"
#include "gasloc/model/hf_export.hpp"
#include "gasloc/train/checkpoint.hpp"
#include "gasloc/train/job_config.hpp"

namespace gasloc::app {
namespace fs = std::filesystem;

Action add_export(CLI::App& app) {
  struct Opts {
    std::string run, out, dtype = "float32";
  };
  auto o = std::make_shared<Opts>();
  app.add_option("--run", o->run, "run directory (holds run.json and checkpoints/)")->required();
  app.add_option("--out", o->out, "output directory for model.safetensors and config.json")->required();
  app.add_option("--dtype", o->dtype, "float32 or bfloat16")->capture_default_str();
  return [o]() {
    if (o->dtype != "float32" && o->dtype != "bfloat16")
      throw ConfigError("--dtype must be float32 or bfloat16, got '" + o->dtype + "'");
    const fs::path run(o->run);
    auto info = nlohmann::json::parse(read_file(run / "run.json"), nullptr, false);
    if (info.is_discarded() || !info.contains("config"))
      throw CheckpointError("corrupt run.json in '" + o->run + "'");
    const auto job = train::job_from_json(info["config"], {});
    const auto mc = job.model.resolve(info["model"].value("vocab_size", int64_t{0}));
    const train::RunCheckpoints ckpts(run, info.value("world", 1));
    const auto steps = ckpts.committed(0);
    if (steps.empty())
      throw CheckpointError("run '" + o->run + "' has no committed checkpoint", "export a run that saved one");
    const auto ckpt = train::load_checkpoint(ckpts.file(steps.front(), 0));
    model::Llama m(mc);
    FlatParams flat(m->hf_parameters());
    const auto it = ckpt.tensors.find("params");
    if (it == ckpt.tensors.end() || it->second.numel() != flat.numel())
      throw CheckpointError("checkpoint in '" + o->run + "' does not match the model in its run.json");
    {
      torch::NoGradGuard no_grad;
      flat.data().copy_(it->second);
    }
    // The tokenizer travels with the weights: its BOS id goes into config.json and its model
    // file is copied next to them (SentencePiece datasets only).
    model::HfSpecialTokens special;
    const fs::path data_dir = info.value("dataset", nlohmann::json::object()).value("dir", std::string());
    if (!data_dir.empty() && fs::exists(data_dir / "dataset.json")) {
      auto ds = nlohmann::json::parse(read_file(data_dir / "dataset.json"), nullptr, false);
      if (!ds.is_discarded() && ds.contains("tokenizer") && ds["tokenizer"].contains("bos_id"))
        special.bos_token_id = ds["tokenizer"]["bos_id"].get<int64_t>();
    }
    model::export_hf(o->out, m, o->dtype, special);
    if (fs::exists(data_dir / "tokenizer.model"))
      fs::copy_file(data_dir / "tokenizer.model", fs::path(o->out) / "tokenizer.model", fs::copy_options::overwrite_existing);
    fmt::print("exported step {} of '{}' ({:.2f}M parameters, {}) to {}\n", ckpt.meta.value("step", int64_t{0}), o->run,
               static_cast<double>(mc.num_params()) / 1e6, o->dtype, o->out);
    return 0;
  };
}

}  // namespace gasloc::app
