#include "gasloc/comm/store.hpp"
#include "gasloc/comm/session_salt.hpp"

#include <fcntl.h>
#include <arpa/inet.h>
#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <spdlog/spdlog.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <list>
#include <map>
#include <optional>
#include <mutex>
#include <random>
#include <thread>

#include "gasloc/core/checksum.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/core/interrupt.hpp"
#include "gasloc/core/secret.hpp"

namespace gasloc::comm {

using Clock = std::chrono::steady_clock;

namespace {

// A call blocked this long gives way to a stop request; shorter ones (every normal call) finish,
// so that a graceful stop's own store calls are not cut.
constexpr auto kInterruptAfter = std::chrono::milliseconds(500);
constexpr int kSliceMs = 100;

std::string errno_text(int e) { return std::strerror(e); }

void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint32_t get_u32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

// Parses a payload (the bytes after the length); false when it is not one of ours.
bool parse_payload(const std::string& p, uint8_t& code, std::vector<std::string>& fields) {
  if (p.size() < 5) return false;
  code = static_cast<uint8_t>(p[0]);
  const uint32_t n = get_u32(p.data() + 1);
  size_t at = 5;
  fields.clear();
  for (uint32_t k = 0; k < n; ++k) {
    if (p.size() - at < 4) return false;
    const uint32_t len = get_u32(p.data() + at);
    at += 4;
    if (p.size() - at < len) return false;
    fields.emplace_back(p.data() + at, len);
    at += len;
  }
  return at == p.size();
}

bool parse_i64(const std::string& s, int64_t& out) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || end != s.c_str() + s.size()) return false;
  out = v;
  return true;
}

struct Reply {
  StoreStatus status = StoreStatus::kOk;
  std::vector<std::string> fields;
};

void set_nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

std::string describe_job(const JobIdentity& j) {
  return fmt::format("job {}{}", j.token, j.label.empty() ? "" : " (" + j.label + ")");
}

// A token must fit the greeting's short frame (kMaxHandshakeBytes); a label is only for messages.
void check_job_token(const std::string& token) {
  if (token.size() > kMaxIdentityBytes)
    throw ConfigError(fmt::format("the job token has {} bytes; a gasloc store takes at most {}", token.size(), kMaxIdentityBytes),
                      "give a shorter --job-id");
}
std::string short_identity(const std::string& label) { return label.substr(0, kMaxIdentityBytes); }

}  // namespace

bool is_loopback(const std::string& a) { return a == "localhost" || a.rfind("127.", 0) == 0 || a == "::1"; }

