// Pair transfers, written once: how one rank swaps a buffer with each of its peers over c10d
// send/recv. The process group (process_group.hpp: every peer in one group) and the elastic
// communicator (elastic_gloo.hpp: a two-rank group per pair) both move their bytes through
// transfer_pairs(); they differ only in what a failed peer means to them (the fixed world fails
// whole, an elastic round drops the edge).
//
// One call is two phases, each posted in full before anything is waited for:
//   1. header: (magic, numel, dtype) each way, so that both ends know the other's buffer before
//      any payload byte moves; a header that is not ours or announces another buffer is a
//      kMismatch naming both ranks, never a memory overrun;
//   2. payload: the caller's buffer, after the link's bandwidth limit has been paid for.
// Tags: both ends of a pair count the calls they made together (PairLink::calls) and tag each
// phase with that count and the phase, so that consecutive calls never mix; NCCL ignores tags and
// matches a pair's transfers in order, which the count follows too.
// Order: in the links' order, every receive is posted before any send (a receive's ready notice never queues behind
// this rank's payload, and both directions move at once), or, with pairs_in_order (NCCL, whose
// pair connections block both ends when first used), peers ascending, the lower rank of a pair
// sending first: no cycle of waits can form.
// Deadline: each phase's waits end timeout after it was posted.
// Abort: while a phase waits, a watch thread aborts the waits on a peer `gone` names (an elastic
// peer that left: a dead link sends no reset) and on every peer once `abort` is set
// (Pending::abort); both come back as kFailed.
// Sealed (a job with a secret, `seal`): each pair's call is a channel of its own
// (core/sealed_channel.hpp, AES-256-GCM under HKDF(secret, session salt, job, channel name)); the
// header travels sealed as the channel's first message and the payload as its second, so a
// header is believed only once it opened. A message that does not open ends that peer's call as
// `unopened`: nothing from it reaches `into`, and it is no evidence against the peer (anyone on
// the path can alter bytes), so callers neither blame nor fence it.
#pragma once
#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "gasloc/comm/process_group.hpp"
#include "gasloc/comm/token_bucket.hpp"

namespace gasloc::comm {

// One peer of a call, and the group its transfers go through.
struct PairLink {
  int peer = -1;                   // its id in the job: what results and messages name
  C10dBackend* group = nullptr;    // the c10d group carrying the pair's transfers
  int remote = -1;                 // the peer's rank inside `group`
  uint32_t* calls = nullptr;       // the calls this pair made together (both ends count alike)
  // 0: the caller's blocking calls; 1: an overlapped operation's, on a thread of its own beside
  // them. Each lane counts its own calls (`calls`) and has tags of its own, so that a blocking
  // call made while an overlapped one is in flight never takes the other's messages.
  int lane = 0;
};

// How the call went with one peer: a typed result, never an undefined tensor to guess from.
enum class PeerOutcome {
  received,   // its payload is in into[k]
  stood_by,   // it sent an empty buffer, or this rank did (stand_by_on_empty): nothing to receive
  mismatch,   // its header is not ours, or announces another buffer: `why` names both ranks
  failed,     // its link failed, timed out or was aborted: `why` has the backend's error whole
  unopened,   // a sealed message from it did not open: `why` names the channel; not the peer's fault
};
struct PeerResult {
  PeerOutcome outcome = PeerOutcome::received;
  bool timed_out = false;  // failed at the deadline (c10d said timeout, or it ended there)
  std::string why;
  bool ok() const { return outcome == PeerOutcome::received || outcome == PeerOutcome::stood_by; }
};

// The job's secret, the store's session salt (session_salt.hpp) and the job's token, and how a
// pair's call is named: both ends must give the same name, unique to the pair's incarnations and
// the call (e.g. "pg 0-3 call 17"), so that no key is used for two calls.
struct PairSealing {
  std::string secret, salt, job;
  std::function<std::string(const PairLink&, uint32_t call)> channel;
};

struct PairTransferOptions {
  int rank = 0;                                   // this rank's id, for messages
  std::chrono::milliseconds timeout{300'000};     // each phase's waits end this long after posting
  bool pairs_in_order = false;                    // NCCL's posting order (above)
  bool fail_fast = false;                         // stop at the first failed peer (the rest: not waited for)
  bool stand_by_on_empty = false;                 // an empty buffer stands by instead of mismatching
  torch::Device device{torch::kCPU};              // where the headers live (the backend's device)
  LinkLimit* limit = nullptr;                     // the rank's bandwidth limit, paid before the payload
  std::function<bool(int peer)> gone;             // polled while waiting: abort that peer's waits
  const std::atomic<bool>* abort = nullptr;       // set: abort every wait
  const PairSealing* seal = nullptr;              // set (a job with a secret): every message sealed
  std::vector<torch::Tensor>* seal_buffers = nullptr;  // sealing's buffers, kept by the caller (default: this thread's)
};

// Sends `send` to every link's peer and receives each peer's payload into into[k], which the
// caller has allocated like `send` (contiguous, on the backend's device). Returns one result per
// link, in links' order; bytes_moved (when given) gets the payload bytes sent to peers that
// received it, sealed size when sealed (the same count comes back from each of them). Never
// throws for a peer's failure.
std::vector<PeerResult> transfer_pairs(const std::vector<PairLink>& links, const torch::Tensor& send,
                                       std::vector<torch::Tensor>& into, const PairTransferOptions& o,
                                       int64_t* bytes_moved = nullptr);
// The same with a buffer of its own for each link (sends[k] to links[k]: the chunks of an
// all-to-all), all of one size and dtype, which the headers announce.
std::vector<PeerResult> transfer_pairs(const std::vector<PairLink>& links, const std::vector<torch::Tensor>& sends,
                                       std::vector<torch::Tensor>& into, const PairTransferOptions& o,
                                       int64_t* bytes_moved = nullptr);

// Slot `slot` of `pool`: `bytes` bytes on `device`, the front of a byte buffer kept from call to
// call at the largest size asked for, and replaced only while something else still holds it. A
// fresh buffer's pages each cost a page fault when first written (about 10 ms a 10 MB buffer on
// a virtual machine), several times what sealing them costs.
torch::Tensor kept_bytes(std::vector<torch::Tensor>& pool, size_t slot, int64_t bytes, torch::Device device = torch::kCPU);

// A dtype as messages name it ("float32"), from its c10::ScalarType number as headers carry it;
// a number that is none says so.
std::string dtype_name(int64_t scalar_type);

// A backend's error as a reason: its whole message (every line), without the backtrace c10 adds
// or Gloo's "[file.cc:123] " source prefixes, its ports decoded (gloo_ports_decoded).
std::string backend_error(const std::exception& e);

// Tests only: when a test program defines this function, every sealed message is handed to it
// after sealing, before it is sent (phase 0: header, 1: payload), to be altered or replaced in
// place as an attacker on the path would. The gasloc program does not define it.
extern "C" __attribute__((weak)) void gasloc_test_tamper_sealed(uint8_t* bytes, size_t n, int from_rank, int to_rank,
                                                                 int phase);

}  // namespace gasloc::comm
