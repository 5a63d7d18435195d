// How separate processes find each other: torchrun-style environment variables, the c10d
// TCPStore they meet at, and the choice of process backend (Gloo or NCCL).
//
// Every rank reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (set by `gasloc launch` or
// torchrun). The store is gasloc's own (store.hpp: every call bounded by cluster.timeout_s and
// interruptible, one job per store): `gasloc launch` hosts it and hands its ranks the job token
// (--job-id); ranks started by hand derive the token from their configuration and rank 0 hosts
// the store on MASTER_ADDR:MASTER_PORT. Under torchrun (TORCHELASTIC_USE_AGENT_STORE=True and no
// job token) the ranks use the agent's c10d TCPStore, whose calls LibTorch 1.13 does not bound.
// Every rank then registers and waits, with the timeout, until all WORLD_SIZE ranks have
// registered, so a rank that never starts is an error naming it instead of a hang.
#pragma once
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "gasloc/comm/communicator.hpp"
#include "gasloc/comm/store.hpp"

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
  int local_world = 1;              // ranks of the job on this host (LOCAL_WORLD_SIZE): they share its cores
  // The store at master_addr:master_port is hosted by someone else (gasloc launch, a test,
  // torchrun's agent), so rank 0 connects to it like every other rank instead of hosting it.
  bool connect_only = false;
  // That host is torchrun's agent: speak c10d's TCPStore protocol (no job token, no bounded
  // calls). Set from TORCHELASTIC_USE_AGENT_STORE; a job token handed in by gasloc launch clears it.
  bool agent_store = false;
  JobIdentity job;                     // presented to the store (ranks of one job present the same token)
  bool store_all_interfaces = false;   // rank 0 hosting: listen on every interface, not MASTER_ADDR's only
};

// Who hosts the store, for messages: "rank 0", "gasloc launch (or gasloc store)", "torchrun's agent".
std::string store_host_name(const GlooOptions& o);

// Reads the launcher's variables: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (required),
// LOCAL_RANK, LOCAL_WORLD_SIZE, GLOO_SOCKET_IFNAME and TORCHELASTIC_USE_AGENT_STORE. Everything else (timeout,
// bandwidth limit) comes from the job's configuration or the command line, never from gasloc's
// own variables. Throws ConfigError naming the variable and saying how to launch.
GlooOptions gloo_options_from_env();
// The same, reading variables through `lookup` (returns nullptr for an unset variable): tests.
GlooOptions gloo_options_from_env(const std::function<const char*(const char*)>& lookup);

// Parses a bandwidth limit (`--bandwidth-limit`) for `rank`: "1e8" (every rank) or "2=1e7,3=5e7"
// (listed ranks; others unlimited). Throws CommError on a malformed value.
double parse_bandwidth_limit(const std::string& spec, int rank);

// Before a rank listens: one line on stderr when it listens beyond loopback (MASTER_ADDR is not a
// loopback address, or GLOO_SOCKET_IFNAME is set) and the job has no secret. A secret with
// torchrun's agent store (which cannot be authenticated) is a ConfigError.
void check_job_secret(const GlooOptions& o);

// Checks the fields (rank in [0, world), port in range, positive timeout ...). join_store checks
// the rank's range itself, after joining, so that every rank hears of it.
void validate(const GlooOptions& o, bool check_rank = true);

// Connects this rank to the rendezvous store (hosting it on rank 0 unless connect_only), checks
// that every rank agrees on WORLD_SIZE and that no rank is claimed twice, and waits until all
// ranks have registered. Throws CommError naming missing ranks, a port in use, or an
// unreachable store.
c10::intrusive_ptr<c10d::Store> join_store(const GlooOptions& o);

// The job's keys in a store: under one prefix, so that a store shared with an agent (torchrun)
// that restarts workers does not mix attempts.
c10::intrusive_ptr<c10d::Store> job_keys(const c10::intrusive_ptr<c10d::Store>& store);

// Another connection of this rank to its job's keys in the store (gasloc's store only: not the
// agent's), for a thread that must not wait behind the rank's own calls (the heartbeat), or for
// an elastic rank, which meets its peers through the store alone. Calls wait at most
// min(o.timeout_s, max_timeout_s).
c10::intrusive_ptr<c10d::Store> job_keys_connection(const GlooOptions& o, double max_timeout_s = 10.0);
// The same, opened again after a call on it failed (store.hpp, ReconnectingStore): for a thread
// that talks to the store for the whole job, through a store host that may pause or drop a link.
c10::intrusive_ptr<c10d::Store> job_keys_reconnecting(const GlooOptions& o, double max_timeout_s = 10.0);

// Store-side arrival records of collectives: before its seq-th collective (counted from 1, the
// same on every rank) a rank records (seq, op) under its key; a collective that times out reads
// them and names the ranks that never arrived, instead of guessing. Never throws; a store that
// fails once is not asked again.
class Arrivals {
 public:
  Arrivals() = default;
  Arrivals(c10::intrusive_ptr<c10d::Store> store, int rank, int world) : store_(std::move(store)), rank_(rank), world_(world) {}
  // Records that this rank enters its next collective; returns its sequence number.
  int64_t arrive(const std::string& op) noexcept;
  // Ranks whose last recorded collective is before `seq` (at most `limit` are named), as text
  // such as "rank 2 (its last: #56 barrier)"; "" when none is known to be behind.
  std::string behind(int64_t seq, std::vector<int>* ranks = nullptr, int limit = 8) noexcept;

 private:
  c10::intrusive_ptr<c10d::Store> store_;
  int rank_ = 0, world_ = 1;
  int64_t seq_ = 0;
  bool off_ = false;
};

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
// and binding it). gasloc's store (ranks present `job`) unless c10d_protocol: c10d's TCPStore,
// for commands that are not gasloc's (torchrun-style agent store).
class StoreHost {
 public:
  StoreHost(const std::string& addr, int port, double timeout_s, const JobIdentity& job = {}, bool c10d_protocol = false,
            bool all_interfaces = false);
  ~StoreHost();
  StoreHost(const StoreHost&) = delete;
  StoreHost& operator=(const StoreHost&) = delete;
  int port() const;
  // The job's keys (where ranks publish failures; see FailureRecord).
  c10d::Store& store();

 private:
  std::unique_ptr<StoreServer> server_;
  c10::intrusive_ptr<c10d::Store> store_;
  int port_ = 0;
};

}  // namespace gasloc::comm
