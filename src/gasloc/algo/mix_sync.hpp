// What every synchronizer that mixes parameters or gradients shares: it holds one Mix
// (mix/mix.hpp, built by make_mix), asks it who mixes in a round, stands by when it does not, and
// reports the round that just ended once (elastic runs). Nothing here knows which exchange,
// codec or membership the Mix runs.
#pragma once
#include <memory>
#include <optional>

#include "gasloc/algo/mix/make_mix.hpp"
#include "gasloc/algo/synchronizer.hpp"

namespace gasloc::algo {

class MixSync : public Synchronizer {
 public:
  explicit MixSync(MixOptions o);
  std::optional<View> take_ended_view() override;
  std::optional<std::vector<int>> holders() const override;
  MixStats mix_stats() const override { return mix_->stats(); }
  void keep_for_joiner(StateDict& state, const std::string& prefix, int64_t params) const override {
    mix_->keep_for_joiner(state, prefix, params);
  }
  // algo.compression, algo.clip_peers, faults.poison: the Mix rebuilt with them (make_mix accepts
  // or refuses the combination). Before the first round.
  void compress(const CompressionOptions& o);
  void clip(double factor);
  void poison(std::vector<Poison> p);

 protected:
  // The round this worker is in now (the next to end).
  virtual int64_t current_round() const = 0;
  Mix& mix() const { return *mix_; }
  // Whether round views change (an elastic run with faults).
  bool elastic() const { return elastic_; }
  // Round t for a worker that does not mix in it: stands by in its collectives and drops its
  // model if it dies there. True when it did.
  bool stood_by(int64_t t, FlatParams& params, comm::Communicator& comm);
  // Round t has ended on this worker.
  void ended(int64_t t, comm::Communicator& comm);

 private:
  void rebuild();

  MixOptions options_;
  std::unique_ptr<Mix> mix_;
  bool elastic_ = false;
  int64_t ended_ = -1;  // the round that ended at this step, until take_ended_view
};

}  // namespace gasloc::algo
