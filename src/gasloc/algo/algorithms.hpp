// The synchronizers of docs/design.md section 3, one small class each (those that communicate
// every step are in step_sync.hpp). All run unchanged on any Communicator backend. Notation:
// phi_i live parameters (the flat buffer), theta_i the outer anchor, b_i the outer momentum, H
// local steps per round, W_t the round's mixing matrix.
#pragma once
#include <memory>

#include "gasloc/algo/consensus.hpp"
#include "gasloc/algo/elastic.hpp"
#include "gasloc/algo/local_steps.hpp"
#include "gasloc/algo/outer.hpp"
#include "gasloc/algo/step_sync.hpp"
#include "gasloc/algo/synchronizer.hpp"
#include "gasloc/topology/topology.hpp"

namespace gasloc::algo {

// Counts inner steps into rounds of H steps and keeps the round number for checkpoints. Of each
// round's H steps, the first H_i (from the local-step policy) are computed and the rest skipped.
class RoundCounter {
 public:
  explicit RoundCounter(LocalSteps policy) : policy_(std::move(policy)) {}
  // Called after each inner step, computed or skipped; true when the round's H steps are done.
  bool step_done();
  // Whether the next step of the current round is computed by `rank`, for messages of
  // `message_bytes`. Warns once if the budget leaves the worker less than one step.
  bool computes_next(int rank, int64_t message_bytes);
  int64_t round() const { return round_; }  // rounds completed so far
  int64_t steps_in_round() const { return steps_; }
  void next_round() { ++round_, steps_ = 0; }
  void save(StateDict& s) const;
  void load(const StateDict& s);

 private:
  LocalSteps policy_;
  int64_t round_ = 0, steps_ = 0;
  int64_t planned_round_ = -1, planned_steps_ = 0;
  bool warned_ = false;
};

// Overlapped rounds (algo.overlap_steps, algo.overlap; docs/design.md section 11). At the end of
// round t a worker snapshots phi_sent (the evaluation point), starts the round's exchange of what
// its form sends, and goes on with tau = steps local steps; tau steps later it waits and lands
// round t's outer step theta' computed exactly as without overlap, the mix's own term being the
// snapshot. Both variants then set phi <- theta' + (phi - base):
//   eager:   the tau steps start from a provisional step E_i (the round's update with the worker's
//            own sent value standing in for the mix); base = E_i, so the merge adds theta' - E_i.
//   delayed: the tau steps start from phi_sent; base = phi_sent.
// tau = 0 is the blocking round, bit for bit.
enum class OverlapVariant { eager, delayed };
const config::Choices& overlap_choices();
struct Overlap {
  int64_t steps = 0;  // tau; 0 = off
  OverlapVariant variant = OverlapVariant::eager;
};
Overlap parse_overlap(int64_t steps, const std::string& variant);

// What every algorithm of rounds shares (DiLoCo, GASLoC, Local-DAdam): rounds of H local steps,
// mixed over each round's view through a RoundMixer. In an elastic run a worker outside a round's
// mix (it dies at its merge, is dead, or joins) only stands by in the round's collectives, and a
// joiner receives its state from a donor after the merge (Worker::heal).
class RoundSync : public ViewSync {
 public:
  RoundSync(LocalSteps steps, RoundMixer mixer, torch::ScalarType wire, Overlap overlap = {})
      : ViewSync(std::move(mixer)), rounds_(std::move(steps)), wire_(wire), overlap_(overlap) {}
  void init(FlatParams& params) override;
  bool wants_compute(int64_t, comm::Communicator& comm) override;
  bool flush(FlatParams& params, comm::Communicator& comm) override;
  void settle(comm::Communicator& comm) override;

 protected:
  // What a form sends at a round's end, made from the snapshot phi_sent: the message x, the
  // provisional step E_i (eager) and what the form commits at the merge.
  struct Sent {
    torch::Tensor x, provisional;
    torch::Tensor b_next;  // mix_after: the outer momentum after this round (undefined otherwise)
  };
  virtual Sent prepare(const torch::Tensor& phi_sent) = 0;
  // Round t's new anchor theta' from m, the finished mix of what prepare() sent; commits the
  // algorithm's state (outer momentum, u_prev).
  virtual torch::Tensor land(const torch::Tensor& mixed, const Sent& sent) = 0;
  // after_step with algo.overlap_steps > 0: the send at a round's end, the merge tau steps later.
  bool overlapped_step(FlatParams& params, comm::Communicator& comm);
  bool overlapping() const { return overlap_.steps > 0; }
  void save_flight(StateDict& s) const;
  void load_flight(const StateDict& s);

  int64_t current_round() const override { return rounds_.round(); }
  // Round t for a worker that does not mix in it: stands by and ends the round. True when it did.
  bool sat_out(FlatParams& params, comm::Communicator& comm);
  void end_round(comm::Communicator& comm) {
    ended(rounds_.round(), comm);
    rounds_.next_round();
  }

  RoundCounter rounds_;
  torch::ScalarType wire_;
  int64_t bytes_ = 0;  // one parameter message, in the wire dtype
  Overlap overlap_;

 private:
  // The round whose exchange is in flight, from its send until its merge.
  struct Flight {
    bool active = false;
    MixInFlight mix;      // until settled
    torch::Tensor mixed;  // m, once settled
    Sent sent;
    torch::Tensor base;   // where the tau steps started: E_i (eager) or phi_sent (delayed)
  };
  void send(FlatParams& params, comm::Communicator& comm);
  void merge(FlatParams& params, comm::Communicator& comm);
  Flight flight_;
};

// What DiLoCo and GASLoC share: an outer Nesterov optimizer whose anchor theta starts at the
// initial parameters; its state goes into checkpoints.
class OuterSync : public RoundSync {
 public:
  OuterSync(LocalSteps steps, OuterOptions outer, RoundMixer mixer, torch::ScalarType wire = torch::kFloat,
            Overlap overlap = {})
      : RoundSync(std::move(steps), std::move(mixer), wire, overlap), outer_opts_(outer) {}
  void init(FlatParams& params) override;
  StateDict state() const override;
  void load_state(const StateDict& s) override;

