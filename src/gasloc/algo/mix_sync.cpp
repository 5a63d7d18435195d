// What the synchronizers that mix share; see mix_sync.hpp.
#include "gasloc/algo/mix_sync.hpp"

#include <torch/torch.h>

#include <utility>

namespace gasloc::algo {

MixSync::MixSync(MixOptions o) : options_(std::move(o)) { rebuild(); }

void MixSync::rebuild() {
  mix_ = make_mix(options_);
  elastic_ = options_.views_change();
}

void MixSync::compress(const CompressionOptions& o) {
  options_.compression = o;
  rebuild();
}

void MixSync::clip(double factor) {
  options_.clip = factor;
  rebuild();
}

void MixSync::poison(std::vector<Poison> p) {
  options_.poisons = std::move(p);
  rebuild();
}

std::optional<View> MixSync::take_ended_view() {
  if (!elastic_ || ended_ < 0) return std::nullopt;
  return mix_->view(std::exchange(ended_, -1));
}

std::optional<std::vector<int>> MixSync::holders() const { return mix_->holders(current_round()); }

bool MixSync::stood_by(int64_t t, FlatParams& params, comm::Communicator& comm) {
  if (mix_->mixes(comm.rank(), t)) return false;
  if (mix_->stand_by(t, comm)) {
    // A worker that dies loses its state; a joiner's comes from its donor.
    torch::NoGradGuard no_grad;
    params.data().zero_();
  }
  return true;
}

void MixSync::ended(int64_t t, comm::Communicator& comm) {
  ended_ = t;
  mix_->ended(t, comm);
}

}  // namespace gasloc::algo