std::vector<uint8_t> to_bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string to_text(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

namespace {
std::string encode_payload(uint8_t code, const std::vector<std::string>& fields) {
  std::string payload(1, static_cast<char>(code));
  put_u32(payload, static_cast<uint32_t>(fields.size()));
  for (const auto& f : fields) {
    put_u32(payload, static_cast<uint32_t>(f.size()));
    payload += f;
  }
  return payload;
}

std::string with_length(const std::string& payload) {
  std::string out;
  put_u32(out, static_cast<uint32_t>(payload.size()));
  return out + payload;
}

void put_u64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t get_u64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

// Text with its length first, so that concatenated parts cannot be re-cut.
std::string framed(const std::string& s) {
  std::string out;
  put_u32(out, static_cast<uint32_t>(s.size()));
  return out + s;
}

std::string frame_tag(const std::string& k_conn, char direction, uint64_t seq, const std::string& payload) {
  std::string head(1, direction);
  put_u64(head, seq);
  return crypto::hmac_sha256(k_conn, head + payload).substr(0, store_auth::kTagBytes);
}
}  // namespace

std::string encode_frame(uint8_t code, const std::vector<std::string>& fields) {
  return with_length(encode_payload(code, fields));
}

namespace store_auth {

std::string store_key(const std::string& secret, const std::string& job_token) {
  return crypto::hkdf_sha256(secret, "", "gasloc store" + framed(job_token), 32);
}
std::string client_proof(const std::string& k_store, const std::string& n_s, const std::string& n_c, const std::string& id,
                         const std::string& job_token) {
  return crypto::hmac_sha256(k_store, "c" + n_s + n_c + framed(id) + framed(job_token));
}
std::string server_proof(const std::string& k_store, const std::string& n_s, const std::string& n_c, const std::string& id,
                         const std::string& job_token) {
  return crypto::hmac_sha256(k_store, "s" + n_c + n_s + framed(id) + framed(job_token));
}
std::string connection_key(const std::string& k_store, const std::string& n_s, const std::string& n_c, const std::string& id) {
  return crypto::hmac_sha256(k_store, "conn" + n_s + n_c + framed(id));
}

std::string seal_frame(const std::string& k_conn, char direction, uint64_t seq, uint8_t code,
                       const std::vector<std::string>& fields) {
  std::string payload = encode_payload(code, fields);
  const std::string tag = frame_tag(k_conn, direction, seq, payload);
  put_u64(payload, seq);
  return with_length(payload + tag);
}

bool open_payload(const std::string& k_conn, char direction, uint64_t seq, const std::string& sealed, std::string& payload,
                  std::string& why) {
  if (sealed.size() < 8 + kTagBytes) {
    why = "a frame too short to carry a MAC";
    return false;
  }
  const size_t body = sealed.size() - 8 - kTagBytes;
  const uint64_t got = get_u64(sealed.data() + body);
  if (got != seq) {
    why = fmt::format("sequence number {} where {} was due (a replayed or reordered message)", got, seq);
    return false;
  }
  payload = sealed.substr(0, body);
  if (!crypto::equal(frame_tag(k_conn, direction, seq, payload), sealed.substr(body + 8))) {
    why = "its MAC does not verify (altered in transit, or sealed under another connection's key)";
    return false;
  }
  return true;
}

}  // namespace store_auth

std::string derive_job_token(const std::string& shared_text) {
  Checksum c;
  c.update(shared_text.data(), shared_text.size());
  return c.hex();
}

std::string random_job_token() {
  std::random_device rd;
  const uint64_t v = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(Clock::now().time_since_epoch().count());
  return fmt::format("{:016x}", v);
}

// ---------------------------------------------------------------------------------------------
// The keys and the one function that applies a request to them (the server and local() share it).

struct StoreServer::State {
  mutable std::mutex m;
  std::condition_variable changed;
  std::map<std::string, std::string> kv;
  JobIdentity job;     // its secret stays empty: the secret is below
  std::string secret;  // set before the server starts, never changed: read without the lock
  std::string salt;    // session_salt.hpp: drawn with the secret before the server starts, never changed

  // Whether `key` is there; the caller holds the lock.
  bool has(const std::string& key) const { return key == kSessionSaltKey ? !salt.empty() : kv.count(key) > 0; }

  Reply apply(StoreOp op, const std::vector<std::string>& f) {
    std::lock_guard<std::mutex> lock(m);
    auto need = [&](size_t n) {
      if (f.size() != n) throw Error(fmt::format("malformed request: {} fields where {} belong", f.size(), n));
    };
    // The session salt is read-only and not among the keys.
    if (!f.empty() && f[0] == kSessionSaltKey && op != StoreOp::kCheck) {
      if (op != StoreOp::kGet) throw Error(fmt::format("'{}' is the store host's own and read-only", kSessionSaltKey));
      need(1);
      if (salt.empty()) return {StoreStatus::kNotFound, {}};
      return {StoreStatus::kOk, {salt}};
    }
    switch (op) {
      case StoreOp::kSet:
        need(2);
        kv[f[0]] = f[1];
        changed.notify_all();
        return {};
      case StoreOp::kGet: {
        need(1);
        const auto it = kv.find(f[0]);
        if (it == kv.end()) return {StoreStatus::kNotFound, {}};
        return {StoreStatus::kOk, {it->second}};
      }
      case StoreOp::kAdd: {
        need(2);
        int64_t delta = 0, now = 0;
        if (!parse_i64(f[1], delta)) throw Error("add: the increment is not an integer");
        const auto it = kv.find(f[0]);
        if (it != kv.end() && !parse_i64(it->second, now))
          throw Error(fmt::format("add: key '{}' holds a value that is not an integer", f[0]));
        kv[f[0]] = std::to_string(now + delta);
        changed.notify_all();
        return {StoreStatus::kOk, {std::to_string(now + delta)}};
      }
      case StoreOp::kCompareSet: {
        // c10d's semantics: a missing key is set when the expected value is empty; the answer is
        // the value the key holds afterwards (or the expected value, for a missing key not set).
        need(3);
        const auto it = kv.find(f[0]);
        if (it == kv.end()) {
          if (!f[1].empty()) return {StoreStatus::kOk, {f[1]}};
          kv[f[0]] = f[2];
          changed.notify_all();
          return {StoreStatus::kOk, {f[2]}};
        }
        if (it->second == f[1]) {
          it->second = f[2];
          changed.notify_all();
        }
        return {StoreStatus::kOk, {it->second}};
      }
      case StoreOp::kDelete:
        need(1);
        return {StoreStatus::kOk, {kv.erase(f[0]) > 0 ? "1" : "0"}};
      case StoreOp::kCheck:
        for (const auto& k : f)
          if (!has(k)) return {StoreStatus::kOk, {"0"}};
        return {StoreStatus::kOk, {"1"}};
      case StoreOp::kNumKeys:
        return {StoreStatus::kOk, {std::to_string(kv.size())}};
      default:
        throw Error(fmt::format("unknown request code {}", static_cast<int>(op)));
    }
  }

  // The first token presented pins the job when the host gave none (with a secret: the first
  // token of a client that proved it; nobody is told about the job before).
  Reply hello(const std::vector<std::string>& f) {
    if (f.size() != 2) throw Error("malformed hello");
    std::lock_guard<std::mutex> lock(m);
    if (job.token.empty()) job.token = f[0], job.label = f[1];
    if (f[0] == job.token) return {};
    return {StoreStatus::kError,
            {fmt::format("this store serves {}, not {}", describe_job(job), describe_job({f[0], f[1], {}}))}};
  }
};

// ---------------------------------------------------------------------------------------------
// The server: one thread, poll() over the listening socket, a wake pipe and the clients.

namespace {
// Connections accepted in one go before the clients' requests are served again.
constexpr int kAcceptBatch = 64;
// Out of file descriptors with every one held by a proven client: accepting waits this long.
constexpr auto kAcceptPause = std::chrono::milliseconds(100);
// Connections closed before they proved themselves are logged as a count at most this often.
constexpr auto kShedLogEvery = std::chrono::seconds(10);
}  // namespace

struct ServerLoop {
  struct Client {
    int fd = -1;
    std::string in, out;
    std::string peer;      // its address, for the log
    bool closing = false;  // closed once `out` is sent; nothing more is read
    // Proven: greeted (without a secret) or authenticated (with one). Until then it is on
    // `unproven`, and closed at its deadline or when the cap is reached and it is the oldest.
    bool proven = false;
    Clock::time_point deadline;
    std::list<int>::iterator queued;
    // With a secret (store_auth): where the handshake stands, and the connection's keys.
    enum class Phase { kNew, kChallenged } phase = Phase::kNew;
    std::string token, label, id, k_store, n_s, k_conn;
    uint64_t seq = 0;  // the next request's sequence number
  };
  std::shared_ptr<StoreServer::State> state;
  std::chrono::milliseconds handshake_timeout = kHandshakeTimeout;
  size_t max_unproven = kMaxUnprovenConnections;
  int listen_fd = -1, port = 0;
  std::string address;
  int wake[2] = {-1, -1};
  std::thread thread;
  std::map<int, Client> clients;
  std::list<int> unproven;                  // the unproven clients' fds, the oldest first
  Clock::time_point accept_paused_until{};  // out of file descriptors: listen_fd rests until then
  int64_t shed = 0;                         // unproven connections closed since the last log line
  Clock::time_point shed_logged{};

  ~ServerLoop() {
    if (thread.joinable()) {
      const char c = 1;
      [[maybe_unused]] auto n = ::write(wake[1], &c, 1);
      thread.join();
    }
    for (int fd : {listen_fd, wake[0], wake[1]})
      if (fd >= 0) ::close(fd);
  }

  void mark_proven(Client& c) {
    if (c.proven) return;
    unproven.erase(c.queued);
    c.proven = true;
  }

  void drop(int fd) {
    const auto it = clients.find(fd);
    if (it == clients.end()) return;
    if (!it->second.proven) unproven.erase(it->second.queued);
    ::close(fd);
    clients.erase(it);
  }

  // Closes the oldest unproven connection (its deadline passed, or room is needed); logged as a
  // count, since a flood closes thousands.
  void shed_oldest(const char* why) {
    drop(unproven.front());
    ++shed;
    if (const auto now = Clock::now(); now - shed_logged >= kShedLogEvery) {
      spdlog::warn("gasloc store: closed {} connection(s) that had not proved themselves ({}; the last {} s at most); "
                   "a flood of connections, or a client that cannot finish its greeting",
                   shed, why, std::chrono::duration_cast<std::chrono::seconds>(kShedLogEvery).count());
      shed = 0;
      shed_logged = now;
    }
  }

  void admit(int fd, const sockaddr_storage& ss, socklen_t sl) {
    if (unproven.size() >= max_unproven) shed_oldest("the cap on unproven connections was reached");
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    Client& c = clients[fd];
    c.fd = fd;
    c.deadline = Clock::now() + handshake_timeout;
    c.queued = unproven.insert(unproven.end(), fd);
    char host[NI_MAXHOST] = {0}, serv[NI_MAXSERV] = {0};
    if (::getnameinfo(reinterpret_cast<const sockaddr*>(&ss), sl, host, sizeof host, serv, sizeof serv,
                      NI_NUMERICHOST | NI_NUMERICSERV) == 0)
      c.peer = ss.ss_family == AF_INET6 ? fmt::format("[{}]:{}", host, serv) : fmt::format("{}:{}", host, serv);
  }

  // Accepts a batch of waiting connections. Out of file descriptors, the oldest unproven
  // connection makes room; with none, the listening socket rests a moment instead of waking
  // poll() at once again (a busy loop).
  void accept_pending() {
    for (int k = 0; k < kAcceptBatch; ++k) {
      sockaddr_storage ss{};
      socklen_t sl = sizeof ss;
      const int fd = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&ss), &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd >= 0) {
        admit(fd, ss, sl);
        continue;
      }
      if (errno == ECONNABORTED || errno == EINTR) continue;
      const bool out_of_fds = errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM;
      if (out_of_fds && !unproven.empty()) {
        shed_oldest("out of file descriptors");
        continue;
      }
      if (out_of_fds) accept_paused_until = Clock::now() + kAcceptPause;
      return;
    }
  }

  void close_expired() {
    const auto now = Clock::now();
    while (!unproven.empty() && clients.at(unproven.front()).deadline <= now)
      shed_oldest("they did not finish their greeting in time");
  }

  // How long poll() may sleep: until the oldest unproven connection's deadline, or the end of a
  // pause in accepting; -1 (until something happens) without either.
  int poll_timeout_ms() const {
    std::optional<Clock::time_point> next;
    if (!unproven.empty()) next = clients.at(unproven.front()).deadline;
    if (accept_paused_until != Clock::time_point{}) next = std::min(next.value_or(accept_paused_until), accept_paused_until);
    if (!next) return -1;
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(*next - Clock::now()).count();
    return static_cast<int>(std::clamp<int64_t>(ms + 1, 0, 60'000));  // +1: not awake just before it
  }

  Reply serve(Client& c, uint8_t code, const std::vector<std::string>& fields) {
    try {
      const auto op = static_cast<StoreOp>(code);
      if (op == StoreOp::kAuthHello) {
        c.closing = true;
        return {StoreStatus::kError,
                {"this store has no secret, but the client presented one (cluster.secret_file): start the store's host "
                 "with the same secret (gasloc launch --secret-file FILE, gasloc store --secret-file FILE)",
                 "auth"}};
      }
      if (op == StoreOp::kHello) {
        Reply r = state->hello(fields);
        if (r.status == StoreStatus::kOk) mark_proven(c);
        else c.closing = true;
        return r;
      }
      if (!c.proven) {
        c.closing = true;
        return {StoreStatus::kError, {"say hello first (another program speaking to a gasloc store?)"}};
      }
      return state->apply(op, fields);
    } catch (const std::exception& e) {
      return {StoreStatus::kError, {e.what()}};
    }
  }

  // A refusal that the client reads before its connection is closed.
  void refuse(Client& c, const std::string& why, const char* kind = "auth") {
    c.out += encode_frame(static_cast<uint8_t>(StoreStatus::kError), {why, kind});
    c.closing = true;
  }
  std::string who(const Client& c) const { return c.id.empty() ? c.peer : fmt::format("{} ({})", c.peer, c.id); }

  // One frame's payload on a store with a secret (store_auth); false: close the connection now,
  // nothing applied.
  bool serve_secured(Client& c, const std::string& p) {
    using Phase = Client::Phase;
    uint8_t code = 0;
    std::vector<std::string> f;
    if (c.proven) {
      std::string payload, why;
      if (!store_auth::open_payload(c.k_conn, 'q', c.seq, p, payload, why)) {
        spdlog::warn("gasloc store: closed the connection of {}: a request failed its check: {}; nothing applied", who(c),
                     why);
        return false;
      }
      if (!parse_payload(payload, code, f)) return false;
      const auto op = static_cast<StoreOp>(code);
      Reply r;
      if (op == StoreOp::kHello || op == StoreOp::kAuthHello || op == StoreOp::kAuthProof) {
        r = {StoreStatus::kError, {"already authenticated"}};
      } else {
        try {
          r = state->apply(op, f);
        } catch (const std::exception& e) {
          r = {StoreStatus::kError, {e.what()}};
        }
      }
      c.out += store_auth::seal_frame(c.k_conn, 'r', c.seq++, static_cast<uint8_t>(r.status), r.fields);
      return true;
    }
    if (!parse_payload(p, code, f)) return false;
    const auto op = static_cast<StoreOp>(code);
    if (c.phase == Phase::kNew && op == StoreOp::kHello) {
      spdlog::warn("gasloc store: refused {}: it presented no secret, and this job has one", who(c));
      refuse(c, fmt::format("this store's job has a secret: a process takes part only with the job's secret file "
                            "(cluster.secret_file)"));
      return true;
    }
    // Whether the token is this store's job is told only after the proof: a stranger learns
    // nothing about the job here, not even whether it guessed its token.
    if (c.phase == Phase::kNew && op == StoreOp::kAuthHello && f.size() == 2) {
      c.token = f[0];
      c.label = f[1];
      c.k_store = store_auth::store_key(state->secret, c.token);
      c.n_s = crypto::random_bytes(store_auth::kNonceBytes);
      c.out += encode_frame(static_cast<uint8_t>(StoreStatus::kOk), {c.n_s});
      c.phase = Phase::kChallenged;
      return true;
    }
    if (c.phase == Phase::kChallenged && op == StoreOp::kAuthProof && f.size() == 3 &&
        f[1].size() == store_auth::kNonceBytes) {
      c.id = f[0].substr(0, kMaxIdentityBytes);
      const std::string& n_c = f[1];
      if (!crypto::equal(store_auth::client_proof(c.k_store, c.n_s, n_c, f[0], c.token), f[2])) {
        spdlog::warn("gasloc store: refused {}: its proof of the job's secret did not verify (another secret file)", who(c));
        refuse(c, "the client's proof of the job's secret did not verify: it holds another secret than this store "
                  "(cluster.secret_file)");
        return true;
      }
      if (Reply r = state->hello({c.token, c.label}); r.status != StoreStatus::kOk) {
        refuse(c, r.fields.at(0), "job");
        return true;
      }
      c.k_conn = store_auth::connection_key(c.k_store, c.n_s, n_c, f[0]);
      c.out += encode_frame(static_cast<uint8_t>(StoreStatus::kOk),
                            {store_auth::server_proof(c.k_store, c.n_s, n_c, f[0], c.token)});
      mark_proven(c);
      return true;
    }
    spdlog::warn("gasloc store: closed the connection of {}: a request (code {}) before it proved the job's secret; "
                 "nothing applied",
                 who(c), static_cast<int>(code));
    return false;
  }

  // Handles every complete frame in c.in; false when the client sent garbage (drop it).
  bool handle_input(Client& c) {
    for (;;) {
      if (c.closing) {
        c.in.clear();
        return true;
      }
      if (c.in.size() < 4) return true;
      const uint32_t len = get_u32(c.in.data());
      if (len > kMaxFrameBytes) return false;
      // Before it proved itself, a client sends only the short frames of the greeting or the
      // handshake: it cannot make the store hold more than one of them for it.
      if (!c.proven && len > kMaxHandshakeBytes) return false;
      if (c.in.size() < 4 + static_cast<size_t>(len)) return true;
      const std::string p = c.in.substr(4, len);
      c.in.erase(0, 4 + static_cast<size_t>(len));
      if (!state->secret.empty()) {
        if (!serve_secured(c, p)) return false;
        continue;
      }
      uint8_t code = 0;
      std::vector<std::string> fields;
      if (!parse_payload(p, code, fields)) return false;
      const Reply r = serve(c, code, fields);
      c.out += encode_frame(static_cast<uint8_t>(r.status), r.fields);
    }
  }

  // Reads, serves and writes what poll() found for one client; false: close it.
  bool serve_events(Client& c, short revents) {
    if (revents & (POLLERR | POLLNVAL)) return false;
    if (revents & (POLLIN | POLLHUP)) {
      char buf[65536];
      // Before its proof a client's input is read a handshake frame at a time: c.in stays small.
      const size_t room = c.proven ? sizeof buf : kMaxHandshakeBytes + 4;
      const ssize_t n = ::recv(c.fd, buf, room, 0);
      if (n > 0) {
        c.in.append(buf, static_cast<size_t>(n));
        if (!handle_input(c)) return false;
      } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
        return false;
      }
    }
    if (!c.out.empty()) {
      const ssize_t n = ::send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL);
      if (n > 0) c.out.erase(0, static_cast<size_t>(n));
      else if (n < 0 && errno != EAGAIN && errno != EINTR) return false;
    }
    return !(c.closing && c.out.empty());
  }

  void run() {
    for (;;) {
      const bool accepting = Clock::now() >= accept_paused_until;
      if (accepting) accept_paused_until = {};
      std::vector<pollfd> fds{{wake[0], POLLIN, 0}, {accepting ? listen_fd : -1, POLLIN, 0}};
      for (auto& [fd, c] : clients) fds.push_back({fd, static_cast<short>(POLLIN | (c.out.empty() ? 0 : POLLOUT)), 0});
      if (::poll(fds.data(), fds.size(), poll_timeout_ms()) < 0 && errno != EINTR) break;
      if (fds[0].revents) break;
      // Clients first, then new connections (which may close the oldest unproven ones): a fd in
      // fds is never one that was closed and handed out again by accept() meanwhile.
      for (size_t k = 2; k < fds.size(); ++k) {
        const auto it = clients.find(fds[k].fd);
        if (it != clients.end() && fds[k].revents != 0 && !serve_events(it->second, fds[k].revents)) drop(fds[k].fd);
      }
      if (fds[1].revents & POLLIN) accept_pending();
      close_expired();
    }
    for (auto& [fd, c] : clients) ::close(fd);
  }
};

