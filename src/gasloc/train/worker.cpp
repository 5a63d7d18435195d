#include "gasloc/train/worker.hpp"

#include <ATen/autocast_mode.h>
#include <fmt/format.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <chrono>
#include <cmath>
#include <optional>

#include "gasloc/algo/registry.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/model/fused.hpp"
#include "gasloc/model/hf_export.hpp"
#include "gasloc/train/compute_gate.hpp"

namespace gasloc::train {

AutocastGuard::AutocastGuard(torch::Device device, const std::string& dtype) {
  if (dtype != "bf16") return;
  enabled_ = true;
  cuda_ = device.is_cuda();
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  // 2.4+: one API per device type; the per-device names below warn there as deprecated.
  const auto type = cuda_ ? at::kCUDA : at::kCPU;
  prev_ = at::autocast::is_autocast_enabled(type);
  at::autocast::set_autocast_dtype(type, at::kBFloat16);
  at::autocast::set_autocast_enabled(type, true);
#else
  if (cuda_) {
    prev_ = at::autocast::is_enabled();
    at::autocast::set_autocast_gpu_dtype(at::kBFloat16);
    at::autocast::set_enabled(true);
  } else {
    prev_ = at::autocast::is_cpu_enabled();
    at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
    at::autocast::set_cpu_enabled(true);
  }
#endif
}

AutocastGuard::~AutocastGuard() {
  if (!enabled_) return;
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  at::autocast::set_autocast_enabled(cuda_ ? at::kCUDA : at::kCPU, prev_);
#else
  if (cuda_) at::autocast::set_enabled(prev_);
  else at::autocast::set_cpu_enabled(prev_);
#endif
  at::autocast::clear_cache();
}

Worker::Worker(const JobConfig& job, const model::LlamaConfig& model_cfg, const data::Dataset& dataset,
               comm::Communicator& comm, std::unique_ptr<algo::Synchronizer> sync)
    : job_(job), model_cfg_(model_cfg), comm_(comm), sync_(std::move(sync)), device_(job.train.device) {
  if (device_.is_cuda() && !torch::cuda::is_available())
    throw ConfigError("train.device = cuda but no CUDA device is available to this LibTorch",
                      "use --device cpu, or build against a CUDA LibTorch (scripts/gpu_check.sh)");
  if (job_.train.dtype == "bf16" && !device_.is_cuda()) model::fused::warn_if_emulated_bf16();
  model_ = model::Llama(model_cfg_);
  model_->init_weights(job_.train.seed);  // every worker starts from the same weights
  if (!job_.model.init_from.empty()) model::import_hf(job_.model.init_from, model_);
  model_->to(device_);
  params_ = FlatParams(model_->hf_parameters());
  optimizer_ = make_optimizer(job_.optim, params_);
  schedule_.lr = job_.optim.lr;
  schedule_.warmup_steps = job_.optim.warmup_steps;
  schedule_.total_steps = job_.train.steps;
  schedule_.min_lr_ratio = job_.optim.min_lr_ratio;
  schedule_.decay = job_.optim.decay;
  sync_->attach(optimizer_.get());
  sync_->init(params_);
  if (job_.train.streams > 1) streams_ = std::make_unique<BatchStreams>(static_cast<int>(job_.train.streams));
  // Disjoint sampling gives each rank its own slice of the stream: the heterogeneous-data setting.
  const data::TokenRange range = job_.data.sampling == "disjoint"
                                     ? data::slice_of(dataset.train->size(), comm_.rank(), comm_.world())
                                     : data::TokenRange{0, dataset.train->size()};
  sampler_ = std::make_unique<data::WindowSampler>(dataset.train, job_.data.batch_size, job_.data.seq_len,
                                                   job_.train.seed + static_cast<uint64_t>(comm_.rank()), range);
  max_loss_ = job_.train.divergence_factor * std::log(static_cast<double>(model_cfg_.vocab_size));
}

namespace {
// Marks a worker as inside step() for the scope, so that an evaluation from another thread is
// refused instead of reading half-updated parameters.
struct SteppingFlag {
  std::atomic<bool>& flag;
  explicit SteppingFlag(std::atomic<bool>& f) : flag(f) { flag.store(true); }
  ~SteppingFlag() { flag.store(false); }
};
}  // namespace

StepResult Worker::step() {
  SteppingFlag busy(stepping_);
  StepResult r;
  const int64_t k = ++step_;
  r.lr = schedule_.at(k);  // the schedule follows the step count, computed or not
  if (!sync_->wants_compute(k, comm_)) {
    r.computed = false;
    r.loss = last_loss_;
    r.round_done = sync_->after_step(k, params_, comm_);
    finish_if_last(k, r);
    after_round(r);
    return r;
  }
  // Wall time of the compute alone: after_backward may communicate (allreduce, dadam).
  auto t0 = std::chrono::steady_clock::now();
  auto lap = [&] {
    const auto t = std::chrono::steady_clock::now();
    compute_wall_s_ += std::chrono::duration<double>(t - t0).count();
    t0 = t;
  };
  // The compute holds a slot of the cores, in one piece (the step's tensors stay in cache); an
  // algorithm that communicates every step (allreduce, dadam: after_backward) lets it go around
  // that exchange (a holder waiting for a peer that waits for a slot would never return).
  const bool grads_leave = !algo::algorithm(job_.algo.name.str()).has_rounds;
  std::optional<ComputeGate::Slot> slot(std::in_place, gate_, comm_.now(), comm_.rank());
  data::Batch batch = sampler_->next();
  params_.zero_grad();
  // Checked before anything is sent: a diverged worker must stop itself, not contaminate its
  // peers and then see them blamed.
  auto check_diverged = [&] {
    if (!std::isfinite(r.loss) || (max_loss_ > 0 && r.loss > max_loss_))
      throw_diverged(k, std::isfinite(r.loss)
                            ? fmt::format("worker {} diverged at step {}: training loss {:.4g} exceeds {:g} x ln(vocab {}) "
                                          "= {:.2f} (train.divergence_factor)",
                                          comm_.rank(), k, r.loss, job_.train.divergence_factor, model_cfg_.vocab_size,
                                          max_loss_)
                            : fmt::format("worker {} diverged at step {}: training loss is {}", comm_.rank(), k, r.loss));
  };
  if (streams_) {
    r.loss = streams_->loss_backward(model_, batch.inputs, batch.targets, device_, job_.train.dtype);
    check_diverged();
  } else {
    AutocastGuard autocast(device_, job_.train.dtype);
    auto loss = model_->loss(batch.inputs.to(device_), batch.targets.to(device_));
    r.loss = loss.item<double>();
    check_diverged();
    loss.backward();
  }
  lap();
  if (grads_leave) slot.reset();
  sync_->after_backward(k, params_, comm_);
  if (grads_leave) slot.emplace(gate_, comm_.now(), comm_.rank());
  t0 = std::chrono::steady_clock::now();
  r.grad_norm = optim::clip_grad_norm(params_.grad(), job_.optim.grad_clip);
  optimizer_->step(r.lr);
  lap();
  slot.reset();
  comm_.compute(1);
  last_loss_ = r.loss;
  r.round_done = sync_->after_step(k, params_, comm_);
  finish_if_last(k, r);
  after_round(r);
  return r;
}

void Worker::finish_if_last(int64_t step, StepResult& r) {
  // An overlapped round still in flight at the run's last step lands now: the final model has it.
  if (step == job_.train.steps && sync_->flush(params_, comm_)) r.round_done = true;
}

void Worker::throw_diverged(int64_t step, const std::string& what) const {
  // Right after a mix in which a peer's message stood out, that message is the likelier cause,
  // not the step size: its sender is named.
  const auto s = sync_->message_suspect();
  if (!s || merged_at_ < 0 || step - merged_at_ > 1 + job_.algo.overlap_steps)
    throw TrainingDiverged(what, "lower optim.lr or raise optim.warmup_steps");
  const std::string how = s->poison != 1.0 ? fmt::format("was scaled by {:g} (faults.poison)", s->poison)
                                           : fmt::format("had values {:.3g} times this worker's largest", s->ratio);
  throw TrainingDiverged(
      fmt::format("{}, right after the mix of round {}, whose message from worker {} {}", what, s->round, s->sender, how),
      fmt::format("worker {} sent it: {}; algo.clip_peers = true bounds what one peer's message can move a worker",
                  s->sender,
                  s->poison != 1.0 ? "remove its faults.poison entry to run without that fault"
                                   : "find why (its own log), and restart it from its last checkpoint"));
}

void Worker::after_round(StepResult& r) {
  if (r.round_done) merged_at_ = step_;
  const auto view = sync_->take_ended_view();
  if (!view) return;
  if (auto plan = algo::heal_plan(*view, comm_.rank())) heal(*plan);
  if (!view->dying.empty() || !view->joining.empty() || !view->left.empty()) r.view_change = *view;
}

namespace {
// A state dict as one byte tensor, its tensors in key order; unpack reads it back in the shapes
// and dtypes of `like` (a worker of the same job holds the same keys and shapes).
torch::Tensor pack(const StateDict& s) {
  std::vector<torch::Tensor> bytes;
  for (const auto& [k, t] : s) bytes.push_back(t.detach().contiguous().reshape({-1}).view(torch::kUInt8));
  return torch::cat(bytes);
}

StateDict unpack(const torch::Tensor& packed, const StateDict& like) {
  StateDict out;
  int64_t at = 0;
  for (const auto& [k, t] : like) {
    const int64_t n = t.numel() * static_cast<int64_t>(t.element_size());
    if (at + n > packed.numel())
      throw CommError("heal: the donor's state is shorter than this worker's", "donor and joiner must run the same job");
    out[k] = packed.narrow(0, at, n).clone().view(t.scalar_type()).reshape(t.sizes());
    at += n;
  }
  if (at != packed.numel()) throw CommError("heal: the donor's state is longer than this worker's", "donor and joiner must run the same job");
  return out;
}
}  // namespace

bool Worker::heal(const algo::HealPlan& plan) {
  // Every worker calls the transfer (the in-process backend matches calls by order); only donors
  // and joiners list peers and pack their state.
  StateDict mine = plan.peers.empty() ? StateDict{} : state();
  // The synchronizer's Mix says which of its keys a joiner receives (the codec's own state
  // stays with its sender; the state the job shares goes, a placeholder where the donor has none).
  if (!plan.peers.empty()) sync_->keep_for_joiner(mine, "sync.", params_.numel());
  std::vector<torch::Tensor> recv;
  comm_.exchange(plan.peers, plan.peers.empty() ? torch::Tensor() : pack(mine), recv);
  if (!plan.receives) return true;
  if (!recv.at(0).defined()) return false;
  StateDict donor = unpack(recv.at(0), mine);
  donor["rng.cpu"] = mine.at("rng.cpu");
  load_state(donor);
  return true;
}

double Worker::evaluate(const std::vector<data::Batch>& batches) {
  if (stepping_.load())
    throw Error("evaluation requested while worker " + std::to_string(comm_.rank()) + " is in a training step",
                "evaluate between steps (the trainer does); a training step must finish first");
  const ComputeGate::Slot slot(gate_, comm_.now(), comm_.rank());
  optim::EvalScope at_x(optimizer_.get());
  if (streams_) return streams_->mean_loss(model_, batches, device_);  // the same bits, the batches spread over the streams
  torch::NoGradGuard no_grad;
  double total = 0.0;
  for (const auto& b : batches) total += model_->loss(b.inputs.to(device_), b.targets.to(device_)).item<double>();
  return batches.empty() ? 0.0 : total / static_cast<double>(batches.size());
}

int64_t Worker::sync_state_bytes() const {
  int64_t bytes = 0;
  for (const auto& [k, t] : sync_->state()) bytes += t.numel() * static_cast<int64_t>(t.element_size());
  return bytes;
}

StateDict Worker::state() {
  // Inside the caller's EvalScope the tensors may alias the live buffers (no copy of the model);
  // when this call does the switch itself, they are copied before it switches back.
  const bool own_switch = !optimizer_->in_eval();
  auto keep = [&](const torch::Tensor& t) { return own_switch ? t.clone() : t; };
  sync_->settle(comm_);  // an overlapped exchange in flight: its result goes into the state
  optim::EvalScope at_x(optimizer_.get());
  StateDict s;
  s["params"] = keep(params_.data());
  for (const auto& [k, v] : optimizer_->state()) s["optim." + k] = keep(v);
  s["worker.step"] = torch::tensor(step_, torch::kInt64);
  s["worker.last_loss"] = torch::tensor(last_loss_, torch::kFloat64);
  s["sampler.position"] = torch::tensor(static_cast<int64_t>(sampler_->position()), torch::kInt64);
  at::Generator gen = at::detail::getDefaultCPUGenerator();  // shared handle
  s["rng.cpu"] = gen.get_state();
  for (const auto& [k, v] : sync_->state()) s["sync." + k] = v;
  return s;
}

void Worker::load_state(const StateDict& s) {
  auto get = [&](const std::string& key) -> const torch::Tensor& {
    auto it = s.find(key);
    if (it == s.end()) throw CheckpointError("checkpoint has no '" + key + "'", "it was written by another optimizer or an older gasloc");
    return it->second;
  };
  const auto& p = get("params");
  if (p.numel() != params_.numel())
    throw CheckpointError("checkpoint holds " + std::to_string(p.numel()) + " parameters but this model has " +
                              std::to_string(params_.numel()),
                          "the checkpoint is from a different model shape; resume with the same [model] settings");
  torch::NoGradGuard no_grad;
  params_.data().copy_(p);  // the evaluation point x; load_state returns the optimizer to training
  optim::TensorMap optim_state;
  for (const auto& [k, v] : s)
    if (k.rfind("optim.", 0) == 0) optim_state[k.substr(6)] = v;
  optimizer_->load_state(optim_state);
  // Checkpoints from before local-step budgets computed every step.
  step_ = s.count("worker.step") ? s.at("worker.step").item<int64_t>() : optimizer_->steps();
  last_loss_ = s.count("worker.last_loss") ? s.at("worker.last_loss").item<double>() : 0.0;
  sampler_->set_position(static_cast<uint64_t>(get("sampler.position").item<int64_t>()));
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  gen.set_state(get("rng.cpu"));
  algo::StateDict sync_state;
  for (const auto& [k, v] : s)
    if (k.rfind("sync.", 0) == 0) sync_state[k.substr(5)] = v;
  sync_->load_state(sync_state);
}

}  // namespace gasloc::train
