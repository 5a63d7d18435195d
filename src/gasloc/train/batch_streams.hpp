// One worker's forward and backward with its batch split into row groups ("streams"), each on a
// thread of its own with one BLAS thread (train.streams).
//
// Why: at the research preset's size (1M parameters) a step is many small products and
// element-wise passes. OpenBLAS splitting each small product over two threads gains little (its
// second thread mostly waits and yields), and everything else runs on one LibTorch thread, so one
// worker alone leaves most of a second core idle. Two half batches on two threads keep both
// cores busy with no hand-off inside an operation.
//
// The result is the full batch's mean loss and gradient: stream s computes the gradient of the
// mean loss of its B_s rows, scaled by B_s / B, and the streams' gradients are added into the
// parameters' .grad in stream order once all have finished, so a run is deterministic for a given
// train.streams, whichever thread finishes first. It is not the same bits as train.streams = 1
// (the products sum the batch's rows in another order), which tests/test_batch_streams.cpp bounds.
#pragma once
#include <torch/torch.h>

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gasloc/data/sampler.hpp"
#include "gasloc/model/llama.hpp"

namespace gasloc::train {

class BatchStreams {
 public:
  // `streams` - 1 helper threads, started here and kept (the fused LM head's workspace is per
  // thread: fresh threads would fault it in again on every step). 1 = everything inline.
  explicit BatchStreams(int streams);
  ~BatchStreams();
  BatchStreams(const BatchStreams&) = delete;
  BatchStreams& operator=(const BatchStreams&) = delete;

  int streams() const { return streams_; }
  // Forward and backward of inputs/targets [B, T] (B divisible by streams()): returns the mean
  // loss over the batch, with its gradient added into the model's parameters' .grad. Computes
  // under `dtype` autocast on `device` in every stream. An error in any stream is rethrown here,
  // after every stream has finished.
  double loss_backward(model::Llama& m, const torch::Tensor& inputs, const torch::Tensor& targets,
                       const torch::Device& device, const std::string& dtype);
  // Mean loss over whole batches, without gradients, in fp32 (evaluation): stream s computes
  // batches s, s + streams(), ... and the losses are summed in batch order, so the result has the
  // same bits as computing the batches one after another on one thread.
  double mean_loss(model::Llama& m, const std::vector<data::Batch>& batches, const torch::Device& device);

 private:
  void helper_main(int index);
  // Runs task(s) for s in [0, streams): 0 on the calling thread, the rest on the helpers.
  void run_all(const std::function<void(int)>& task);

  int streams_;
  std::vector<std::thread> helpers_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  const std::function<void(int)>* task_ = nullptr;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stopping_ = false;
  std::vector<std::exception_ptr> errors_;
};

}  // namespace gasloc::train
