// One round's view of an elastic job: who takes part in the round's mix, who dies at its merge,
// who joins. The in-process reference derives it from a fault schedule (algo::Membership); a
// process run pins its members, joiners and their incarnations in the job's store
// (comm::ElasticRoster, through encode/decode) and derives the rest (algo::StoreViews).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace gasloc::comm {

struct View {
  int64_t round = 0;
  int attempt = 0;           // process runs: the attempt of the round's all-reduce it was pinned for
  std::vector<int> members;  // in the view: they take part in the round's mix (dying ones included)
  std::vector<int> dying;    // members that die at this round's merge: their edges and all-reduce fail
  std::vector<int> joining;  // healed from a donor at this round's merge; not in the mix
  // Process runs, where a death is seen after the fact: members of the previous round's view
  // that are not in this one, or are in it as a newer incarnation (they died in between, and
  // were restarted before the death was seen).
  std::vector<int> left;
  // Process runs: the incarnation of every id listed (empty in-process).
  std::map<int, int64_t> incarnation;

  bool is_member(int id) const;
  bool is_dying(int id) const;
  bool is_joining(int id) const;
  // Members that outlive the merge: an aborted all-reduce is retried over them.
  std::vector<int> survivors() const;
  // The member that sends `joiner` its state: the nearest survivor below it, cyclically, so that
  // several joiners spread over several donors.
  int donor(int joiner) const;

  // What a process run pins in the store: members and joiners with their incarnations,
  // "m=ID:INC,...|j=ID:INC,..." (dying and left are not pinned: a death is seen after the pin).
  // Beside the store's other formats, in elastic_roster.cpp.
  std::string encode() const;
  // Throws CommError on text that is not a pinned view.
  static View decode(int64_t round, int attempt, const std::string& text);
};

}  // namespace gasloc::comm
