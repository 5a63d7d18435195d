// The algorithms of rounds (DiLoCo, GASLoC, Local-DAdam): H_i local steps, then one mix over the
// round through the worker's Mix (mix/mix.hpp), in the algorithm's form (round_forms.hpp). Every round takes
// one path, blocking or overlapped (docs/design.md section 11):
//   send:  s = the form's message from phi_sent; the mix of s starts (blocking: runs to the end)
//   land:  theta' = the form's landing of the finished mix m; phi <- theta' + (phi - base)
// and the blocking round is the overlapped one with tau = 0: it lands at once, where phi is still
// phi_sent, so phi <- theta'. Notation: phi_i live parameters (the flat buffer), theta_i the
// anchor, b_i the outer momentum, W_t the round's mixing matrix.
#pragma once
#include <memory>
#include <optional>

#include "gasloc/algo/mix_sync.hpp"
#include "gasloc/algo/local_steps.hpp"
#include "gasloc/algo/outer.hpp"
#include "gasloc/algo/round_forms.hpp"
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
//            own sent value standing in for the mix); base = E_i, so the landing adds theta' - E_i.
//   delayed: the tau steps start from phi_sent; base = phi_sent.
// tau = 0 is the blocking round, bit for bit: it is the same path.
enum class OverlapVariant { eager, delayed };
const config::Choices& overlap_choices();
struct Overlap {
  int64_t steps = 0;  // tau; 0 = the blocking round
  OverlapVariant variant = OverlapVariant::delayed;  // algo.overlap's default (E9: eager costs 0.25-0.30 nats)
};
Overlap parse_overlap(int64_t steps, const std::string& variant);

// A worker of an algorithm of rounds. In an elastic run a worker outside a round's mix (it dies
// at its landing, is dead, or joins) only stands by in the round's collectives, and a joiner
// receives its state from a donor after the landing (Worker::heal). Nothing is modified before
// a round's exchange succeeds; a non-finite message from a peer is refused.
class RoundSync : public MixSync {
 public:
  // outer_step: the round's form and its outer step (nullopt: Local-DAdam's round, theta' = m).
  // mix: the exchange's options (make_mix); its `overlapped` is set from `overlap`.
  RoundSync(LocalSteps steps, std::optional<OuterStep> outer_step, MixOptions mix, torch::ScalarType wire,
            Overlap overlap = {});
  // The form's anchor starts at the initial parameters.
  void init(FlatParams& params) override;
  bool wants_compute(int64_t, comm::Communicator& comm) override;
  bool after_step(int64_t step, FlatParams& params, comm::Communicator& comm) override;
  bool flush(FlatParams& params, comm::Communicator& comm) override;
  void settle(comm::Communicator& comm) override;
  StateDict state() const override;
  void load_state(const StateDict& s) override;

 protected:
  int64_t current_round() const override { return rounds_.round(); }

 private:
  // The round sent and not yet landed: within one after_step when blocking, for tau steps when
  // overlapped.
  struct Flight {
    bool active = false;
    MixFlight mix;        // overlapped, until settled
    torch::Tensor mixed;  // m, once settled (blocking: at once)
    Sent sent;
    torch::Tensor base;   // overlapped: where the tau steps started, E_i (eager) or phi_sent (delayed)
  };
  bool overlapping() const { return overlap_.steps > 0; }
  // Round t for a worker that does not mix in it: stands by and ends the round. True when it did.
  bool sat_out(FlatParams& params, comm::Communicator& comm);
  void send(FlatParams& params, comm::Communicator& comm);
  void land(FlatParams& params, comm::Communicator& comm);
  void end_round(comm::Communicator& comm);
  void save_flight(StateDict& s) const;
  void load_flight(const StateDict& s);
  RoundForm& form() const;
  // A compressed or clipped all-reduce's anchor: the form's theta, which every member holds (undefined otherwise).
  torch::Tensor anchor() const;

  RoundCounter rounds_;
  std::optional<OuterStep> outer_step_;  // nullopt: the mix-only form
  std::unique_ptr<RoundForm> form_;  // from init
  torch::ScalarType wire_;
  int64_t numel_ = 0;  // parameters in a message
  Overlap overlap_;
  Flight flight_;
};

// DiLoCo: H local steps, then theta <- outer step towards mean_i phi_i (all-reduce), phi <- theta:
// the anchor form over the complete topology, which is the round GASLoC must reduce to there.
class DiLoCoSync final : public RoundSync {
 public:
  // membership: the elastic run's (nullptr: every worker every round).
  DiLoCoSync(LocalSteps steps, OuterOptions outer, int world, const Membership* membership = nullptr,
             torch::ScalarType wire = torch::kFloat, Overlap overlap = {});
  std::string name() const override { return "diloco"; }
};

// GASLoC: H_i local steps, then one exchange of one buffer with this round's gossip neighbours
// (an all-reduce on the complete topology), in one of three forms (algo.form, round_forms.hpp),
// and phi_i <- theta_i. State: theta_i and b_i (anchor, mix_after) or theta_i and u_i^prev
// (accelerated; none of them when the momentum is 0).
struct GossipForm {
  Form form = Form::anchor;
  double gossip_step = 1.0;  // alpha (accelerated)
};

class GossipSync final : public RoundSync {
 public:
  GossipSync(LocalSteps steps, OuterOptions outer, topology::Topology topo, GossipForm form = {},
             torch::ScalarType wire = torch::kFloat, const Membership* membership = nullptr, Overlap overlap = {});
  std::string name() const override { return "gasloc"; }
};

// Local-DAdam: H local AdamW steps, then theta_i <- sum_j W_ij phi_j exactly (no outer step).
class LocalDAdamSync final : public RoundSync {
 public:
  LocalDAdamSync(LocalSteps steps, topology::Topology topo, torch::ScalarType wire = torch::kFloat,
                 const Membership* membership = nullptr, Overlap overlap = {});
  std::string name() const override { return "local_dadam"; }
};

}  // namespace gasloc::algo
