// gasloc's own parts for a Python loop (docs/python.md, "gasloc's model, optimizers and data"):
// the C++ Llama, the inner optimizers over a flat buffer, the learning-rate schedule, and a
// prepared dataset's batches as the CLI trainer's sampler draws them. The Python modules
// gasloc.models, gasloc.optim and gasloc.data wrap these; a loop over them is the CLI trainer's
// worker step (train/worker.cpp) written in Python, and gives its bits (tests/python/test_parts.py).
//
// Settings cross as the job file's own "section.key=value" texts, parsed by job_from_json: the
// same defaults as `gasloc train`, the same validation, a ValueError naming a bad key.
#include "parts.hpp"

#include <pybind11/stl.h>
#include <torch/extension.h>

#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "gasloc/core/error.hpp"
#include "gasloc/core/flat_params.hpp"
#include "gasloc/data/dataset.hpp"
#include "gasloc/data/sampler.hpp"
#include "gasloc/model/llama.hpp"
#include "gasloc/optim/optimizer.hpp"
#include "gasloc/optim/schedule.hpp"
#include "gasloc/train/checkpoint.hpp"
#include "gasloc/train/job_config.hpp"
#include "gasloc/train/optimizers.hpp"
#include "gasloc/train/user_run.hpp"

namespace py = pybind11;
using namespace gasloc;

namespace {

using Named = std::vector<std::pair<std::string, at::Tensor>>;

// The job of `sets` over the defaults. data.seq_len is set low so that a model shape alone
// (model.max_seq_len below the default sequence) is not refused for a data setting it never uses.
train::JobConfig settings_job(std::vector<std::string> sets) {
  sets.insert(sets.begin(), "data.seq_len=1");
  return train::job_from_json(nlohmann::json::object(), sets);
}

// ---- the model ----

// gasloc's Llama as the CLI worker builds it: the preset's shape with the model.* settings, the
// dataset's vocabulary, and Llama's initialization from train.seed (Worker's constructor).
std::shared_ptr<model::LlamaImpl> make_llama(const std::vector<std::string>& sets, int64_t vocab_size) {
  const train::JobConfig job = settings_job(sets);
  if (!job.model.init_from.empty())
    throw ConfigError("model.init_from is not supported by gasloc.models.llama",
                      "load the weights with model.load_state_dict() after building the model");
  auto m = std::make_shared<model::LlamaImpl>(job.model.resolve(vocab_size));
  m->init_weights(job.train.seed);
  return m;
}

py::dict llama_config(const model::LlamaImpl& m) {
  const model::LlamaConfig& c = m.config();
  py::dict d;
  d["dim"] = c.dim;
  d["n_layers"] = c.n_layers;
  d["n_heads"] = c.n_heads;
  d["n_kv_heads"] = c.n_kv_heads;
  d["vocab_size"] = c.vocab_size;
  d["ffn_hidden"] = c.ffn_hidden();
  d["max_seq_len"] = c.max_seq_len;
  d["tie_embeddings"] = c.tie_embeddings;
  d["num_params"] = c.num_params();
  return d;
}

// ---- the inner optimizers ----

// One of gasloc's inner optimizers (optim.name) over a flat buffer: its own, made from the
// parameters handed in, until a gasloc.Run takes the parameters into the run's buffer and the
// optimizer moves there (bind). A step is the CLI worker's: the gradients gathered into the
// flat gradient buffer, clipped by their global norm (optim.grad_clip), and one fused update.
class PyOptimizer {
 public:
  PyOptimizer(const std::vector<std::string>& sets, const Named& params)
      : section_(settings_job(sets).optim), own_(std::make_unique<FlatParams>(checked(params))), flat_(own_.get()) {
    for (const auto& [name, p] : params) by_name_.emplace(name, p);
    opt_ = train::make_optimizer(section_, *flat_);
  }
  ~PyOptimizer() {
    if (run_) run_->attach_optimizer(nullptr);
  }
  PyOptimizer(const PyOptimizer&) = delete;
  PyOptimizer& operator=(const PyOptimizer&) = delete;

  // gasloc.Run took the parameters into its flat buffer: the optimizer steps that buffer from now
  // on, and the run's synchronizer reads the model at the optimizer's evaluation point (GPA's x),
  // as the CLI worker's does. Only before the first step: the state would not follow.
  void bind(train::UserRun& run, const Named& params) {
    if (opt_->steps() > 0)
      throw ConfigError("the optimizer already stepped", "create gasloc.Run before the optimizer's first step");
    by_name_.clear();
    for (const auto& [name, p] : params) by_name_.emplace(name, p);
    flat_ = &run.params();
    opt_ = train::make_optimizer(section_, *flat_);
    own_.reset();
    run_ = &run;
    run.attach_optimizer(opt_.get());
  }

