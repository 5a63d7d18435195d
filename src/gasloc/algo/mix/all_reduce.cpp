// The all-reduce mix, plain and clipped; see all_reduce.hpp.
#include "gasloc/algo/mix/all_reduce.hpp"

#include <fmt/format.h>
#include <torch/torch.h>

#include "gasloc/core/error.hpp"

namespace gasloc::algo {

AllReduceMix::AllReduceMix(int world, std::unique_ptr<PeerClip> clip, MessageWatch watch)
    : UncompressedMix(std::move(clip), std::move(watch)), world_(world) {}

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
  MixAttempt a;
  a.what = "all-reduce";
  if (clip_) return clipped_attempt(r, comm);
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

MixAttempt AllReduceMix::clipped_attempt(const MixRound& r, comm::Communicator& comm) {
  MixAttempt a;
  a.what = "clipped all-reduce";
  a.self_agreed = false;  // a failed edge is seen by its ends only: the members vote
  if (!r.x.defined()) {
    // Sends nothing: a member that dies here lists the others (they see the failed edge).
    const int me = comm.rank();
    std::vector<int> others;
    if (std::find(r.members.begin(), r.members.end(), me) != r.members.end())
      for (int id : r.members)
        if (id != me) others.push_back(id);
    std::vector<torch::Tensor> recv;
    comm.exchange(others, torch::Tensor(), recv);
    return a;
  }
  note_others(r.t, comm.rank(), r.x);
  a.m = clipped_all_gather(r, watch_.sent(r.x, comm.rank(), r.t), comm, &a.complete);
  return a;
}

torch::Tensor AllReduceMix::clipped_all_gather(const MixRound& r, const torch::Tensor& sent, comm::Communicator& comm,
                                               bool* complete) {
  if (!r.anchor.defined()) throw Error("AllReduceMix: a clipped all-reduce needs the anchor", "internal: pass theta");
  const torch::Tensor& x = r.x;
  const int me = comm.rank();
  std::vector<int> members = r.members;
  if (members.empty())
    for (int id = 0; id < world_; ++id) members.push_back(id);
  std::vector<int> others;
  for (int id : members)
    if (id != me) others.push_back(id);
  std::vector<torch::Tensor> recv;
  comm.exchange(others, sent.to(r.wire), recv);
  // Every member's message as every other member sees it (its own too: cast to the wire and
  // back), so that all of them clip and sum the same bits; a worker outside the round has none.
  std::vector<torch::Tensor> msgs(static_cast<size_t>(world_));
  for (size_t k = 0; int id : members) {
    if (id == me) {
      msgs[static_cast<size_t>(id)] = x.to(r.wire).to(x.scalar_type());
      continue;
    }
    torch::Tensor& got = recv[k++];
    if (!got.defined() && complete) {
      *complete = false;  // a failed edge: the members abort this attempt
      return {};
    }
    if (!got.defined())
      throw CommError(fmt::format("clipped all-reduce: worker {} sent nothing", id), "a clipped all-reduce needs every worker");
    // A non-finite message is dropped by every worker alike (each sees the same bits): the mean is the others'.
    if (clip_->accept_finite(got, id)) msgs[static_cast<size_t>(id)] = got.to(x.scalar_type());
  }
  return clip_->clipped_mean(r.anchor.to(x.scalar_type()), msgs);
}

}  // namespace gasloc::algo
