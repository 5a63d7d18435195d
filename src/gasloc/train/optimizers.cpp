#include "gasloc/train/optimizers.hpp"

#include "gasloc/optim/adamw.hpp"
#include "gasloc/train/job_config.hpp"

namespace gasloc::train {

namespace {
using Made = std::unique_ptr<optim::Optimizer>;
}  // namespace

const std::vector<OptimizerEntry>& optimizers() {
  static const std::vector<OptimizerEntry> table = {
      {.name = "adamw", .doc = "",
       .make = [](const OptimSection& c, FlatParams& p) -> Made { return std::make_unique<optim::AdamW>(p, adamw_options(c)); }},
      {.name = "gpa", .doc = "Generalized Primal Averaging", .averages = true, .uses_mu = true,
       .make = [](const OptimSection& c, FlatParams& p) -> Made { return std::make_unique<optim::Gpa>(p, gpa_options(c)); }},
      {.name = "schedule_free", .doc = "the reference Schedule-Free AdamW", .averages = true,
       .make = [](const OptimSection& c, FlatParams& p) -> Made {
         auto g = gpa_options(c);
         g.schedule_free = true;
         return std::make_unique<optim::Gpa>(p, g);
       }},
  };
  return table;
}

const config::Choices& optimizer_choices() {
  static const config::Choices c = config::choices_of("optimizer", optimizers());
  return c;
}

const OptimizerEntry& optimizer(const std::string& name) { return optimizers().at(optimizer_choices().index(name)); }

std::string optimizer_names(bool OptimizerEntry::*flag) { return config::names_where(optimizers(), flag); }

optim::AdamWOptions adamw_options(const OptimSection& cfg) {
  optim::AdamWOptions adam;
  adam.beta1 = cfg.beta1;
  adam.beta2 = cfg.beta2;
  adam.eps = cfg.eps;
  adam.weight_decay = cfg.weight_decay;
  return adam;
}

optim::GpaOptions gpa_options(const OptimSection& cfg) {
  optim::GpaOptions g;
  g.adam = adamw_options(cfg);
  g.mu_y = cfg.mu_y;
  g.mu_x = cfg.mu_x;
  g.decay_on_y = cfg.decay_on == "y";
  return g;
}

std::unique_ptr<optim::Optimizer> make_optimizer(const OptimSection& cfg, FlatParams& params) {
  return optimizer(cfg.name).make(cfg, params);
}

}  // namespace gasloc::train