  // The CLI worker's step after backward(): clip, then the update with `lr`. Returns the global
  // gradient norm before clipping.
  double step(double lr) {
    torch::NoGradGuard no_grad;
    gather_grads();
    const double norm = optim::clip_grad_norm(flat_->grad(), section_.grad_clip);
    opt_->step(lr);
    return norm;
  }

  // Zeroes the flat gradient buffer and binds every .grad to its view again (the CLI worker's
  // params_.zero_grad(); backward() then accumulates into the buffer in place).
  void zero_grad() {
    torch::NoGradGuard no_grad;
    flat_->zero_grad();
    for (const auto& seg : flat_->segments()) {
      at::Tensor& p = by_name_.at(seg.name);
      p.mutable_grad() = flat_->view(flat_->grad(), seg);
    }
  }

  // state_dict()'s tensors: the optimizer's state at its evaluation point (optim::Optimizer::state),
  // copied; load_state puts it back (GPA and Schedule-Free write their training point y).
  std::map<std::string, at::Tensor> state() {
    optim::EvalScope at_x(opt_.get());
    std::map<std::string, at::Tensor> out;
    for (const auto& [k, v] : opt_->state()) out[k] = v.clone();
    return out;
  }
  void load_state(const std::map<std::string, at::Tensor>& s) { opt_->load_state(s); }

  void enter_eval() { opt_->enter_eval(); }
  void leave_eval() { opt_->leave_eval(); }
  int64_t steps() const { return opt_->steps(); }
  double lr() const { return section_.lr; }
  std::string name() const { return opt_->name(); }
  at::Tensor flat() const { return flat_->data(); }

 private:
  // Checked before the flat buffer takes them (it would rebind a parameter of another dtype).
  static const Named& checked(const Named& params) {
    if (params.empty()) throw ConfigError("the optimizer got no parameters", "hand it model.parameters()");
    for (const auto& [name, p] : params)
      if (p.scalar_type() != torch::kFloat32 || p.device() != params.front().second.device())
        throw ConfigError("parameter '" + name + "' is not fp32 on the first parameter's device",
                          "gasloc's optimizers step one fp32 buffer on one device: model.float() and model.to(device)");
    return params;
  }

  // Gradients that backward() wrote outside the flat buffer (zero_grad(set_to_none=True), the
  // torch default, drops the views) are copied in and bound to their views again.
  void gather_grads() {
    for (const auto& seg : flat_->segments()) {
      at::Tensor& p = by_name_.at(seg.name);
      at::Tensor view = flat_->view(flat_->grad(), seg);
      const at::Tensor g = p.grad();
      if (g.defined() && g.data_ptr() == view.data_ptr()) continue;
      if (g.defined()) view.copy_(g);
      else view.zero_();
      p.mutable_grad() = view;
    }
  }

  train::OptimSection section_;
  std::unique_ptr<FlatParams> own_;
  FlatParams* flat_;
  std::unique_ptr<optim::Optimizer> opt_;
  std::unordered_map<std::string, at::Tensor> by_name_;
  train::UserRun* run_ = nullptr;
};

// The CLI worker's learning-rate schedule (optim.lr, warmup_steps, decay, min_lr_ratio) over
// `total_steps` (train.steps).
optim::Schedule make_schedule(const std::vector<std::string>& sets, int64_t total_steps) {
  if (total_steps < 1) throw ConfigError("total_steps must be at least 1", "give the number of steps the loop runs");
  const train::OptimSection o = settings_job(sets).optim;
  optim::Schedule s;
  s.lr = o.lr;
  s.warmup_steps = o.warmup_steps;
  s.total_steps = total_steps;
  s.min_lr_ratio = o.min_lr_ratio;
  s.decay = o.decay;
  return s;
}

// ---- the data ----

py::tuple batch_tuple(const data::Batch& b) { return py::make_tuple(b.inputs, b.targets); }

// A rank's sampler as the CLI worker makes it: seed train.seed (its default when none) + rank, and with
// data.sampling = "disjoint" the rank's own slice of the training stream.
std::unique_ptr<data::WindowSampler> make_sampler(const std::shared_ptr<data::Dataset>& ds, int rank, int world,
                                                  int64_t batch_size, int64_t seq_len, std::optional<uint64_t> seed,
                                                  const std::string& sampling) {
  if (world < 1 || rank < 0 || rank >= world)
    throw ConfigError("rank " + std::to_string(rank) + " of world " + std::to_string(world) + " does not exist",
                      "pass run.rank and run.world");
  if (sampling != "shared" && sampling != "disjoint")
    throw ConfigError("data.sampling = '" + sampling + "' is not one of: shared, disjoint", "use shared or disjoint");
  const data::TokenRange range = sampling == "disjoint" ? data::slice_of(ds->train->size(), rank, world)
                                                        : data::TokenRange{0, ds->train->size()};
  const uint64_t base = seed ? *seed : settings_job({}).train.seed;
  return std::make_unique<data::WindowSampler>(ds->train, batch_size, seq_len, base + static_cast<uint64_t>(rank), range);
}

}  // namespace

