#include "gasloc/train/meeting.hpp"

#include <fmt/format.h>
#include <torch/torch.h>

#include <chrono>
#include <limits>

#include "gasloc/core/error.hpp"

namespace gasloc::train {

ThreadMeeting::ThreadMeeting(std::vector<Worker*> workers, const std::vector<data::Batch>* val, double timeout_s)
    : workers_(std::move(workers)), val_(val), timeout_s_(timeout_s) {}

void ThreadMeeting::wait_all(const std::function<void()>& last) {
  std::unique_lock<std::mutex> lock(mu_);
  if (failed_) throw CommError("evaluation: " + why_);
  const int64_t gen = generation_;
  if (++arrived_ == static_cast<int>(workers_.size())) {
    // The others wait for this generation to end, so the last arrival may touch every worker.
    try {
      last();
    } catch (const std::exception& e) {
      failed_ = true;
      why_ = e.what();
    }
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
    if (failed_) throw CommError("evaluation: " + why_);
    return;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s_);
  while (generation_ == gen && !failed_) {
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && generation_ == gen && !failed_)
      throw CommError(fmt::format("evaluation: timed out after {} s waiting for the other workers", timeout_s_),
                      "a worker is stuck or much slower; raise cluster.timeout_s");
  }
  if (failed_ && generation_ == gen) throw CommError("evaluation: " + why_);
}

void ThreadMeeting::fail(const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!failed_) why_ = why;
  failed_ = true;
  cv_.notify_all();
}

EvalResult ThreadMeeting::evaluate(int, Worker&, int64_t) {
  wait_all([this] {
    torch::NoGradGuard no_grad;
    const size_t n = workers_.size();
    EvalResult r;
    auto avg = workers_[0]->params().data().clone();
    for (size_t i = 1; i < n; ++i) avg.add_(workers_[i]->params().data());  // rank order
    avg.div_(static_cast<double>(n));
    for (size_t i = 0; i < n; ++i) {
      r.consensus_distance += (workers_[i]->params().data() - avg).pow(2).sum().item<double>() / static_cast<double>(n);
      r.worker_val_loss.push_back(workers_[i]->evaluate(*val_));
    }
    if (n == 1) {
      r.val_loss = r.worker_val_loss[0];
    } else {  // borrow worker 0's model for the average, then put its own parameters back
      auto own = workers_[0]->params().data().clone();
      workers_[0]->params().data().copy_(avg);
      r.val_loss = workers_[0]->evaluate(*val_);
      workers_[0]->params().data().copy_(own);
    }
    for (auto* w : workers_) r.virtual_time_s = std::max(r.virtual_time_s, w->clock());
    result_ = r;
  });
  std::lock_guard<std::mutex> lock(mu_);
  return result_;
}

bool ThreadMeeting::should_stop(int, int64_t step, bool stop_requested) {
  std::lock_guard<std::mutex> lock(mu_);
  // Every rank's last check was at a step <= max_step_; those that passed max_step_ already
  // found no stop and will check again at max_step_ + 1, so that is where all can stop together.
  max_step_ = std::max(max_step_, step);
  if (stop_requested && stop_step_ < 0) stop_step_ = workers_.size() == 1 ? max_step_ : max_step_ + 1;
  return stop_step_ >= 0 && step >= stop_step_;
}

// ---------------------------------------------------------------------------------------------

CommMeeting::CommMeeting(comm::Communicator& comm, const std::vector<data::Batch>* val, int64_t check_every)
    : comm_(comm), val_(val), check_every_(check_every) {}

EvalResult CommMeeting::evaluate(int, Worker& worker, int64_t) {
  torch::NoGradGuard no_grad;
  const int64_t before = comm_.stats().bytes_sent;
  EvalResult r;
  const double own_loss = worker.evaluate(*val_);
  auto& phi = worker.params().data();
  auto avg = phi.clone();
  comm_.all_reduce_mean(avg);
  auto scalars = torch::tensor({(phi - avg).pow(2).sum().item<double>(), own_loss}, torch::kFloat64);
  comm_.all_reduce_mean(scalars);
  r.consensus_distance = scalars[0].item<double>();
  r.worker_val_loss = {own_loss};
  auto own = phi.clone();
  phi.copy_(avg);
  r.val_loss = worker.evaluate(*val_);
  phi.copy_(own);
  own_bytes_ += comm_.stats().bytes_sent - before;
  r.virtual_time_s = comm_.now();
  return r;
}

bool CommMeeting::should_stop(int, int64_t step, bool stop_requested) {
  // Processes see Ctrl+C at slightly different steps; they agree at fixed steps instead.
  if (comm_.world() == 1) return stop_requested;
  if (step % check_every_ != 0) return false;
  const int64_t before = comm_.stats().bytes_sent;
  auto flag = torch::tensor({stop_requested ? 1.0f : 0.0f});
  comm_.all_reduce_mean(flag);
  own_bytes_ += comm_.stats().bytes_sent - before;
  return flag.item<float>() > 0.0f;
}

}  // namespace gasloc::train
