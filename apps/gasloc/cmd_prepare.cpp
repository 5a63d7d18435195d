// `gasloc prepare`: tokenize a corpus into llm.c shards (see src/gasloc/data/prepare.hpp and
// docs/data.md).
#include <fmt/format.h>

#include <chrono>
#include <iostream>

#include "commands.hpp"
#include "gasloc/data/prepare.hpp"

namespace gasloc::app {

Action add_prepare(CLI::App& app) {
  auto opt = std::make_shared<data::PrepareOptions>();
  auto inputs = std::make_shared<std::vector<std::string>>();
  auto out = std::make_shared<std::string>();
  auto tokenizer = std::make_shared<std::string>();
  app.add_option("--input,-i", *inputs, "corpus files: .txt (blank-line separated documents), .jsonl, .json")
      ->required()
      ->expected(1, -1);
  app.add_option("--out,-o", *out, "output directory for shards, tokenizer.model and dataset.json")->required();
  app.add_option("--text-field", opt->text_field, "JSON field holding the document text")->capture_default_str();
  app.add_option("--vocab-size", opt->vocab_size, "vocabulary size of the trained BPE tokenizer (<= 65536)")
      ->capture_default_str()
      ->check(CLI::Range(260, 65536));
  app.add_flag("--byte-level", opt->byte_level, "use the byte-level tokenizer (vocab 257) instead of training one");
  app.add_option("--tokenizer", *tokenizer, "load this SentencePiece .model instead of training one")
      ->check(CLI::ExistingFile);
  app.add_option("--val-fraction", opt->val_fraction, "fraction held out for validation: of documents (at least one), or of tokens when the corpus is one document")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 0.999999));
  app.add_option("--seed", opt->seed, "seed of the train/validation split and tokenizer training")->capture_default_str();
  app.add_option("--threads", opt->threads, "worker threads (0: all cores)")->capture_default_str();
  app.add_flag("--force", opt->force, "replace a dataset already prepared in --out (runs trained on it no longer match it)");
  return [=]() {
    opt->inputs.assign(inputs->begin(), inputs->end());
    opt->out = *out;
    opt->tokenizer_model = *tokenizer;
    const auto t0 = std::chrono::steady_clock::now();
    auto r = data::prepare(*opt, [](const std::string& line) { std::cout << line << std::endl; });
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::cout << fmt::format(
        "prepared {} document{} in {:.1f} s: {} train tokens, {} val tokens (split by {}), vocab {}, in {}\n",
        r.documents, r.documents == 1 ? "" : "s", secs, r.train_tokens, r.val_tokens, r.split, r.vocab_size, r.dir.string());
    std::cout << fmt::format("unigram baseline (validation loss of token frequencies alone): {:.4f}\n", r.unigram_val_loss);
    for (const auto& w : r.warnings) std::cerr << "warning: " << w << "\n";
    return 0;
  };
}

}  // namespace gasloc::app