void bind_parts(py::module_& m) {
  // The run of a gasloc.Run, opaque: gasloc.optim's optimizers move onto its flat buffer.
  py::class_<train::UserRun>(m, "_UserRun");

  py::class_<model::LlamaImpl, std::shared_ptr<model::LlamaImpl>>(m, "_Llama")
      .def(py::init(&make_llama), py::arg("settings"), py::arg("vocab_size"))
      .def("forward", &model::LlamaImpl::forward, py::arg("tokens"))
      .def("loss", &model::LlamaImpl::loss, py::arg("inputs"), py::arg("targets"))
      .def("named_parameters", &model::LlamaImpl::hf_parameters,
           "the parameters in Hugging Face's names and the CLI trainer's order (the flat buffer's)")
      .def_property_readonly("config", &llama_config);

  py::class_<PyOptimizer>(m, "_Optimizer")
      .def(py::init<const std::vector<std::string>&, const Named&>(), py::arg("settings"), py::arg("params"))
      .def("bind", &PyOptimizer::bind, py::arg("run"), py::arg("params"))
      .def("step", &PyOptimizer::step, py::arg("lr"), py::call_guard<py::gil_scoped_release>())
      .def("zero_grad", &PyOptimizer::zero_grad, py::call_guard<py::gil_scoped_release>())
      .def("state", &PyOptimizer::state)
      .def("load_state", &PyOptimizer::load_state, py::arg("state"))
      .def("enter_eval", &PyOptimizer::enter_eval)
      .def("leave_eval", &PyOptimizer::leave_eval)
      .def_property_readonly("steps", &PyOptimizer::steps)
      .def_property_readonly("lr", &PyOptimizer::lr)
      .def_property_readonly("name", &PyOptimizer::name)
      .def_property_readonly("flat", &PyOptimizer::flat);

  py::class_<optim::Schedule>(m, "_Schedule")
      .def(py::init(&make_schedule), py::arg("settings"), py::arg("total_steps"))
      .def("at", &optim::Schedule::at, py::arg("step"));

  py::class_<data::Dataset, std::shared_ptr<data::Dataset>>(m, "_Dataset")
      .def(py::init([](const std::string& dir, int64_t vocab_size, bool verify) {
             return std::make_shared<data::Dataset>(data::Dataset::open(dir, vocab_size, verify));
           }),
           py::arg("dir"), py::arg("vocab_size"), py::arg("verify"))
      .def_property_readonly("dir", [](const data::Dataset& d) { return d.dir.string(); })
      .def_property_readonly("vocab_size", [](const data::Dataset& d) { return d.vocab_size; })
      .def_property_readonly("tokenizer", [](const data::Dataset& d) { return d.tokenizer_kind; })
      .def_property_readonly("train_tokens", [](const data::Dataset& d) { return d.train->size(); })
      .def_property_readonly("val_tokens", [](const data::Dataset& d) { return d.val->size(); })
      .def_property_readonly("fingerprint", [](const data::Dataset& d) { return d.fingerprint; })
      .def("validation",
           [](const data::Dataset& d, int64_t batch_size, int64_t seq_len, int64_t max_batches) {
             py::list out;
             for (const auto& b : data::validation_batches(*d.val, batch_size, seq_len, max_batches))
               out.append(batch_tuple(b));
             return out;
           },
           py::arg("batch_size"), py::arg("seq_len"), py::arg("max_batches"));

  py::class_<data::WindowSampler>(m, "_Sampler")
      .def(py::init(&make_sampler), py::arg("dataset"), py::arg("rank"), py::arg("world"), py::arg("batch_size"),
           py::arg("seq_len"), py::arg("seed"), py::arg("sampling"))
      .def("next", [](data::WindowSampler& s) { return batch_tuple(s.next()); })
      .def_property("position", &data::WindowSampler::position, &data::WindowSampler::set_position);

  // A checkpoint file of gasloc (the CLI trainer's or a gasloc.Run's): its meta as JSON text and its tensors.
  m.def("_load_checkpoint", [](const std::string& path) {
    train::Checkpoint c = train::load_checkpoint(path);
    return std::make_pair(c.meta.dump(), std::map<std::string, at::Tensor>(c.tensors.begin(), c.tensors.end()));
  }, py::arg("path"));
}
