// gasloc's rendezvous store: a small key-value server and its client, both c10d::Store, so that
// ProcessGroupGloo meets its peers through it like through c10d's TCPStore.
//
// Why not c10d's TCPStore (LibTorch 1.13): its client blocks in recv() without a deadline when
// the server accepts connections but never answers (a SIGSTOPped store host, a foreign program
// on the port), ignoring cluster.timeout_s and SIGTERM; its server listens on every interface;
// and it cannot tell two jobs on one port apart. Here:
// - every client call ends within the client's timeout (getTimeout(); c10d's setTimeout changes
//   it) and, after it has waited a moment, when the user asks to stop (core/interrupt.hpp): it
//   then throws CommError naming the call and the store's address;
// - the server binds to the address it is given (every interface only when asked);
// - a job token: each client presents one when it connects; the server serves one job (the
//   token it was made with, or the first one presented) and refuses another, naming both jobs;
// - a job secret (cluster.secret_file, core/secret.hpp), when the job has one: both ends prove
//   they hold it before any request is applied, and every request and reply then carries a
//   sequence number and a MAC under a key of that connection (store_auth below). A failed check
//   closes that connection only; a client without the secret, or with another, is refused at
//   once with an AuthError (a ConfigError) naming cluster.secret_file.
// get() waits for its key like TCPStore's; wait() polls check().
//
// Wire format (both directions): u32 payload length, then the payload: u8 code, u32 field
// count, then each field as u32 length + bytes. Integers travel as decimal text. A frame over
// kMaxFrameBytes or that does not parse closes that client's connection; the server goes on.
// Before a client proved itself only the handshake's short frames are read (kMaxHandshakeBytes).
#pragma once
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace gasloc::comm {

// Who may use a store: a job's token and, for messages, what the job is ("gasloc launch pid 42",
// "train run_dir=runs/a"); with a secret, only its holders.
struct JobIdentity {
  std::string token;
  std::string label;
  std::string secret;  // the job's secret (read_secret_file's bytes); empty: no authentication
};

// Derives a job token from text that every rank of one job shares (its resolved configuration
// and run directory, for ranks started by hand): 16 hex digits of its 64-bit checksum.
std::string derive_job_token(const std::string& shared_text);
// A fresh random token (gasloc launch draws one per job).
std::string random_job_token();

// What a connection may cost the store before it proved itself (its greeting without a secret,
// store_auth's handshake with one), so that a flood of connections that never do cannot lock the
// job's own ranks out (docs/communication.md, "Authenticated jobs"):
constexpr auto kHandshakeTimeout = std::chrono::seconds(5);  // it is closed when not proven by then
constexpr size_t kMaxUnprovenConnections = 1024;             // the oldest is closed to admit one more
constexpr uint32_t kMaxHandshakeBytes = 1024;                // a longer frame before the proof closes it
constexpr size_t kMaxIdentityBytes = 256;                    // a job token's bytes; labels and ids are cut to it

struct StoreServerOptions {
  std::string addr = "127.0.0.1";  // bound; "" or all_interfaces: every interface
  int port = 0;                    // 0: the OS picks a free one (port() says which)
  bool all_interfaces = false;     // listen on 0.0.0.0 / :: whatever addr says
  JobIdentity job;                 // empty token: the first client's token pins the job
  std::chrono::milliseconds handshake_timeout = kHandshakeTimeout;
  size_t max_unproven = kMaxUnprovenConnections;
};

class StoreServer {
 public:
  // Binds and starts serving on a thread of its own. Throws CommError (port in use, an address
  // of no local interface).
  explicit StoreServer(const StoreServerOptions& o);
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;
  int port() const;
  // The numeric address it listens on ("127.0.0.1", "0.0.0.0", "::").
  std::string address() const;
  // The server's keys without a socket (the host process's own view: it never waits on itself).
  c10::intrusive_ptr<c10d::Store> local();
  // The job the store serves ("" until a client presented a token, when none was given).
  JobIdentity job() const;

  struct State;

 private:
  std::shared_ptr<State> state_;
  std::unique_ptr<struct ServerLoop> loop_;
};

class StoreClient final : public c10d::Store {
 public:
  // Connects to addr:port, retrying until `timeout` (the host may start after this process, or
  // close the connection during the greeting when flooded), and presents `job`. Throws CommError
  // (unreachable, no answer), ConfigError (another job's store, a token over kMaxIdentityBytes),
  // AuthError (another secret).
  StoreClient(const std::string& addr, int port, std::chrono::milliseconds timeout, const JobIdentity& job);
  ~StoreClient() override;

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;
  std::string where() const;
  // LibTorch 2.x declares c10d::Store::clone() (a handle to the same store for another thread);
  // written without `override` so that 1.13, which has none, compiles it as a new function.
  // A new connection to the same store, presenting the same job (a connection is one thread's).
  virtual c10::intrusive_ptr<c10d::Store> clone();

  struct Conn;

 private:
  // The greeting, and with a secret the handshake, on the connection just opened; throws
  // CommError, AuthError (another secret) or ConfigError (another job).
  void greet(std::chrono::milliseconds timeout);
  std::unique_ptr<Conn> conn_;
  JobIdentity job_;
};

// A connection that is opened again after a failure: a StoreClient is unusable once a call on it
// failed (a host that was paused past the call's timeout, a dropped link), and a thread that must
// go on talking to the store for the whole job (the heartbeat, the abort watch) would otherwise
// stay silent for good. The call that failed still throws its CommError; the next call opens a
// new connection first (and throws if that fails). For idempotent uses: a failed add() may have
// been applied.
class ReconnectingStore final : public c10d::Store {
 public:
  using Open = std::function<c10::intrusive_ptr<c10d::Store>()>;
  // Opens the first connection now (throws as `open` does).
  explicit ReconnectingStore(Open open);
  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;
  // Connections opened after the first (each after a failure).
  int64_t reconnects() const { return reconnects_; }
  // LibTorch 2.x declares c10d::Store::clone() (a handle to the same store for another thread);
  // written without `override` so that 1.13, which has none, compiles it as a new function.
  // A store of its own connections, opened the same way.
  virtual c10::intrusive_ptr<c10d::Store> clone();

 private:
  template <class F>
  auto with(F&& f) -> decltype(f(std::declval<c10d::Store&>()));
  Open open_;
  c10::intrusive_ptr<c10d::Store> conn_;
  int64_t reconnects_ = 0;
};

// True for an address that only this host reaches ("localhost", 127.x.y.z, "::1").
bool is_loopback(const std::string& addr);

// A store value from text and back (c10d stores hold bytes).
std::vector<uint8_t> to_bytes(const std::string& s);
std::string to_text(const std::vector<uint8_t>& b);

// Codes of the wire format (exposed for tests that speak it by hand).
enum class StoreOp : uint8_t { kHello = 1, kSet, kGet, kAdd, kCompareSet, kDelete, kCheck, kNumKeys, kAuthHello, kAuthProof };
enum class StoreStatus : uint8_t { kOk = 0, kNotFound = 1, kError = 2 };
constexpr uint32_t kMaxFrameBytes = 1u << 30;
// One frame of the wire format.
std::string encode_frame(uint8_t code, const std::vector<std::string>& fields);

// The store's authentication with a job secret (docs/communication.md, "Authenticated jobs";
// ../shared design section 13), exposed for tests that speak it by hand:
//   client: kAuthHello {token, label}          server: kOk {N_s}      (16 random bytes)
//   client: kAuthProof {id, N_c, client_proof} server: kOk {server_proof}
// with K_store = HKDF(secret, "gasloc store" | len(job) | job) and the proofs HMACs under it of
// ("c" | N_s | N_c | id | job) and ("s" | N_c | N_s | id | job): the client proves first, so the
// server answers nobody's challenge before they proved the secret. The connection's key is
// K_c = HMAC(K_store, "conn" | N_s | N_c | id); every later frame is sealed under it. The server
// pins its job only once a client proved the secret, and tells nothing about it before (not its
// token, label, launcher or run directory: a client of another job learns that it is one only
// after its proof). A refusal of the secret is a kError reply whose second field is "auth".
namespace store_auth {
constexpr size_t kNonceBytes = 16;
constexpr size_t kTagBytes = 16;  // a truncated HMAC-SHA256
std::string store_key(const std::string& secret, const std::string& job_token);
std::string client_proof(const std::string& k_store, const std::string& n_s, const std::string& n_c, const std::string& id,
                         const std::string& job_token);
std::string server_proof(const std::string& k_store, const std::string& n_s, const std::string& n_c, const std::string& id,
                         const std::string& job_token);
std::string connection_key(const std::string& k_store, const std::string& n_s, const std::string& n_c, const std::string& id);
// A sealed frame: a frame whose payload (code, fields) is followed by the sequence number (u64,
// little-endian) and kTagBytes of HMAC(K_c, direction | sequence | payload). Direction 'q': a
// request (the client's n-th carries n, from 0), 'r': the reply (the request's number).
std::string seal_frame(const std::string& k_conn, char direction, uint64_t seq, uint8_t code,
                       const std::vector<std::string>& fields);
// Opens a sealed frame's payload (the bytes after its length) into `payload` (code and fields);
// false, with `why` set, when its sequence number is not `seq` or its tag does not verify.
bool open_payload(const std::string& k_conn, char direction, uint64_t seq, const std::string& sealed, std::string& payload,
                  std::string& why);
}  // namespace store_auth

}  // namespace gasloc::comm
