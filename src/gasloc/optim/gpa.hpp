// GPA-AdamW (Generalized Primal Averaging) and Schedule-Free AdamW, docs/design.md section 3.
//
// Three sequences: gradients are taken at y = mu_y*x + (1-mu_y)*z; z takes AdamW's step
// z <- z - lr*d; the model is the average x <- mu_x*x + (1-mu_x)*z. Memory-efficient form: the
// flat buffer holds y, one extra buffer holds z, plus Adam's m and v (one parameter-sized buffer
// more than AdamW). With c = 1 - mu_x each step is
//
//   [z *= 1 - lr*wd]                      decoupled decay on z (default; or d += wd*y)
//   y = (1-c)*y + c*z;  y += lr*(mu_y*(1-c) - 1)*d;  z -= lr*d
//
// Evaluation mode puts x = lerp(y, z, 1 - 1/mu_y) in the buffer and keeps a copy of y (a
// temporary: outside evaluation the state is y, z, m, v). Back in training mode, delta = (the
// buffer now) - x moves y and z together: y = y + delta, z = z + delta. When nothing replaced x
// (an evaluation, a checkpoint) delta is exactly zero and y and z come back bit for bit, so
// evaluating never perturbs training. When a synchronizer replaced x by an average with other
// workers, the three sequences are translated together: y stays between x and z and the
// optimizer's direction of travel z - x is unchanged.
//
// Checkpoints (taken in evaluation mode) hold x as the parameters, and z and y: y is redundant
// in exact arithmetic but not in floating point, and keeping it makes resume bit-exact.
//
// Schedule-Free is the reference Schedule-Free AdamW (facebookresearch/schedule_free,
// adamw_schedulefree_reference.py), in the same memory-efficient form. It keeps no first moment:
// beta1 (optim.beta1) is the interpolation weight, y = beta1*x + (1-beta1)*z, and each step is
//
//   v = b2*v + (1-b2)*g^2;  lr_t = lr * sqrt(1 - b2^k);  d = g / (sqrt(v) + eps)
//   lr_max = max(lr_max, lr_t);  w = lr_max^2;  c = w / sum_{s<=k} w_s   (c = 0 while sum w = 0)
//   decay at y: d += wd*y;  decay at z: y -= (1-beta1)*lr_t*wd*z, z *= 1 - lr_t*wd
//   y = (1-c)*y + c*z;  y += lr_t*(beta1*(1-c) - 1)*d;  z -= lr_t*d
//
// (the y correction under decay at z keeps the implied x where the reference's explicit x is).
// State: v and z (the same 8 bytes per parameter as AdamW), and the two scalars.
#pragma once
#include "gasloc/optim/adamw.hpp"

namespace gasloc::optim {

struct GpaOptions {
  AdamWOptions adam;
  double mu_y = 0.7;            // gpa's gradient point: y = mu_y*x + (1-mu_y)*z, in (0, 1] (schedule_free: adam.beta1)
  double mu_x = 0.9967;         // evaluation average: x <- mu_x*x + (1-mu_x)*z, in [0, 1]
  bool decay_on_y = false;      // weight decay from y (Schedule-Free's choice) instead of on z
  bool schedule_free = false;   // the reference Schedule-Free AdamW instead of GPA (mu_x, mu_y unused)
  // The ranges of mu_x and mu_y (ConfigError naming optim.mu_x / optim.mu_y); job validation
  // and the GPA constructor both call this.
  void validate() const;
};

class Gpa final : public Optimizer {
 public:
  Gpa(FlatParams& params, GpaOptions opts);
  std::string name() const override { return opts_.schedule_free ? "schedule_free" : "gpa"; }
  const GpaOptions& options() const { return opts_; }
  // Only for tests and reports.
  const torch::Tensor& z_buffer() const { return z_; }
  // The averaging weight c of the last step (1 - mu_x for GPA).
  double last_c() const { return last_c_; }
  // Where gradients are taken between x and z: mu_y, or beta1 for Schedule-Free.
  double interpolation() const { return opts_.schedule_free ? opts_.adam.beta1 : opts_.mu_y; }

 protected:
  void update(double lr) override;
  void to_eval() override;
  void to_train() override;
  std::vector<std::pair<std::string, torch::Tensor*>> buffers() override;
  TensorMap extra_state() const override;
  void load_extra_state(const TensorMap& s) override;
  std::vector<std::string> extra_keys() const override;

 private:
  void update_schedule_free(double lr);

  GpaOptions opts_;
  AdamMoments moments_;  // GPA: m and v; Schedule-Free: v only (m left undefined)
  torch::Tensor z_;
  torch::Tensor y_saved_;  // defined in evaluation mode only
  double lr_max_ = 0.0, weight_sum_ = 0.0;  // Schedule-Free's averaging weights
  double last_c_ = 0.0;
};

}  // namespace gasloc::optim
