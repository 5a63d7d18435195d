#include "gasloc/algo/store_views.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "gasloc/core/error.hpp"

namespace gasloc::algo {

View StoreViews::view(int64_t round) const {
  if (const auto it = cache_.find(round); it != cache_.end()) return it->second;
  View v = roster_.pin(round);
  // The view names incarnations: an older one of this id (declared dead while it was stopped, and
  // since replaced) is out too.
  const bool listed = v.is_member(roster_.id()) || v.is_joining(roster_.id());
  if (!listed || roster_.incarnation_of(roster_.id()) != roster_.incarnation())
    throw CommError(fmt::format("worker {} (incarnation {}) is not in round {}'s view: the store host declared it dead "
                                "(its heartbeat stalled or a peer reported its link)",
                                roster_.id(), roster_.incarnation(), round),
                    "gasloc launch --elastic restarts it as a new incarnation, which rejoins; a rank started by hand "
                    "rejoins when started again");
  if (const auto prev = cache_.find(round - 1); prev != cache_.end())
    for (int id : prev->second.members)
      if ((!v.is_member(id) && !v.is_joining(id)) || v.incarnation.at(id) != prev->second.incarnation.at(id))
        v.left.push_back(id);
  cache_[round] = v;
  while (cache_.size() > 4) cache_.erase(cache_.begin());
  return v;
}

std::optional<View> StoreViews::pinned(int64_t round) const {
  return roster_.pinned(round);
}

View StoreViews::retry(const View& v, int attempt) const {
  // The launcher marks a dead process within about a tenth of a second; a hung one once its
  // heartbeat stalls and it is killed. Until then a retry would meet the same death.
  std::this_thread::sleep_for(std::chrono::milliseconds(100 * std::min(attempt, 10)));
  View r = roster_.pin(v.round, attempt);
  r.joining.clear();  // joiners are healed once, after the round's first view
  return r;
}

}  // namespace gasloc::algo
