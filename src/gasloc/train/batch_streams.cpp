#include "gasloc/train/batch_streams.hpp"

#include "gasloc/core/error.hpp"
#include "gasloc/train/worker.hpp"

namespace gasloc::train {

BatchStreams::BatchStreams(int streams) : streams_(streams), errors_(static_cast<size_t>(std::max(streams, 1))) {
  if (streams < 1) throw ConfigError("train.streams must be >= 1, not " + std::to_string(streams));
  for (int i = 1; i < streams; ++i) helpers_.emplace_back([this, i] { helper_main(i); });
}

BatchStreams::~BatchStreams() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (auto& t : helpers_) t.join();
}

void BatchStreams::helper_main(int index) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int)>* task = nullptr;
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      task = task_;
    }
    try {
      (*task)(index);
    } catch (...) {
      errors_[index] = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) done_.notify_one();
    }
  }
}

void BatchStreams::run_all(const std::function<void(int)>& task) {
  for (auto& e : errors_) e = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    task_ = &task;
    pending_ = streams_ - 1;
    ++generation_;
  }
  wake_.notify_all();
  try {
    task(0);
  } catch (...) {
    errors_[0] = std::current_exception();
  }
  {
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [&] { return pending_ == 0; });
    task_ = nullptr;
  }
  for (auto& e : errors_)
    if (e) std::rethrow_exception(e);
}

double BatchStreams::loss_backward(model::Llama& m, const torch::Tensor& inputs, const torch::Tensor& targets,
                                   const torch::Device& device, const std::string& dtype) {
  const int64_t B = inputs.size(0);
  if (B % streams_ != 0)
    throw ConfigError("a batch of " + std::to_string(B) + " rows does not split into train.streams = " +
                          std::to_string(streams_) + " equal parts",
                      "choose train.streams dividing data.batch_size");
  const int64_t rows = B / streams_;
  // B_s / B, exact in fp32 for the power-of-two splits that matter (1/2, 1/4).
  const double weight = 1.0 / static_cast<double>(streams_);
  const std::vector<torch::Tensor> params = m->parameters();
  std::vector<double> losses(static_cast<size_t>(streams_), 0.0);
  std::vector<std::vector<torch::Tensor>> grads(static_cast<size_t>(streams_));
  run_all([&](int s) {
    AutocastGuard autocast(device, dtype);  // autocast state is per thread
    const auto x = inputs.narrow(0, s * rows, rows).to(device), y = targets.narrow(0, s * rows, rows).to(device);
    auto loss = m->loss(x, y);
    losses[static_cast<size_t>(s)] = loss.item<double>();
    grads[static_cast<size_t>(s)] = torch::autograd::grad({loss}, params, {torch::full({}, weight, loss.options())},
                                                          /*retain_graph=*/false, /*create_graph=*/false, /*allow_unused=*/true);
  });
  // Summed in stream order, not as the threads finish: the same bits on every run.
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    torch::Tensor p = params[i];
    for (const auto& g : grads)
      if (g[i].defined()) {
        if (p.grad().defined()) p.mutable_grad().add_(g[i]);
        else p.mutable_grad() = g[i].clone();
      }
  }
  double total = 0;
  for (double l : losses) total += weight * l;
  return total;
}

double BatchStreams::mean_loss(model::Llama& m, const std::vector<data::Batch>& batches, const torch::Device& device) {
  std::vector<double> losses(batches.size(), 0.0);
  run_all([&](int s) {
    torch::NoGradGuard no_grad;  // per thread, like autocast
    for (size_t i = static_cast<size_t>(s); i < batches.size(); i += static_cast<size_t>(streams_))
      losses[i] = m->loss(batches[i].inputs.to(device), batches[i].targets.to(device)).item<double>();
  });
  double total = 0.0;
  for (double l : losses) total += l;
  return batches.empty() ? 0.0 : total / static_cast<double>(batches.size());
}

}  // namespace gasloc::train
