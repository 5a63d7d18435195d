#include "gasloc/comm/view.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "gasloc/core/error.hpp"

namespace gasloc::comm {

namespace {
bool contains(const std::vector<int>& v, int id) { return std::find(v.begin(), v.end(), id) != v.end(); }
}  // namespace

bool View::is_member(int id) const { return contains(members, id); }
bool View::is_dying(int id) const { return contains(dying, id); }
bool View::is_joining(int id) const { return contains(joining, id); }

std::vector<int> View::survivors() const {
  std::vector<int> s;
  for (int id : members)
    if (!is_dying(id)) s.push_back(id);
  return s;
}

int View::donor(int joiner) const {
  const auto s = survivors();
  if (s.empty()) throw Error(fmt::format("round {}: no surviving worker can heal worker {}", round, joiner));
  auto below = std::lower_bound(s.begin(), s.end(), joiner);
  return below == s.begin() ? s.back() : *std::prev(below);
}

}  // namespace gasloc::comm
