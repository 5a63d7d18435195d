// Elastic membership around any Mix; see elastic_mix.hpp.
#include "gasloc/algo/mix/elastic_mix.hpp"

#include <fmt/format.h>
#include <torch/torch.h>

#include "gasloc/comm/elastic_roster.hpp"
#include "gasloc/core/error.hpp"

namespace gasloc::algo {

ElasticMix::ElasticMix(std::unique_ptr<Mix> inner, const Membership& membership, int world)
    : MixWrapper(std::move(inner)),
      views_(!membership.trivial() && !membership.restart_all() ? &membership : nullptr),
      restarts_(membership.restart_all() ? &membership : nullptr),
      world_(world) {}

std::optional<View> ElasticMix::view(int64_t t) const {
  if (!views_) return std::nullopt;
  return views_->view(t);
}

bool ElasticMix::mixes(int id, int64_t t) const {
  if (!views_) return true;
  const View v = views_->view(t);
  return v.is_member(id) && !v.is_dying(id);
}

bool ElasticMix::computes(int id, int64_t t) const { return !views_ || views_->computes(id, t); }

std::optional<std::vector<int>> ElasticMix::holders(int64_t t) const {
  if (!views_) return std::nullopt;
  std::vector<int> h;
  for (int id = 0; id < world_; ++id)
    if (computes(id, t)) h.push_back(id);
  return h;
}

MixFlight ElasticMix::start(const MixRound& r, comm::Communicator& comm) {
  if (!views_) return inner_->start(r, comm);
  if (r.overlapped)
    throw Error("ElasticMix: an overlapped round over a view", "internal: make_mix refuses overlapped elastic rounds");
  MixFlight f;
  f.x = r.x;
  f.result = round(r, comm);
  return f;
}

bool ElasticMix::stand_by(int64_t t, comm::Communicator& comm) {
  if (!views_) return inner_->stand_by(t, comm);
  MixRound r;
  r.t = t;
  round(r, comm);
  return views_->view(t).is_dying(comm.rank());  // a worker that dies loses its state
}

torch::Tensor ElasticMix::round(const MixRound& r, comm::Communicator& comm) {
  torch::NoGradGuard no_grad;
  const View v = views_->view(r.t);
  const int me = comm.rank();
  const bool mixes = r.x.defined() && v.is_member(me) && !v.is_dying(me);
  MixRound over = r;
  if (!mixes) over.x = torch::Tensor();
  over.members = v.members;
  if (inner_->has_collective(r.t)) {
    const MixAttempt a = agreed(v, over, mixes, comm);
    if (a.ends_round) return a.m;
    inner_->collective_agreed(a.m);
  }
  return inner_->mix(over, comm);
}

MixAttempt ElasticMix::agreed(const View& v, const MixRound& r, bool mixes, comm::Communicator& comm) {
  const int me = comm.rank();
  constexpr int64_t kAttempts = comm::kAttemptsPerRound;  // call ids: the round's attempts
  const char* what = "round";
  View at = v;
  for (int attempt = 0;; at = views_->retry(v, ++attempt)) {
    if (attempt >= kAttempts) throw CommError(fmt::format("{}: round {} was aborted {} times", what, v.round, kAttempts));
    const bool member = mixes && at.is_member(me);
    MixRound one = r;
    if (!member) one.x = torch::Tensor();
    one.members = at.members;
    one.call_id = v.round * kAttempts + attempt;
    StateDict before;
    if (member && inner_->restores_state()) {
      before = inner_->state();
      for (auto& [k, t] : before) t = t.clone();
    }
    MixAttempt a = inner_->collective_attempt(one, comm);
    what = a.what;
    bool committed = a.complete;
    if (!a.self_agreed) {
      // A failed edge anywhere, or a member that died, aborts the attempt for all.
      torch::Tensor failed = member ? torch::full({1}, a.complete ? 0.0f : 1.0f) : torch::Tensor();
      const bool voted = comm.all_reduce_mean_over(failed, at.members, one.call_id);
      committed = voted && (!member || failed.item<float>() == 0.0f);
    }
    if (committed) {
      if (!member) a.m = torch::Tensor();
      return a;
    }
    if (member && inner_->restores_state()) inner_->load_state(before);
  }
}

void ElasticMix::ended(int64_t t, comm::Communicator& comm) {
  inner_->ended(t, comm);
  if (!restarts_) return;
  const RestartAll& r = *restarts_->restart_all();
  if (restarts_->fails_at(t)) {
    comm.barrier();  // the job stops: it restarts once its slowest worker has stopped too
    comm.pause(r.delay_s + comm.now() - checkpoint_clock_);
  }
  if (r.checkpoint_every_rounds > 0 && (t + 1) % r.checkpoint_every_rounds == 0) {
    comm.barrier();  // a checkpoint commits when every worker has written it
    checkpoint_clock_ = comm.now();
  }
}

StateDict ElasticMix::state() const {
  StateDict s = inner_->state();
  if (restarts_) s["restart_checkpoint_clock"] = torch::tensor(checkpoint_clock_, torch::kFloat64);
  return s;
}

void ElasticMix::load_state(const StateDict& s) {
  inner_->load_state(s);
  if (!restarts_) return;
  const auto it = s.find("restart_checkpoint_clock");
  checkpoint_clock_ = it == s.end() ? 0.0 : it->second.item<double>();
}

}  // namespace gasloc::algo