 protected:
  // Ends a round: theta <- outer step towards `mixed`, phi <- theta.
  void finish_round(const torch::Tensor& mixed, FlatParams& params, comm::Communicator& comm);
  // The anchor form's round (DiLoCo's too): x = phi_sent, E_i = the outer step towards phi_sent.
  Sent prepare(const torch::Tensor& phi_sent) override;
  torch::Tensor land(const torch::Tensor& mixed, const Sent& sent) override;

  OuterOptions outer_opts_;
  std::unique_ptr<OuterNesterov> outer_;
};

// DiLoCo: H local steps, then theta <- outer step towards mean_i phi_i (all-reduce), phi <- theta.
// Its round is written out on its own, without the gossip machinery, as the reference GASLoC
// must reduce to.
class DiLoCoSync final : public OuterSync {
 public:
  // membership: the elastic run's (nullptr: every worker every round).
  DiLoCoSync(LocalSteps steps, OuterOptions outer, int world, const Membership* membership = nullptr,
             torch::ScalarType wire = torch::kFloat, Overlap overlap = {});
  std::string name() const override { return "diloco"; }
  bool after_step(int64_t step, FlatParams& params, comm::Communicator& comm) override;
};

// GASLoC: H_i local steps, then one exchange of one buffer with this round's gossip neighbours
// (an all-reduce on the complete topology), in one of three forms (algo.form, docs/design.md
// section 3; N_i(.) is worker i's Nesterov direction with its own buffer b_i):
//   anchor:      m_i = sum_j W_t[i,j] phi_j (j ascending); outer Nesterov step on theta_i towards m_i
//   mix_after:   v_i = theta_i - eta N_i(theta_i - phi_i); theta_i <- sum_j W_t[i,j] v_j
//   accelerated: u_i = theta_i + eta (phi_i - theta_i);
//                theta_i <- u_i - alpha (u_i - sum_j W_t[i,j] u_j) + gamma (u_i - u_i^prev)
// and phi_i <- theta_i. State: theta_i and b_i (anchor, mix_after) or theta_i and u_i^prev
// (accelerated; none of it when the momentum is 0). Nothing is modified before the exchange
// succeeds.
struct GossipForm {
  Form form = Form::anchor;
  double gossip_step = 1.0;  // alpha (accelerated)
};

class GossipSync final : public OuterSync {
 public:
  GossipSync(LocalSteps steps, OuterOptions outer, topology::Topology topo, GossipForm form = {},
             torch::ScalarType wire = torch::kFloat, const Membership* membership = nullptr, Overlap overlap = {});
  std::string name() const override { return "gasloc"; }
  void init(FlatParams& params) override;
  bool after_step(int64_t step, FlatParams& params, comm::Communicator& comm) override;
  StateDict state() const override;
  void load_state(const StateDict& s) override;

 protected:
  // mix_after sends v_i (= E_i); accelerated sends u_i, E_i = u_i + gamma (u_i - u_i^prev).
  Sent prepare(const torch::Tensor& phi_sent) override;
  torch::Tensor land(const torch::Tensor& mixed, const Sent& sent) override;

 private:
  GossipForm form_;
  double gamma_ = 0.0;    // accelerated: momentum on the post-update iterates
  torch::Tensor u_prev_;  // accelerated with gamma > 0
};

// Local-DAdam: H local AdamW steps, then theta_i <- sum_j W_ij phi_j exactly (no outer step).
class LocalDAdamSync final : public RoundSync {
 public:
  LocalDAdamSync(LocalSteps steps, topology::Topology topo, torch::ScalarType wire = torch::kFloat,
                 const Membership* membership = nullptr, Overlap overlap = {})
      : RoundSync(std::move(steps), RoundMixer(std::move(topo), membership), wire, overlap) {}
  std::string name() const override { return "local_dadam"; }
  bool after_step(int64_t step, FlatParams& params, comm::Communicator& comm) override;
  StateDict state() const override;
  void load_state(const StateDict& s) override;

 protected:
  // theta' = m: nothing to propose, so E_i = phi_sent and both variants are one.
  Sent prepare(const torch::Tensor& phi_sent) override { return {phi_sent, phi_sent, {}}; }
  torch::Tensor land(const torch::Tensor& mixed, const Sent&) override { return mixed; }
};

// m = sum_j W_t[rank, j] phi_j over the row (self included), in the row's order (j ascending)
// so that every backend gives the same bits. phi is sent as `wire` and what arrives is mixed
// in phi's dtype. Rejects non-finite tensors from peers with a CommError naming the peer,
// before anything is modified.
torch::Tensor gossip_mix(const topology::Topology& topo, int64_t round, const torch::Tensor& phi,
                         comm::Communicator& comm, torch::ScalarType wire = torch::kFloat);
// mean_i x_i by an all-reduce of x cast to `wire`, returned in x's dtype; non-finite results
// are rejected (`what` names the exchange).
torch::Tensor all_reduce_mix(const torch::Tensor& x, comm::Communicator& comm, torch::ScalarType wire, const char* what);
// The dtypes parameter messages may travel in (algo.wire_dtype, `gasloc topo --wire-dtype`).
const config::Choices& wire_dtype_choices();
// "fp32" -> kFloat, "bf16" -> kBFloat16; ConfigError listing the choices otherwise.
torch::ScalarType parse_wire_dtype(const std::string& name);

}  // namespace gasloc::algo