namespace {

// The host process's own view of the keys: no socket, so it never waits on itself.
class LocalStore final : public c10d::Store {
 public:
  explicit LocalStore(std::shared_ptr<StoreServer::State> s) : s_(std::move(s)) {}
  // LibTorch 2.x declares c10d::Store::clone() (a handle to the same store for another thread);
  // written without `override` so that 1.13, which has none, compiles it as a new function.
  // The keys' state is locked by every call: this store is its own clone.
  virtual c10::intrusive_ptr<c10d::Store> clone() { return c10::intrusive_ptr<c10d::Store>::reclaim_copy(this); }
  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    s_->apply(StoreOp::kSet, {key, to_text(value)});
  }
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override {
    return to_bytes(s_->apply(StoreOp::kCompareSet, {key, to_text(expected), to_text(desired)}).fields.at(0));
  }
  std::vector<uint8_t> get(const std::string& key) override {
    wait({key});
    return to_bytes(s_->apply(StoreOp::kGet, {key}).fields.at(0));
  }
  int64_t add(const std::string& key, int64_t value) override {
    return std::stoll(s_->apply(StoreOp::kAdd, {key, std::to_string(value)}).fields.at(0));
  }
  bool deleteKey(const std::string& key) override { return s_->apply(StoreOp::kDelete, {key}).fields.at(0) == "1"; }
  bool check(const std::vector<std::string>& keys) override {
    return s_->apply(StoreOp::kCheck, keys).fields.at(0) == "1";
  }
  int64_t getNumKeys() override { return std::stoll(s_->apply(StoreOp::kNumKeys, {}).fields.at(0)); }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    const auto deadline = Clock::now() + timeout;
    std::unique_lock<std::mutex> lock(s_->m);
    auto all = [&] {
      for (const auto& k : keys)
        if (!s_->has(k)) return false;
      return true;
    };
    while (!all()) {
      if (Clock::now() >= deadline)
        throw CommError(fmt::format("waited {} ms for key '{}' in the store", timeout.count(), keys.empty() ? "" : keys[0]));
      s_->changed.wait_until(lock, std::min(deadline, Clock::now() + std::chrono::milliseconds(kSliceMs)));
    }
  }

 private:
  std::shared_ptr<StoreServer::State> s_;
};

}  // namespace

