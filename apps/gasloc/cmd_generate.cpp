// gasloc generate: text from a run's model (the average of its workers by default) or an export.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <iostream>

#include "commands.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/train/inference.hpp"
#include "model_source.hpp"

namespace gasloc::app {

Action add_generate(CLI::App& app) {
  struct Opts {
    ModelChoice model;
    std::string prompt;
    train::SampleOptions sample;
    bool no_stop = false, json = false;
  };
  auto o = std::make_shared<Opts>();
  add_model_options(app, o->model);
  app.add_option("--prompt", o->prompt, "text to continue (\"\" starts a new document)")->required();
  app.add_option("--max-tokens", o->sample.max_tokens, "new tokens at most")->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--temperature", o->sample.temperature, "sampling temperature; 0 = always the most likely token")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--top-k", o->sample.top_k, "sample among the k most likely tokens (0 = all)")->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--seed", o->sample.seed, "seed of the draws: the same seed gives the same text")->capture_default_str();
  app.add_flag("--no-stop", o->no_stop, "go on past the end of a document (the BOS token) up to --max-tokens");
  app.add_flag("--json", o->json,
               "print one JSON object: the text, the prompt's token ids (BOS first) and the new ones (to compare with "
               "another implementation's decoding)");
  return [o]() {
    LoadedModel m = load_model(o->model);
    if (!m.tokenizer)
      throw DataError("no tokenizer for " + m.what,
                      "--run needs the run's dataset directory (its data.dir) in place; --model needs the "
                      "tokenizer.model that `gasloc export` writes beside the weights");
    const data::Tokenizer& tok = *m.tokenizer;
    // Training saw BOS before every document: a prompt starts one.
    std::vector<int> prompt = {tok.bos_id()};
    for (int id : tok.encode(o->prompt)) prompt.push_back(id);
    train::SampleOptions opt = o->sample;
    opt.stop_id = o->no_stop ? -1 : tok.bos_id();
    const train::SampleResult r = train::sample(m.model, prompt, opt);
    std::vector<int> all(prompt.begin(), prompt.end());
    all.insert(all.end(), r.tokens.begin(), r.tokens.end());
    if (o->json)
      std::cout << nlohmann::json{{"text", tok.decode(all)}, {"prompt_ids", prompt}, {"new_ids", r.tokens}}.dump() << std::endl;
    else
      std::cout << tok.decode(all) << std::endl;
    std::cerr << fmt::format("({}: {} new tokens, {})\n", m.what, r.tokens.size(),
                             r.stopped ? "stopped at the end of a document" : "--max-tokens reached");
    return 0;
  };
}

}  // namespace gasloc::app
