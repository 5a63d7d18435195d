// gasloc: communication-efficient and decentralized LLM pretraining. See README.md.
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <cerrno>
#include <filesystem>
#include <iostream>

#include "commands.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/core/shipped_files.hpp"

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // line by line even into a pipe: `gasloc launch` shows ranks live
  CLI::App app{"gasloc: communication-efficient and decentralized LLM pretraining"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "gasloc 0.1.0");
  if (const auto shipped = gasloc::shipped_dir(); !shipped.empty())
    app.footer("Installed job files and studies: " + shipped.string() +
               " (configs/, experiments/): a relative --config or study file missing here is looked up there.");
  std::vector<std::pair<CLI::App*, gasloc::app::Action>> commands;
  auto add = [&](const char* name, const char* help, auto adder) {
    CLI::App* sub = app.add_subcommand(name, help);
    commands.emplace_back(sub, adder(*sub));
  };
  add("prepare", "tokenize a corpus into train/validation shards", gasloc::app::add_prepare);
  add("train", "train a model from a TOML job file", gasloc::app::add_train);
  add("model-info", "print a preset's shapes, parameter count and FLOPs per token", gasloc::app::add_model_info);
  add("report", "compare finished runs: a table and a validation-loss plot", gasloc::app::add_report);
  add("dashboard", "follow runs live in a browser: losses, consensus, bytes sent, utilization, failures",
      gasloc::app::add_dashboard);
  add("export", "export a run's model (average of its workers, or one) as Hugging Face safetensors + tokenizer",
      gasloc::app::add_export);
  add("eval", "loss, perplexity and bits per byte of a run's model or an export on a prepared dataset",
      gasloc::app::add_eval);
  add("generate", "sample text from a run's model or an export", gasloc::app::add_generate);
  add("launch", "start N ranks of a command on this host (torchrun-style environment)", gasloc::app::add_launch);
  add("comm-check", "check the communication backend inside a launched process group", gasloc::app::add_comm_check);
  add("store", "host a rendezvous store for ranks started by hand (no training rank holds it)", gasloc::app::add_store);
  add("secret", "write a new job secret (cluster.secret_file): only its holders take part in the job",
      gasloc::app::add_secret);
  add("sweep", "run a study's grid of training runs (resumable) and write its tables and plots", gasloc::app::add_sweep);
  add("topo", "print a gossip topology's mixing matrix, degree, bytes per round and spectral gap", gasloc::app::add_topo);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help prints and succeeds; every usage error exits 2, like gasloc's own input errors.
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    for (auto& [sub, action] : commands)
      if (sub->parsed()) return action();
  } catch (const gasloc::Error& e) {
    // Exit statuses say whether trying again may help (gasloc launch --elastic restarts a rank
    // for 3 and 1, not for 2): 2 for the job's input (configuration, data, checkpoints, disk),
    // which a restart would meet again; 3 for a peer or the network.
    std::cerr << "error: " << e.what() << "\n";
    if (!e.hint().empty()) std::cerr << "hint: " << e.hint() << "\n";
    return dynamic_cast<const gasloc::CommError*>(&e) ? 3 : 2;
  } catch (const std::filesystem::filesystem_error& e) {
    std::cerr << "error: " << e.what() << "\n";
    const int err = e.code().value();
    if (err == ENOSPC || err == EDQUOT || err == EROFS || err == EACCES) {
      std::cerr << "hint: free space or fix the permissions of that path, then resume the run\n";
      return 2;
    }
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