StoreServer::StoreServer(const StoreServerOptions& o)
    : state_(std::make_shared<State>()), loop_(std::make_unique<ServerLoop>()) {
  check_job_token(o.job.token);
  state_->job = {o.job.token, o.job.label, {}};
  state_->secret = o.job.secret;
  if (!o.job.secret.empty()) state_->salt = crypto::random_bytes(kSessionSaltBytes);
  loop_->state = state_;
  loop_->handshake_timeout = o.handshake_timeout;
  loop_->max_unproven = std::max<size_t>(1, o.max_unproven);
  const bool any = o.all_interfaces || o.addr.empty();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const std::string port = std::to_string(o.port);
  if (const int rc = ::getaddrinfo(any ? nullptr : o.addr.c_str(), port.c_str(), &hints, &res); rc != 0)
    throw CommError(fmt::format("cannot host the rendezvous store on {}:{}: {}", o.addr, o.port, ::gai_strerror(rc)),
                    "give an address of this host (MASTER_ADDR, gasloc launch --master-addr)");
  int err = 0;
  for (addrinfo* a = res; a != nullptr && loop_->listen_fd < 0; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 1024) == 0) {
      loop_->listen_fd = fd;
      sockaddr_storage ss{};
      socklen_t len = sizeof ss;
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
      loop_->port = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                                   : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
      char host[NI_MAXHOST] = {0};
      if (::getnameinfo(reinterpret_cast<sockaddr*>(&ss), len, host, sizeof host, nullptr, 0, NI_NUMERICHOST) == 0)
        loop_->address = host;
    } else {
      err = errno;
      ::close(fd);
    }
  }
  ::freeaddrinfo(res);
  const std::string where = fmt::format("{}:{}", any ? "*" : o.addr, o.port);
  if (loop_->listen_fd < 0) {
    if (err == EADDRINUSE)
      throw CommError(fmt::format("cannot host the rendezvous store on {}: the port is already in use", where),
                      fmt::format("choose another port (gasloc launch --master-port P, or MASTER_PORT), or stop the "
                                  "process that holds it (ss -ltnp | grep :{})",
                                  o.port));
    if (err == EADDRNOTAVAIL)
      throw CommError(fmt::format("cannot host the rendezvous store on {}: {} is not an address of this host", where, o.addr),
                      "MASTER_ADDR must name the store's host as the other ranks reach it");
    throw CommError(fmt::format("cannot host the rendezvous store on {}: {}", where, errno_text(err)));
  }
  set_nonblocking(loop_->listen_fd);
  if (state_->secret.empty() && !is_loopback(loop_->address))
    spdlog::warn("gasloc store: listening on {}:{} without a job secret: whoever reaches this port can join the job and "
                 "read or write its keys (set cluster.secret_file; gasloc secret --out FILE writes one)",
                 loop_->address, loop_->port);
  if (::pipe2(loop_->wake, O_CLOEXEC) != 0) throw CommError("cannot host the rendezvous store: pipe failed");
  loop_->thread = std::thread([l = loop_.get()] { l->run(); });
}

