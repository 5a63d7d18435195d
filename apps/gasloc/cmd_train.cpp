#include <fmt/format.h>

#include <cmath>
#include <iostream>

#include "commands.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/core/shipped_files.hpp"
#include "gasloc/train/job_config.hpp"
#include "gasloc/train/trainer.hpp"

namespace gasloc::app {

Action add_train(CLI::App& app) {
  struct Opts {
    train::TrainRequest req;
    std::string device, dtype, init_from;
    bool help_config = false;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("--config,-c", o->req.config_path,
                 "TOML job file (see configs/ and --help-config); a relative path missing from the working directory "
                 "is looked up in the installed share/gasloc (e.g. configs/research.toml)");
  app.add_option("--set,-s", o->req.overrides, "override a setting: section.key=value (repeatable)");
  app.add_option("--resume", o->req.resume_dir, "continue the run in this directory from its newest committed checkpoint");
  app.add_option("--allow-change", o->req.allow_change,
                 "with --resume: let the resume change this setting the checkpoints' state depends on (algo.compression, "
                 "algo.H, algo.topology, ...; repeatable); run.json and metrics.jsonl record the change at its step");
  app.add_flag("--verbose", o->req.verbose, "print the full resolved configuration and the thread plan at start");
  app.add_flag("--repair", o->req.repair,
               "with --resume: drop committed checkpoints whose files are missing or damaged (and files of no "
               "committed step), naming each, then resume from the newest step every rank holds");
  app.add_option("--resume-step", o->req.resume_step,
                 "with --resume: continue from this committed step instead (the previous one is kept, e.g. when the "
                 "newest is damaged)");
  app.add_option("--device", o->device, train::device_choices().names() + " (same as --set train.device=...)");
  app.add_option("--dtype", o->dtype, train::dtype_choices().names() + " (same as --set train.dtype=...)");
  app.add_option("--init-from", o->init_from,
                 "continue pretraining a Hugging Face Llama checkpoint (DIR/config.json, DIR/model.safetensors, as "
                 "transformers' save_pretrained writes them): the model's shape, epsilon, rotary base and vocabulary "
                 "come from its config.json, its weights from model.safetensors (same as --set model.init_from=DIR "
                 "plus the shape settings; --set after it still wins)");
  app.add_flag("--help-config", o->help_config, "list every setting with its default and doc, then exit");
  app.add_option("--job-id", o->req.job_id,
                 "gloo/nccl: the job token gasloc launch hands its ranks, or a gasloc store's --job-id (ranks started by "
                 "hand otherwise derive one from train.run_dir); the store refuses ranks of another job");
  app.add_option("--incarnation", o->req.incarnation,
                 "elastic gloo runs: which start of this rank this is; gasloc launch --elastic sets it, and a rank "
                 "started again (> 0) joins the running job, taking a running worker's state (ranks started by hand "
                 "leave it out: their gasloc store --elastic answers)")
      ->check(CLI::NonNegativeNumber);
  return [o]() {
    if (o->help_config) {
      std::cout << train::describe_job();
      return 0;
    }
    auto req = o->req;
    req.config_path = find_shipped(req.config_path);
    if (!o->init_from.empty()) {
      if (!req.resume_dir.empty())
        throw ConfigError("--init-from starts a new run from a checkpoint's weights; --resume continues a run",
                          "drop --init-from: the run's own checkpoint holds the weights it trained since");
      auto hf = train::hf_init_settings(o->init_from);
      req.overrides.insert(req.overrides.begin(), hf.begin(), hf.end());  // the user's --set come after, and win
    }
    if (req.config_path.empty() && req.resume_dir.empty() && req.overrides.empty() && o->device.empty() &&
        o->dtype.empty())
      throw ConfigError("gasloc train needs a job: --config FILE, --resume RUN, or --set options over the defaults",
                        "e.g. gasloc train --config configs/tiny.toml; see gasloc train --help and --help-config");
    if (!o->device.empty()) req.overrides.push_back("train.device=" + o->device);
    if (!o->dtype.empty()) req.overrides.push_back("train.dtype=" + o->dtype);
    const auto s = train::run_training(req);
    if (s.ended_before_join) return 0;
    if (s.interrupted || !std::isfinite(s.final_val_loss))
      fmt::print("stopped after {} step{}; checkpoint committed (run: {}; continue with `gasloc train --resume {}`)\n",
                 s.steps_done, s.steps_done == 1 ? "" : "s", s.run_dir, s.run_dir);
    else
      fmt::print("done after {} step{}: validation loss {:.4f} (run: {})\n", s.steps_done, s.steps_done == 1 ? "" : "s",
                 s.final_val_loss, s.run_dir);
    return s.interrupted ? 130 : 0;
  };
}

}  // namespace gasloc::app
