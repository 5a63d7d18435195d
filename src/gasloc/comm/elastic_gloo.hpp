// The Communicator of an elastic Gloo rank (docs/design.md section 10, "Elastic process runs").
//
// No group of the whole world: a full-mesh group would tie every rank to every other, and Gloo
// closes all of a group's connections when one of its waits fails. Instead each pair of ranks
// that talks gets its own two-rank Gloo group, made on first use and kept for as long as both
// incarnations live (its store keys name both), so a failure breaks one pair and nothing else:
// - exchange: a peer that fails (its process died; the launcher kills a hung one, which closes
//   its sockets) is a failed edge, an undefined recv entry, as in the in-process reference; a
//   peer that fails while the roster still lists it alive is reported as a suspect, and the
//   store's host looks at its heartbeat: killed (it comes back as a new incarnation) only once
//   its counter stopped, left alone while it beats;
// - a pair group that does not form (a connect refused: someone else connected first to the
//   pair's port) is a failed try: both ends try again on fresh ports, kPairGroupTries in all;
// - all_reduce_mean_over: every member sends its buffer to every other member and sums what it
//   got in id order (the in-process reference's order, so the bits agree); whether the round
//   counts is decided in one store key, commit when every member received everything, abort as
//   soon as one could not or a member is gone; callers retry over a fresh view;
// - all_reduce_mean, broadcast and barrier are refused: an elastic run has no global collective.
// Groups are made in ascending pair order, which cannot deadlock (a global order on pairs).
#pragma once
#include <memory>

#include "gasloc/comm/communicator.hpp"
#include "gasloc/comm/elastic_roster.hpp"
#include "gasloc/comm/rendezvous.hpp"

namespace gasloc::comm {

class ElasticGlooComm final : public Communicator {
 public:
  // Connects to the job's store (hosted by gasloc launch --elastic or gasloc store --elastic, which
  // write the roster) as incarnation `incarnation` of id o.rank; -1: a rank started by hand, which
  // the store's roster host admits (comm/by_hand.hpp). Throws CommError when there is no
  // roster (not an elastic launch) or the store cannot be reached, ConfigError when refused.
  // `join`: this process joins the running job with a donor's state, even at incarnation 0.
  // `heartbeat_timeout_s` (> 0): the job's cluster.heartbeat_timeout_s, told to a gasloc store
  // that was started without its own (the first rank's value stands).
  ElasticGlooComm(const GlooOptions& o, int64_t incarnation, bool join = false, double heartbeat_timeout_s = 0);
  ~ElasticGlooComm() override;
  ElasticGlooComm(const ElasticGlooComm&) = delete;
  ElasticGlooComm& operator=(const ElasticGlooComm&) = delete;

  int rank() const override;
  int world() const override;
  void all_reduce_mean(torch::Tensor& t) override;
  void exchange(const std::vector<int>& peers, const torch::Tensor& send, std::vector<torch::Tensor>& recv) override;
  void broadcast(torch::Tensor& t, int root) override;
  void barrier() override;
  bool all_reduce_mean_over(torch::Tensor& t, const std::vector<int>& members, int64_t call_id) override;
  double now() const override;
  void compute(int64_t) override {}
  CommStats stats() const override;

  // This rank's side of the membership; peers are addressed by the incarnation that the newest
  // view pinned through it names.
  ElasticRoster& roster();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Tests only: when a test program defines this function, every key a rank reads while forming a
// pair group (the peer's Gloo address among them: Gloo publishes it, then waits on its listening
// port for the first connection) is handed to it, with the value, before Gloo gets it: the test
// can connect first, as anyone who reaches the port can. The gasloc program does not define it.
extern "C" __attribute__((weak)) void gasloc_test_pair_key_read(const char* key, const uint8_t* value, size_t n);

}  // namespace gasloc::comm
