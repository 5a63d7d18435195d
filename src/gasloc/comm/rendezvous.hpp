// How separate processes find each other: torchrun-style environment variables, the c10d
// TCPStore they meet at, and the choice of process backend (Gloo or NCCL).
//
// Every rank reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (set by `gasloc launch` or
// torchrun). Rank 0 hosts a TCPStore on MASTER_PORT unless an agent already hosts one (torchrun
// sets TORCHELASTIC_USE_AGENT_STORE=True); every rank then registers in it and waits, with the
// timeout, until all WORLD_SIZE ranks have registered, so a rank that never starts is an error
// naming it instead of a hang.
#pragma once
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "gasloc/comm/communicator.hpp"

namespace gasloc::comm {

// Settings of a process-backend rank. The name says Gloo because Gloo is the default backend;
// the NCCL backend uses the same rendezvous and reads the same fields.
struct GlooOptions {
  int rank = -1, world = -1;
  std::string master_addr;
  int master_port = 0;
  double timeout_s = 60;            // every blocking call (rendezvous, collectives, exchanges)
  double bandwidth_limit_Bps = 0;   // 0 = unlimited; token bucket on this rank's sends and receives
  std::string interface;            // optional network interface for the data connections
  int local_rank = -1;              // rank on this host (LOCAL_RANK); picks the GPU for NCCL
  // The store at master_addr:master_port is hosted by someone else (torchrun's agent, a test,
  // a launcher), so rank 0 connects to it like every other rank instead of hosting it.
  bool connect_only = false;
};

// Reads the launcher's variables: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (required),
// LOCAL_RANK, GLOO_SOCKET_IFNAME and TORCHELASTIC_USE_AGENT_STORE. Everything else (timeout,
// bandwidth limit) comes from the job's configuration or the command line, never from gasloc's
// own variables. Throws CommError naming the variable and saying how to launch.
GlooOptions gloo_options_from_env();
// The same, reading variables through `lookup` (returns nullptr for an unset variable): tests.
GlooOptions gloo_options_from_env(const std::function<const char*(const char*)>& lookup);

// Parses a bandwidth limit (`--bandwidth-limit`) for `rank`: "1e8" (every rank) or "2=1e7,3=5e7"
// (listed ranks; others unlimited). Throws CommError on a malformed value.
double parse_bandwidth_limit(const std::string& spec, int rank);

// Checks the fields (rank in [0, world), port in range, positive timeout ...). join_store checks
// the rank's range itself, after joining, so that every rank hears of it.
void validate(const GlooOptions& o, bool check_rank = true);

// Connects this rank to the rendezvous store (hosting it on rank 0 unless connect_only), checks
// that every rank agrees on WORLD_SIZE and that no rank is claimed twice, and waits until all
// ranks have registered. Throws CommError naming missing ranks, a port in use, or an
// unreachable store.
c10::intrusive_ptr<c10d::Store> join_store(const GlooOptions& o);

// After a failed operation: the ranks that are known to be gone (same host, process no longer
// running), as text such as "; confirmed: rank 2 (pid 4242) is no longer running"; empty if none
// is known.
std::string describe_dead_ranks(c10d::Store& store, int self_rank, int world);

// Why a rank failed, kept in the rendezvous store under failed/RANK. A rank that fails closes its
// connections, so its peers fail after it; before they report, each looks up the record of the
// peer it was talking to and names the rank that failed first (`root`) instead of that peer.
// The first record of a rank wins.
struct FailureRecord {
  int root = -1;     // the rank that failed first (-1: unknown, e.g. a collective timed out)
  std::string what;  // what the rank that saw it fail reported
};
// Never throws: the store may be gone with the rank that hosted it.
void publish_failure(c10d::Store& store, int rank, const FailureRecord& rec) noexcept;
// A mistake that stops every rank (WORLD_SIZE mismatch...): ranks waiting in join_store fail at
// once with `why`.
void publish_abort(c10d::Store& store, const std::string& why) noexcept;
std::optional<FailureRecord> read_failure(c10d::Store& store, int rank) noexcept;
// The failure behind this rank's own: the record of `peer` (of any other rank when peer < 0),
// polled for up to wait_s seconds (a peer that timed out at the same moment publishes a little
// later); {peer, own} when there is none.
FailureRecord root_failure(c10d::Store& store, int self, int world, int peer, const std::string& own, double wait_s);

// Hosts a rendezvous store outside any rank, so that every rank (rank 0 included) connects with
// connect_only = true: `gasloc launch` (the store outlives every rank) and tests that run ranks
// as threads of one process, with port 0 (the OS picks a free port; no race between choosing
// and binding it).
class StoreHost {
 public:
  StoreHost(const std::string& addr, int port, double timeout_s);
  ~StoreHost();
  StoreHost(const StoreHost&) = delete;
  StoreHost& operator=(const StoreHost&) = delete;
  int port() const;
  // The job's keys (where ranks publish failures; see FailureRecord).
  c10d::Store& store();

 private:
  c10::intrusive_ptr<c10d::Store> store_;
  int port_ = 0;
};

}  // namespace gasloc::comm
