// The all-reduce mix, plain and clipped; see all_reduce.hpp.
#include "gasloc/algo/mix/all_reduce.hpp"

#include <fmt/format.h>
#include <torch/torch.h>

#include "gasloc/algo/mix/gossip.hpp"
#include "gasloc/core/error.hpp"

namespace gasloc::algo {

AllReduceMix::AllReduceMix(int world, std::unique_ptr<PeerClip> clip, MessageWatch watch)
    : world_(world), clip_(std::move(clip)), watch_(std::move(watch)) {}

void AllReduceMix::note_others(int64_t t, int me, const torch::Tensor& x) {
  std::vector<int> others;
  for (int id = 0; id < world_; ++id)
    if (id != me) others.push_back(id);
  watch_.note(t, others, x, {});
}

MixFlight AllReduceMix::start(const MixRound& r, comm::Communicator& comm) {
  torch::NoGradGuard no_grad;
  MixFlight f;
  f.me = comm.rank();
  f.x = r.x;
  const torch::Tensor sent = watch_.sent(r.x, f.me, r.t);
  if (r.overlapped) {
    if (clip_) throw Error("AllReduceMix: a clipped all-reduce is relayed when overlapped", "internal: make_mix wraps it");
    f.buf = sent.to(r.wire, /*non_blocking=*/false, /*copy=*/true);
    f.pending = comm.start_all_reduce_mean(f.buf);
    return f;
  }
  note_others(r.t, f.me, r.x);
  if (clip_) {
    f.result = clipped_all_gather(r, sent, comm);
    return f;
  }
  auto buf = sent.to(r.wire, /*non_blocking=*/false, /*copy=*/true);
  comm.all_reduce_mean(buf);
  f.result = checked_mean(buf, sent, "all-reduce");
  return f;
}

torch::Tensor AllReduceMix::finish(MixFlight& f) {
  torch::NoGradGuard no_grad;
  if (!f.pending) return f.result;
  f.pending->wait();
  f.pending.reset();
  return checked_mean(f.buf, f.x, "all-reduce");
}

MixAttempt AllReduceMix::collective_attempt(const MixRound& r, comm::Communicator& comm) {
  torch::NoGradGuard no_grad;
  if (clip_) throw Error("AllReduceMix: a clipped all-reduce over a view", "internal: make_mix refuses it");
  MixAttempt a;
  a.what = "all-reduce";
  torch::Tensor buf;
  torch::Tensor sent;
  if (r.x.defined()) {
    note_others(r.t, comm.rank(), r.x);
    sent = watch_.sent(r.x, comm.rank(), r.t);
    buf = sent.to(r.wire, /*non_blocking=*/false, /*copy=*/true);
  }
  a.complete = comm.all_reduce_mean_over(buf, r.members, r.call_id);
  if (a.complete && r.x.defined()) a.m = checked_mean(buf, sent, "all-reduce");
  return a;
}

torch::Tensor AllReduceMix::clipped_all_gather(const MixRound& r, const torch::Tensor& sent, comm::Communicator& comm) {
  if (!r.anchor.defined()) throw Error("AllReduceMix: a clipped all-reduce needs the anchor", "internal: pass theta");
  const torch::Tensor& x = r.x;
  const int me = comm.rank(), n = world_;
  std::vector<int> others;
  for (int id = 0; id < n; ++id)
    if (id != me) others.push_back(id);
  std::vector<torch::Tensor> recv;
  comm.exchange(others, sent.to(r.wire), recv);
  // Every worker's message as every other worker sees it (its own too: cast to the wire and back),
  // so that all of them clip and sum the same bits.
  std::vector<torch::Tensor> msgs;
  for (int id = 0, k = 0; id < n; ++id) {
    if (id == me) {
      msgs.push_back(x.to(r.wire).to(x.scalar_type()));
      continue;
    }
    torch::Tensor& got = recv[static_cast<size_t>(k++)];
    if (!got.defined())
      throw CommError(fmt::format("clipped all-reduce: worker {} sent nothing", id), "a clipped all-reduce needs every worker");
    // A non-finite message is dropped by every worker alike (each sees the same bits): the mean is the others'.
    msgs.push_back(clip_->accept_finite(got, id) ? got.to(x.scalar_type()) : torch::Tensor());
  }
  return clip_->clipped_mean(r.anchor.to(x.scalar_type()), msgs);
}

StateDict AllReduceMix::state() const {
  StateDict s;
  save_clip(clip_.get(), s);
  return s;
}

void AllReduceMix::load_state(const StateDict& s) { load_clip(clip_.get(), s); }

MixStats AllReduceMix::stats() const {
  MixStats s = clip_stats(clip_.get());
  s.suspect = watch_.suspect();
  return s;
}

}  // namespace gasloc::algo