StoreServer::~StoreServer() = default;
int StoreServer::port() const { return loop_->port; }
std::string StoreServer::address() const { return loop_->address; }
c10::intrusive_ptr<c10d::Store> StoreServer::local() { return c10::make_intrusive<LocalStore>(state_); }
JobIdentity StoreServer::job() const {
  std::lock_guard<std::mutex> lock(state_->m);
  return state_->job;
}

// ---------------------------------------------------------------------------------------------
// The client: one request at a time, every byte waited for with poll() in slices, against the
// call's deadline and a stop request.

struct StoreClient::Conn {
  std::string addr;
  int port = 0;
  int fd = -1;
  std::string broken;  // the first failure; the connection is unusable after it
  bool hung_up = false;  // the failure was the store closing the connection
  std::string k_conn;  // with a secret, once authenticated: requests and replies are sealed under it
  uint64_t seq = 0;    // the next request's sequence number

  ~Conn() {
    if (fd >= 0) ::close(fd);
  }
  std::string where() const { return fmt::format("{}:{}", addr, port); }

  // The connection is unusable from now on.
  void close(const std::string& what) {
    broken = what;
    if (fd >= 0) ::close(fd), fd = -1;
  }
  // Usable again by connect() after a failure of the greeting.
  void reset() {
    close("");
    broken.clear();
    hung_up = false;
    k_conn.clear();
    seq = 0;
  }
  [[noreturn]] void fail(const std::string& what, const std::string& hint) {
    close(what);
    throw CommError(what, hint);
  }

