// The inner optimizers optim.name selects, one entry each: which [optim] settings an optimizer
// reads and how it is built. OptimSection's validation, its --help-config text and
// make_optimizer read this table; adding an optimizer is adding an entry (optimizers.cpp).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "gasloc/core/choice.hpp"
#include "gasloc/core/flat_params.hpp"
#include "gasloc/optim/gpa.hpp"
#include "gasloc/optim/optimizer.hpp"

namespace gasloc::train {

struct OptimSection;

struct OptimizerEntry {
  std::string name;
  std::string doc;
  bool averages = false;  // the model is an average x of the iterates (optim.decay_on applies)
  bool uses_mu = false;   // reads optim.mu_x and optim.mu_y (and optim.gpa_from_diloco sets them)
  std::unique_ptr<optim::Optimizer> (*make)(const OptimSection&, FlatParams&) = nullptr;
};

// Every optimizer, in the order --help-config lists them.
const std::vector<OptimizerEntry>& optimizers();
// The entry named `name`; ConfigError listing the valid names otherwise.
const OptimizerEntry& optimizer(const std::string& name);
// The names of optimizers(), for optim.name.
const config::Choices& optimizer_choices();
// "gpa, schedule_free": the optimizers for which `flag` is set.
std::string optimizer_names(bool OptimizerEntry::*flag);

// The AdamW and GPA settings of an [optim] section (the GPA ones are checked in validate()).
optim::AdamWOptions adamw_options(const OptimSection& cfg);
optim::GpaOptions gpa_options(const OptimSection& cfg);
// The inner optimizer named by optim.name over `params`.
std::unique_ptr<optim::Optimizer> make_optimizer(const OptimSection& cfg, FlatParams& params);

}  // namespace gasloc::train
