#include "gasloc/train/meeting.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <limits>

namespace gasloc::train {

namespace {
// Every rank's `mine` (same shape everywhere), exactly: each rank broadcasts in turn. An
// all-reduce of rows would round them (mean times world is not the identity in floating point).
std::vector<torch::Tensor> gather(comm::Communicator& c, const torch::Tensor& mine) {
  std::vector<torch::Tensor> all(static_cast<size_t>(c.world()));
  for (int root = 0; root < c.world(); ++root) {
    all[root] = root == c.rank() ? mine.clone() : torch::empty_like(mine);
    c.broadcast(all[root], root);
  }
  return all;
}
}  // namespace

Meeting::Meeting(const std::vector<data::Batch>* val, int local_ranks, int world, int64_t stop_check_every, bool local)
    : val_(val), one_process_(local_ranks == world), check_every_(stop_check_every), local_(local) {}

double eval_seconds(const comm::NetworkModel& network, int64_t params, int world) {
  std::vector<int> everyone(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) everyone[r] = r;
  const auto P = static_cast<double>(network.message_bytes(params * static_cast<int64_t>(sizeof(float))));
  return comm::members_allreduce_seconds(network, P, everyone);
}

EvalResult Meeting::evaluate(comm::Communicator& control, Worker& worker, int64_t step) {
  torch::NoGradGuard no_grad;
  const auto holders = worker.sync().holders();
  const bool elastic = holders.has_value();
  std::vector<int> members;
  if (elastic) members = *holders;
  else
    for (int r = 0; r < control.world(); ++r) members.push_back(r);
  EvalResult r = local_ ? evaluate_local(control, worker, members, step) : evaluate_average(control, worker, members, elastic);
  if (elastic && !(local_ && !one_process_)) r.members = members;
  return r;
}

EvalResult Meeting::evaluate_local(comm::Communicator& control, Worker& worker, const std::vector<int>& members, int64_t step) {
  const int me = control.rank();
  const bool holds = std::find(members.begin(), members.end(), me) != members.end();
  const std::optional<double> own = holds ? std::optional(worker.evaluate(*val_)) : std::nullopt;
  EvalResult r;
  r.consensus_distance = std::numeric_limits<double>::quiet_NaN();  // it needs the average model
  if (!one_process_) {
    r.reporter = me;
    r.reports = holds;
    r.members = {me};
    r.val_loss = own.value_or(r.consensus_distance);
    if (own) r.worker_val_loss = {*own};
    r.virtual_time_s = worker.clock();
    return r;
  }
  std::lock_guard<std::mutex> lock(mu_);
  LocalEval& e = local_evals_[step];
  if (e.loss.empty()) {
    e.loss.resize(static_cast<size_t>(control.world()));
    e.clock.resize(static_cast<size_t>(control.world()));
  }
  e.loss[me] = own;
  e.clock[me] = worker.clock();
  if (++e.arrived < control.world()) return r;
  // The last rank to arrive reports, summing in rank order so the mean's bits do not depend on who that is.
  r.reports = true;
  r.reporter = members.front();
  for (int i : members) {
    r.worker_val_loss.push_back(*e.loss[i]);
    r.val_loss += *e.loss[i];
    r.virtual_time_s = std::max(r.virtual_time_s, e.clock[i]);
  }
  r.val_loss /= static_cast<double>(members.size());
  local_evals_.erase(step);
  return r;
}

EvalResult Meeting::evaluate_average(comm::Communicator& control, Worker& worker, const std::vector<int>& members, bool elastic) {
  const bool holds = std::find(members.begin(), members.end(), control.rank()) != members.end();
  auto& phi = worker.params().data();
  torch::Tensor avg = holds ? phi.clone() : torch::Tensor();
  if (elastic) control.all_reduce_mean_over(avg, members, -1);  // nobody leaves at an evaluation: it completes
  else control.all_reduce_mean(avg);
  const double own_loss = holds ? worker.evaluate(*val_) : 0.0;
  const double own_distance = holds ? (phi - avg).pow(2).sum().item<double>() : 0.0;
  const auto all = gather(control, torch::tensor({own_loss, own_distance, worker.clock()}, torch::kFloat64));
  EvalResult r;
  r.reporter = members.front();
  r.reports = control.rank() == r.reporter;
  const auto k = static_cast<double>(members.size());
  for (int i : members) {  // rank order, so every rank computes the same bits
    const auto v = all[i].accessor<double, 1>();
    r.worker_val_loss.push_back(v[0]);
    r.consensus_distance += v[1] / k;
    r.virtual_time_s = std::max(r.virtual_time_s, v[2]);
  }
  if (control.world() == 1) {
    r.val_loss = own_loss;
    return r;
  }
  // The reporter borrows its model for the average, puts its own parameters back, and tells the others.
  auto loss = torch::zeros({1}, torch::kFloat64);
  if (control.rank() == r.reporter) {
    auto own = phi.clone();
    phi.copy_(avg);
    loss[0] = worker.evaluate(*val_);
    phi.copy_(own);
  }
  control.broadcast(loss, r.reporter);
  r.val_loss = loss[0].item<double>();
  return r;
}

bool Meeting::should_stop(comm::Communicator& control, int64_t step, bool stop_requested) {
  if (one_process_) {
    // The ranks are threads sharing this object. Every rank's last check was at a step <=
    // max_step_; those that passed max_step_ already found no stop and will check again at
    // max_step_ + 1, so that is where all can stop together.
    std::lock_guard<std::mutex> lock(mu_);
    max_step_ = std::max(max_step_, step);
    if (stop_requested && stop_step_ < 0) stop_step_ = control.world() == 1 ? max_step_ : max_step_ + 1;
    return stop_step_ >= 0 && step >= stop_step_;
  }
  // Processes see Ctrl+C at slightly different steps; they agree at fixed steps instead.
  if (step % check_every_ != 0) return false;
  auto flag = torch::tensor({stop_requested ? 1.0f : 0.0f});
  control.all_reduce_mean(flag);
  return flag.item<float>() > 0.0f;
}

}  // namespace gasloc::train