  // Waits until fd is ready for `events`; throws at the deadline or on a stop request.
  void await(short events, Clock::time_point start, Clock::time_point deadline, const std::string& what,
             std::chrono::milliseconds timeout) {
    for (;;) {
      pollfd p{fd, events, 0};
      const int rc = ::poll(&p, 1, kSliceMs);
      if (rc > 0) return;
      if (rc < 0 && errno != EINTR) fail(fmt::format("the rendezvous store at {}: poll failed during {}", where(), what), "");
      const auto now = Clock::now();
      if (interrupt_requested() && now - start >= kInterruptAfter)
        fail(fmt::format("interrupted while waiting for the rendezvous store at {} ({})", where(), what),
             "the run stops as asked; nothing was lost that a checkpoint had committed");
      if (now >= deadline)
        fail(fmt::format("the rendezvous store at {} did not answer {} within {:g} s", where(), what,
                         static_cast<double>(timeout.count()) / 1000),
             "its host (gasloc launch, gasloc store or rank 0) may be stopped (SIGSTOP), overloaded or gone, or another "
             "program listens on that port; cluster.timeout_s bounds every store call");
    }
  }

  Reply request(StoreOp op, const std::vector<std::string>& fields, const std::string& what,
                std::chrono::milliseconds timeout) {
    if (!broken.empty())
      throw CommError(fmt::format("{} on a store connection that already failed: {}", what, broken),
                      "the rendezvous store cannot be used after a failure; restart the run");
    const auto start = Clock::now(), deadline = start + timeout;
    const bool sealed = !k_conn.empty();
    const std::string frame = sealed ? store_auth::seal_frame(k_conn, 'q', seq, static_cast<uint8_t>(op), fields)
                                     : encode_frame(static_cast<uint8_t>(op), fields);
    for (size_t done = 0; done < frame.size();) {
      await(POLLOUT, start, deadline, what, timeout);
      const ssize_t n = ::send(fd, frame.data() + done, frame.size() - done, MSG_NOSIGNAL);
      if (n > 0) done += static_cast<size_t>(n);
      else if (n < 0 && errno != EAGAIN && errno != EINTR) {
        hung_up = true;
        fail(fmt::format("lost the connection to the rendezvous store at {} during {}: {}", where(), what, errno_text(errno)),
             "the process hosting it (gasloc launch, gasloc store or rank 0) may have exited");
      }
    }
    std::string in;
    auto read_until = [&](size_t size) {
      while (in.size() < size) {
        await(POLLIN, start, deadline, what, timeout);
        char buf[65536];
        const ssize_t n = ::recv(fd, buf, std::min(sizeof buf, size - in.size()), 0);
        if (n > 0) in.append(buf, static_cast<size_t>(n));
        else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
          hung_up = true;
          fail(fmt::format("the rendezvous store at {} closed the connection during {}", where(), what),
               "the process hosting it (gasloc launch, gasloc store or rank 0) may have exited, or the port belongs to "
               "another program");
        }
      }
    };
    read_until(4);
    const uint32_t len = get_u32(in.data());
    if (len > kMaxFrameBytes)
      fail(fmt::format("the rendezvous store at {} answered {} with garbage", where(), what),
           "is another program listening on that port?");
    read_until(4 + static_cast<size_t>(len));
    std::string payload = in.substr(4), why;
    if (sealed) {
      const std::string reply = std::move(payload);
      if (!store_auth::open_payload(k_conn, 'r', seq, reply, payload, why))
        fail(fmt::format("the rendezvous store's reply at {} to {} failed its check: {}", where(), what, why),
             "something on the path altered or replayed it; this connection is closed");
      ++seq;
    }
    uint8_t code = 0;
    Reply r;
    if (!parse_payload(payload, code, r.fields) || code > static_cast<uint8_t>(StoreStatus::kError))
      fail(fmt::format("the rendezvous store at {} answered {} with garbage", where(), what),
           "is another program listening on that port?");
    r.status = static_cast<StoreStatus>(code);
    return r;
  }

  // Connects, retrying refused connections until the deadline (the host may not be up yet).
  void connect(std::chrono::milliseconds timeout) {
    const auto start = Clock::now(), deadline = start + timeout;
    std::string last = "no address";
    for (;;) {
      addrinfo hints{};
      hints.ai_family = AF_UNSPEC;
      hints.ai_socktype = SOCK_STREAM;
      addrinfo* res = nullptr;
      const std::string p = std::to_string(port);
      if (const int rc = ::getaddrinfo(addr.c_str(), p.c_str(), &hints, &res); rc != 0) {
        last = ::gai_strerror(rc);
      } else {
        for (addrinfo* a = res; a != nullptr && fd < 0; a = a->ai_next) {
          const int s = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
          if (s < 0) continue;
          if (::connect(s, a->ai_addr, a->ai_addrlen) == 0 || errno == EINPROGRESS) {
            pollfd pf{s, POLLOUT, 0};
            const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
            int soerr = ETIMEDOUT;
            socklen_t sl = sizeof soerr;
            if (::poll(&pf, 1, static_cast<int>(std::clamp<int64_t>(left, 1, 1000))) > 0)
              ::getsockopt(s, SOL_SOCKET, SO_ERROR, &soerr, &sl);
            if (soerr == 0) {
              fd = s;
              break;
            }
            last = errno_text(soerr);
          } else {
            last = errno_text(errno);
          }
          ::close(s);
        }
        ::freeaddrinfo(res);
      }
      if (fd >= 0) break;
      if (interrupt_requested() && Clock::now() - start >= kInterruptAfter)
        throw CommError(fmt::format("interrupted while connecting to the rendezvous store at {}", where()));
      if (Clock::now() >= deadline)
        throw CommError(fmt::format("could not reach the rendezvous store at {} within {:g} s: {}", where(),
                                    static_cast<double>(timeout.count()) / 1000, last),
                        "is its host (gasloc launch, gasloc store or rank 0) running, and do all ranks use the same "
                        "MASTER_ADDR and MASTER_PORT?");
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
};

StoreClient::StoreClient(const std::string& addr, int port, std::chrono::milliseconds timeout, const JobIdentity& job)
    : c10d::Store(timeout), conn_(std::make_unique<Conn>()), job_(job) {
  check_job_token(job.token);
  conn_->addr = addr;
  conn_->port = port;
  // A store closes connections that have not proved themselves when it is flooded with them (the
  // oldest first; docs/communication.md, "Before the proof"): a greeting cut that way is tried
  // again on a new connection while the timeout lasts.
  const auto deadline = Clock::now() + timeout;
  auto left = [&] {
    return std::max(std::chrono::milliseconds(1),
                    std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
  };
  for (;;) {
    conn_->connect(left());
    try {
      greet(left());
      return;
    } catch (const CommError&) {
      if (!conn_->hung_up || Clock::now() >= deadline) throw;
    }
    conn_->reset();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

void StoreClient::greet(std::chrono::milliseconds timeout) {
  const JobIdentity& job = job_;
  // Another job's store, or a secret that differs: the rank's configuration is wrong, not a peer.
  auto refused = [&](const Reply& r) {
    const std::string what =
        fmt::format("refused by the rendezvous store at {}: {}", where(), r.fields.empty() ? "" : r.fields[0]);
    conn_->close(what);
    if (r.fields.size() >= 2 && r.fields[1] == "auth")
      throw AuthError(what, job.secret.empty()
                                ? "start this process with the job's secret: cluster.secret_file = FILE (or --set "
                                  "cluster.secret_file=FILE; gasloc launch --secret-file FILE passes it to its ranks, "
                                  "gasloc comm-check takes --secret-file FILE)"
                                : "every rank and the store's host (gasloc launch --secret-file, gasloc store "
                                  "--secret-file) must use the same cluster.secret_file; compare them with sha256sum");
    throw ConfigError(what, "two jobs meet on one port: give each its own MASTER_PORT (gasloc launch picks a free one), or "
                            "start every rank of a job with the same configuration and train.run_dir");
  };
  if (job.secret.empty()) {
    const Reply r = conn_->request(StoreOp::kHello, {job.token, short_identity(job.label)}, "the greeting", timeout);
    if (r.status != StoreStatus::kOk) refused(r);
    return;
  }
  // store_auth (store.hpp): the client proves the secret first, then the store.
  const std::string k_store = store_auth::store_key(job.secret, job.token);
  Reply r = conn_->request(StoreOp::kAuthHello, {job.token, short_identity(job.label)}, "the greeting", timeout);
  if (r.status != StoreStatus::kOk) refused(r);
  if (r.fields.size() != 1 || r.fields[0].size() != store_auth::kNonceBytes)
    conn_->fail(fmt::format("the rendezvous store at {} answered the greeting with garbage", where()),
                "is another program listening on that port?");
  const std::string n_s = r.fields[0], n_c = crypto::random_bytes(store_auth::kNonceBytes);
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  const std::string id = short_identity(fmt::format("{} pid {}", host, ::getpid()));
  r = conn_->request(StoreOp::kAuthProof, {id, n_c, store_auth::client_proof(k_store, n_s, n_c, id, job.token)},
                     "the proof of the job's secret", timeout);
  if (r.status != StoreStatus::kOk) refused(r);
  if (r.fields.size() != 1 || !crypto::equal(r.fields[0], store_auth::server_proof(k_store, n_s, n_c, id, job.token))) {
    const std::string what = fmt::format("the rendezvous store at {} did not prove that it holds the job's secret", where());
    conn_->close(what);
    throw AuthError(what, "its host was started with another secret than this process's cluster.secret_file (gasloc "
                          "launch --secret-file, gasloc store --secret-file), or another program answers on that port");
  }
  conn_->k_conn = store_auth::connection_key(k_store, n_s, n_c, id);
}

StoreClient::~StoreClient() = default;
std::string StoreClient::where() const { return conn_->where(); }
c10::intrusive_ptr<c10d::Store> StoreClient::clone() {
  return c10::make_intrusive<StoreClient>(conn_->addr, conn_->port, getTimeout(), job_);
}

namespace {
// The answer's one field, or a CommError for a refused request.
std::string answer(const Reply& r, const std::string& what) {
  if (r.status == StoreStatus::kError || r.fields.size() != 1)
    throw CommError(fmt::format("the rendezvous store refused {}: {}", what, r.fields.empty() ? "no reason" : r.fields[0]));
  return r.fields[0];
}
}  // namespace

void StoreClient::set(const std::string& key, const std::vector<uint8_t>& value) {
  const Reply r = conn_->request(StoreOp::kSet, {key, to_text(value)}, "set " + key, timeout_);
  if (r.status != StoreStatus::kOk) answer(r, "set " + key);
}

std::vector<uint8_t> StoreClient::compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                             const std::vector<uint8_t>& desired) {
  const std::string what = "compare_set " + key;
  return to_bytes(answer(conn_->request(StoreOp::kCompareSet, {key, to_text(expected), to_text(desired)}, what, timeout_), what));
}

std::vector<uint8_t> StoreClient::get(const std::string& key) {
  wait({key});
  const std::string what = "get " + key;
  return to_bytes(answer(conn_->request(StoreOp::kGet, {key}, what, timeout_), what));
}

int64_t StoreClient::add(const std::string& key, int64_t value) {
  const std::string what = "add " + key;
  int64_t v = 0;
  if (!parse_i64(answer(conn_->request(StoreOp::kAdd, {key, std::to_string(value)}, what, timeout_), what), v))
    throw CommError("the rendezvous store answered " + what + " with a non-integer");
  return v;
}

bool StoreClient::deleteKey(const std::string& key) {
  const std::string what = "delete " + key;
  return answer(conn_->request(StoreOp::kDelete, {key}, what, timeout_), what) == "1";
}

bool StoreClient::check(const std::vector<std::string>& keys) {
  const std::string what = "check " + (keys.empty() ? std::string() : keys[0]);
  return answer(conn_->request(StoreOp::kCheck, keys, what, timeout_), what) == "1";
}

int64_t StoreClient::getNumKeys() {
  int64_t v = 0;
  parse_i64(answer(conn_->request(StoreOp::kNumKeys, {}, "num_keys", timeout_), "num_keys"), v);
  return v;
}

void StoreClient::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void StoreClient::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  // Polls check(), each poll bounded by what is left of the wait.
  const auto start = Clock::now(), deadline = start + timeout;
  for (int sleep_ms = 1;; sleep_ms = std::min(20, sleep_ms * 2)) {
    const auto left = std::max(std::chrono::milliseconds(1),
                               std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
    const std::string what = "wait " + (keys.empty() ? std::string() : keys[0]);
    if (answer(conn_->request(StoreOp::kCheck, keys, what, std::min(left, timeout_)), what) == "1") return;
    if (interrupt_requested() && Clock::now() - start >= kInterruptAfter)
      throw CommError(fmt::format("interrupted while waiting for key '{}' in the rendezvous store at {}", keys[0], where()));
    if (Clock::now() >= deadline)
      throw CommError(fmt::format("waited {:g} s for key '{}' in the rendezvous store at {}; nobody set it",
                                  static_cast<double>(timeout.count()) / 1000, keys.empty() ? "" : keys[0], where()),
                      "a rank may have died or be stuck before it published it");
    std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
  }
}

ReconnectingStore::ReconnectingStore(Open open) : open_(std::move(open)), conn_(open_()) {
  setTimeout(conn_->getTimeout());
}

c10::intrusive_ptr<c10d::Store> ReconnectingStore::clone() { return c10::make_intrusive<ReconnectingStore>(open_); }

template <class F>
auto ReconnectingStore::with(F&& f) -> decltype(f(std::declval<c10d::Store&>())) {
  if (!conn_) {
    conn_ = open_();
    ++reconnects_;
  }
  try {
    return f(*conn_);
  } catch (const CommError&) {
    conn_.reset();  // the next call opens a new connection
    throw;
  }
}

void ReconnectingStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  with([&](c10d::Store& s) { s.set(key, value); });
}
std::vector<uint8_t> ReconnectingStore::compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                                   const std::vector<uint8_t>& desired) {
  return with([&](c10d::Store& s) { return s.compareSet(key, expected, desired); });
}
std::vector<uint8_t> ReconnectingStore::get(const std::string& key) {
  return with([&](c10d::Store& s) { return s.get(key); });
}
int64_t ReconnectingStore::add(const std::string& key, int64_t value) {
  return with([&](c10d::Store& s) { return s.add(key, value); });
}
bool ReconnectingStore::deleteKey(const std::string& key) {
  return with([&](c10d::Store& s) { return s.deleteKey(key); });
}
bool ReconnectingStore::check(const std::vector<std::string>& keys) {
  return with([&](c10d::Store& s) { return s.check(keys); });
}
int64_t ReconnectingStore::getNumKeys() {
  return with([&](c10d::Store& s) { return s.getNumKeys(); });
}
void ReconnectingStore::wait(const std::vector<std::string>& keys) {
  with([&](c10d::Store& s) { s.wait(keys); });
}
void ReconnectingStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  with([&](c10d::Store& s) { s.wait(keys, timeout); });
}

}  // namespace gasloc::comm

namespace gasloc::comm {

std::string read_session_salt(c10d::Store& raw) {
  if (!raw.check({kSessionSaltKey}))
    throw CommError("the rendezvous store has no session salt: it was started without the job's secret",
                    "give the store's host the same secret file (gasloc launch --secret-file, gasloc store "
                    "--secret-file, or cluster.secret_file on rank 0)");
  const std::vector<uint8_t> v = raw.get(kSessionSaltKey);
  if (v.size() != kSessionSaltBytes)
    throw CommError(fmt::format("the rendezvous store's session salt has {} bytes, not {}", v.size(), kSessionSaltBytes),
                    "the store's host runs another version of gasloc");
  return {v.begin(), v.end()};
}

std::string read_session_salt(const c10::intrusive_ptr<c10d::Store>& store) {
  if (auto* prefixed = dynamic_cast<c10d::PrefixStore*>(store.get())) return read_session_salt(*prefixed->getUnderlyingStore());
  return read_session_salt(*store);
}

}  // namespace gasloc::comm
