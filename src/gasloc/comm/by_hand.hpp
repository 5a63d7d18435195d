// Elastic ranks started by hand (docs/training.md, "Elastic runs started by hand"): the rank's
// side. `gasloc store --elastic -n N` is the one writer of the roster (comm::ElasticHost with
// Options::by_hand), as `gasloc launch --elastic` is for the ranks it starts. It cannot see
// processes exit or kill them (they may run on other hosts), so:
// - a starting process claims its incarnation, inc = add(el/inc/ID, 1) - 1, and waits for the
//   host's answer in el/admit/ID.INC: a founding member (until every id of the job has started
//   once), a joiner (afterwards: it takes a donor's state), or refused (the id is alive); with
//   founders F < N, ids 0..F-1 found the job and ids F..N-1 are joiners, answered once it runs
//   (room to add workers to a running job, or a run resumed on more ranks than saved it);
// - the host judges liveness by heartbeats alone: an incarnation whose counter has not moved for
//   the heartbeat timeout is declared dead; a peer's suspect report declares it dead sooner, once
//   its counter has been still for kSuspectSilenceS (a report alone never evicts);
// - a rank declared dead that was only stopped finds itself out of the next view and exits
//   (fencing without a kill); started again, it rejoins as a new incarnation;
// - a rank that ends (finished, stopped, or failed with an error) says so in el/out/ID, and
//   leaves the roster at once.
#pragma once
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace gasloc::comm {

namespace elastic_keys {
std::string world();                          // the job's number of ids (the host's -n)
std::string founders();                       // ids 0..F-1 found the job; the rest join it (--founders)
std::string claim(int id);                    // incarnation counter of one id
std::string admit(int id, int64_t inc);       // the host's answer to a claim
std::string founded();                        // set once every id has started
std::string out(int id);                      // the incarnation that ended
std::string heartbeat_timeout();              // the job's cluster.heartbeat_timeout_s, set by its first rank
}  // namespace elastic_keys

// The host's answers in el/admit/ID.INC.
namespace admission {
constexpr const char* kMember = "member";
constexpr const char* kJoiner = "joiner";
constexpr const char* kRefused = "refused:";  // followed by why
}  // namespace admission

// What a process started by hand became.
struct Admission {
  int64_t incarnation = 0;
  bool founding = true;  // a first member of the job (false: a joiner that heals from a donor)
};

// The rank's side: claims an incarnation of `id` and waits (at most timeout_s) for the host's
// answer. Throws ConfigError when the host refuses (the id is alive; another world size) and
// CommError when the store keeps no elastic roster or the answer does not come.
Admission admit_by_hand(c10d::Store& store, int id, int world, double timeout_s);
// A founding member, beating already: waits (at most timeout_s) until every founding id has started.
void await_founded(c10d::Store& store, int id, double timeout_s);
// Whether a process of `id` started now would be a founding member: the job does not run yet
// and `id` is below the store's --founders.
bool founds_the_job(c10d::Store& store, int id);
// Says that this incarnation ended (best effort: a failure here is ignored).
void announce_out(c10d::Store& store, int id, int64_t inc) noexcept;


}  // namespace gasloc::comm
