// gasloc export: a run's model as a Hugging Face directory (model.safetensors, config.json and,
// for SentencePiece datasets, tokenizer.model + tokenizer_config.json). Several workers: their
// average by default (the model `report` scores), or one of them with --worker.
#include <fmt/format.h>

#include <filesystem>
#include <iostream>

#include "commands.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/data/dataset.hpp"
#include "gasloc/model/hf_export.hpp"
#include "gasloc/train/run_files.hpp"

namespace gasloc::app {
namespace fs = std::filesystem;

Action add_export(CLI::App& app) {
  struct Opts {
    std::vector<std::string> runs;
    std::string out, dtype = "float32", data;
    int worker = train::kAverageModel;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("--run", o->runs,
                 "run directory (repeat it for a Gloo run whose ranks wrote checkpoints on several hosts)")
      ->required();
  app.add_option("--out", o->out, "output directory for model.safetensors, config.json and the tokenizer")->required();
  app.add_option("--dtype", o->dtype, "float32 or bfloat16")->capture_default_str();
  app.add_option("--worker", o->worker, "export this worker's own model instead of the average of all workers");
  app.add_option("--data", o->data, "take the tokenizer from this dataset directory (default: the run's data.dir)");
  return [o]() {
    if (o->dtype != "float32" && o->dtype != "bfloat16")
      throw ConfigError("--dtype must be float32 or bfloat16, got '" + o->dtype + "'");
    const std::vector<fs::path> dirs(o->runs.begin(), o->runs.end());
    train::RunModel rm = train::load_run_model(dirs, o->worker);
    // The run's own copy of its tokenizer, else its data.dir while unchanged (run_dataset_dir).
    const fs::path data_dir = o->data.empty() ? train::run_dataset_dir(rm.info) : fs::path(o->data);
    const fs::path shards_dir = o->data.empty() ? rm.info.data_dir : fs::path(o->data);

    // The tokenizer travels with the weights. Documents were separated by BOS alone, so BOS is
    // also what the model predicts where a text ends: it is config.json's eos_token_id too.
    model::HfSpecialTokens special;
    std::optional<data::Tokenizer> tok;
    if (!data_dir.empty() && fs::exists(data_dir / "dataset.json")) tok = data::dataset_tokenizer(data_dir);
    else if (!shards_dir.empty() && fs::is_directory(shards_dir) && !fs::exists(shards_dir / "dataset.json"))  // llm.c: GPT-2's <|endoftext|>
      special.bos_token_id = special.eos_token_id = data::kGpt2Eot;
    if (tok) {
      special.bos_token_id = special.eos_token_id = tok->bos_id();
      if (tok->vocab_size() > rm.info.model.vocab_size)
        throw DataError(fmt::format("the tokenizer in '{}' has {} tokens, the model {}", data_dir.string(),
                                    tok->vocab_size(), rm.info.model.vocab_size),
                        "pass --data with the dataset the run trained on");
    }
    fs::create_directories(o->out);
    model::export_hf(o->out, rm.model, o->dtype, special);
    std::string tokenizer_note;
    if (tok && tok->kind() == "sentencepiece") {
      model::HfTokenizer t;
      t.sentencepiece_model = tok->serialized_model();
      t.bos_token = tok->piece(tok->bos_id());
      t.eos_token = t.bos_token;
      if (tok->unk_id() >= 0) t.unk_token = tok->piece(tok->unk_id());
      t.model_max_length = rm.info.model.max_seq_len;
      model::export_hf_tokenizer(o->out, t);
      tokenizer_note = ", tokenizer.model + tokenizer_config.json";
    } else if (tok) {
      tokenizer_note = ", no tokenizer files (byte-level: ids 0-255 are UTF-8 bytes, 256 is BOS)";
    } else {
      std::cerr << "warning: no tokenizer exported: '" << shards_dir.string()
                << "' is not a gasloc dataset (GPT-2 tokens, or moved); pass --data DIR to take it from elsewhere\n";
    }
    fmt::print("exported {} at step {} of '{}' ({:.2f}M parameters, {}{}) to {}\n",
               train::describe_worker(rm.worker, rm.info.world), rm.step, rm.info.dir.string(),
               static_cast<double>(rm.info.model.num_params()) / 1e6, o->dtype, tokenizer_note, o->out);
    return 0;
  };
}

}  // namespace gasloc::app
