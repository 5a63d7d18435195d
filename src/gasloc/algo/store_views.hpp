// The views of an elastic process run, pinned in the job's store (comm/elastic_roster.hpp), behind
// the same calls as the in-process schedule (Membership), so every synchronizer runs unchanged
// over Gloo. A round's view is pinned when this rank first asks for it, at the round's merge; a
// death is not known in advance there, so `dying` stays empty: a member that died after the pin
// is a failed edge of the mix, or aborts the all-reduce, which retries over a view pinned again.
#pragma once
#include <map>

#include "gasloc/algo/membership.hpp"
#include "gasloc/comm/elastic_roster.hpp"

namespace gasloc::algo {

class StoreViews final : public Membership {
 public:
  StoreViews(int workers, comm::ElasticRoster& roster) : Membership(workers), roster_(roster) {}
  View view(int64_t round) const override;
  // Round `round`'s view if some rank has pinned it (a joiner waits for one that lists it).
  std::optional<View> pinned(int64_t round) const;
  // A live process computes every round it is in (a joiner waits outside the loop until healed).
  bool computes(int id, int64_t) const override { return id == roster_.id(); }
  // A fresh view of the same round from the roster, once the launcher has seen the death.
  View retry(const View& v, int attempt) const override;
  bool trivial() const override { return false; }

 private:
  comm::ElasticRoster& roster_;
  mutable std::map<int64_t, View> cache_;  // the last few rounds' views, asked for several times a round
};

}  // namespace gasloc::algo
