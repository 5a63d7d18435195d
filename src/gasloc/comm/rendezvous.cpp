#include "gasloc/comm/rendezvous.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <unistd.h>

#include <charconv>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "gasloc/core/error.hpp"
#include "gasloc/core/interrupt.hpp"

namespace gasloc::comm {

namespace {

const char* kLaunchHint =
    "run every rank under `gasloc launch -n N -- COMMAND ...` (or torchrun), which sets RANK, WORLD_SIZE, "
    "MASTER_ADDR and MASTER_PORT";

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return {};
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

// Whole-string integer: "4x" and "" are errors, not 4 and 0 (std::stoi would accept "4x").
bool parse_int(const std::string& text, long long& out) {
  const std::string s = trim(text);
  if (s.empty()) return false;
  const char* first = s.data() + (s[0] == '+' ? 1 : 0);
  auto [p, ec] = std::from_chars(first, s.data() + s.size(), out);
  return ec == std::errc() && p == s.data() + s.size();
}

bool parse_double(const std::string& text, double& out) {
  const std::string s = trim(text);
  if (s.empty()) return false;
  char* end = nullptr;
  out = std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size() && std::isfinite(out);
}

long long require_int(const std::function<const char*(const char*)>& lookup, const char* name) {
  const char* v = lookup(name);
  if (v == nullptr) throw ConfigError(fmt::format("{} is not set", name), kLaunchHint);
  long long x = 0;
  if (!parse_int(v, x)) throw ConfigError(fmt::format("{}='{}' is not an integer", name, v), kLaunchHint);
  return x;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string this_host() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof buf - 1) != 0) return "?";
  return buf;
}

// A process that exited but was not reaped yet (a zombie) still answers kill(pid, 0), so read
// its state from /proc instead.
bool process_running(long pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(f, line)) return false;
  const auto close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] != 'Z';
}

std::string key(const std::string& what, int rank) { return what + "/" + std::to_string(rank); }


}  // namespace

c10::intrusive_ptr<c10d::Store> job_keys(const c10::intrusive_ptr<c10d::Store>& tcp) {
  const char* attempt = std::getenv("TORCHELASTIC_RESTART_COUNT");
  return c10::make_intrusive<c10d::PrefixStore>(std::string("gasloc/") + (attempt != nullptr ? attempt : "0"), tcp);
}

double parse_bandwidth_limit(const std::string& spec_in, int rank) {
  const std::string spec = trim(spec_in);
  if (spec.empty()) return 0;
  double v = 0;
  if (spec.find('=') == std::string::npos) {
    if (!parse_double(spec, v) || v < 0)
      throw CommError(fmt::format("bandwidth limit '{}' is not a bandwidth in bytes/s", spec),
                      "use a number such as 1e8, or per-rank entries such as 2=1e7,3=5e7");
    return v;
  }
  double mine = 0;
  std::stringstream ss(spec);
  for (std::string item; std::getline(ss, item, ',');) {
    const auto eq = item.find('=');
    long long r = 0;
    if (eq == std::string::npos || !parse_int(item.substr(0, eq), r) || !parse_double(item.substr(eq + 1), v) || v < 0)
      throw CommError(fmt::format("bandwidth limit entry '{}' is not RANK=BYTES_PER_S", trim(item)),
                      "use a number such as 1e8, or per-rank entries such as 2=1e7,3=5e7");
    if (r == rank) mine = v;
  }
  return mine;
}

void validate(const GlooOptions& o, bool check_rank) {
  if (o.world < 1) throw CommError(fmt::format("WORLD_SIZE={} must be at least 1", o.world), kLaunchHint);
  if (o.rank < 0) throw CommError(fmt::format("RANK={} must not be negative", o.rank), kLaunchHint);
  if (check_rank && o.rank >= o.world)
    throw CommError(fmt::format("RANK={} is outside [0, WORLD_SIZE={})", o.rank, o.world),
                    "every rank needs a distinct RANK in 0..WORLD_SIZE-1; " + std::string(kLaunchHint));
  if (o.master_addr.empty()) throw CommError("MASTER_ADDR is empty", kLaunchHint);
  // Port 0 only makes sense for a rank that hosts the store (the OS picks the port).
  const int lo = (o.rank == 0 && !o.connect_only) ? 0 : 1;
  if (o.master_port < lo || o.master_port > 65535)
    throw CommError(fmt::format("MASTER_PORT={} is outside {}..65535", o.master_port, lo), kLaunchHint);
  if (!(o.timeout_s > 0)) throw CommError(fmt::format("the communication timeout must be positive, not {} s", o.timeout_s));
  if (!(o.bandwidth_limit_Bps >= 0))
    throw CommError(fmt::format("the bandwidth limit must be >= 0 bytes/s (0 = unlimited), not {}", o.bandwidth_limit_Bps));
}

// The launcher's variables are the rank's configuration: an error here is ConfigError (exit
// status 2: a restart would meet it again), not a peer's failure.
GlooOptions gloo_options_from_env(const std::function<const char*(const char*)>& lookup) {
  GlooOptions o;
  // Check presence of all four first, so that a bare run names every missing variable at once.
  std::string missing;
  for (const char* name : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"})
    if (lookup(name) == nullptr) missing += (missing.empty() ? "" : ", ") + std::string(name);
  if (!missing.empty())
    throw ConfigError(fmt::format("{} {} not set: this command must run as one rank of a process group", missing,
                                missing.find(',') == std::string::npos ? "is" : "are"),
                    kLaunchHint);
  const long long world = require_int(lookup, "WORLD_SIZE");
  const long long rank = require_int(lookup, "RANK");
  const long long port = require_int(lookup, "MASTER_PORT");
  if (world < 1) throw ConfigError(fmt::format("WORLD_SIZE={} must be at least 1", world), kLaunchHint);
  if (world > (1 << 20)) throw ConfigError(fmt::format("WORLD_SIZE={} is above {}", world, 1 << 20), kLaunchHint);
  // RANK >= WORLD_SIZE is checked at the store (join_store), where every rank hears of it.
  if (rank < 0) throw ConfigError(fmt::format("RANK={} must not be negative", rank), kLaunchHint);
  if (port < 1 || port > 65535) throw ConfigError(fmt::format("MASTER_PORT={} is outside 1..65535", port), kLaunchHint);
  o.world = static_cast<int>(world);
  o.rank = static_cast<int>(rank);
  o.master_port = static_cast<int>(port);
  o.master_addr = trim(lookup("MASTER_ADDR"));
  if (const char* v = lookup("LOCAL_RANK")) {
    long long lr = 0;
    if (!parse_int(v, lr) || lr < 0) throw ConfigError(fmt::format("LOCAL_RANK='{}' is not a non-negative integer", v));
    o.local_rank = static_cast<int>(lr);
  }
  if (const char* v = lookup("LOCAL_WORLD_SIZE")) {
    long long lw = 0;
    if (!parse_int(v, lw) || lw < 1 || lw > (1 << 20))
      throw ConfigError(fmt::format("LOCAL_WORLD_SIZE='{}' is not a positive integer", v), kLaunchHint);
    o.local_world = static_cast<int>(lw);
  }
  if (const char* v = lookup("GLOO_SOCKET_IFNAME")) o.interface = trim(v);
  // An agent hosts the store: torchrun's (c10d's protocol) unless gasloc launch hands the rank a
  // job token (make_cluster clears agent_store then).
  if (const char* v = lookup("TORCHELASTIC_USE_AGENT_STORE")) o.connect_only = o.agent_store = trim(v) == "True" || trim(v) == "1";
  validate(o, /*check_rank=*/false);
  return o;
}

GlooOptions gloo_options_from_env() {
  return gloo_options_from_env([](const char* name) { return std::getenv(name); });
}

namespace {

// A store that rank 0 hosts for its job: its own view of the keys, and the server kept alive
// with it (the store must outlive the process group, which holds this).
class HostedStore final : public c10d::Store {
 public:
  HostedStore(std::unique_ptr<StoreServer> server, std::chrono::milliseconds timeout)
      : c10d::Store(timeout), server_(std::move(server)), keys_(server_->local()) {
    keys_->setTimeout(timeout);
  }
  // LibTorch 2.x declares c10d::Store::clone() (a handle to the same store for another thread);
  // written without `override` so that 1.13, which has none, compiles it as a new function.
  // Its keys are the server's locked state (StoreServer::local()): this store is its own clone.
  virtual c10::intrusive_ptr<c10d::Store> clone() { return c10::intrusive_ptr<c10d::Store>::reclaim_copy(this); }
  void set(const std::string& k, const std::vector<uint8_t>& v) override { keys_->set(k, v); }
  std::vector<uint8_t> compareSet(const std::string& k, const std::vector<uint8_t>& e, const std::vector<uint8_t>& d) override {
    return keys_->compareSet(k, e, d);
  }
  std::vector<uint8_t> get(const std::string& k) override { return keys_->get(k); }
  int64_t add(const std::string& k, int64_t v) override { return keys_->add(k, v); }
  bool deleteKey(const std::string& k) override { return keys_->deleteKey(k); }
  bool check(const std::vector<std::string>& k) override { return keys_->check(k); }
  int64_t getNumKeys() override { return keys_->getNumKeys(); }
  void wait(const std::vector<std::string>& k) override { keys_->wait(k); }
  void wait(const std::vector<std::string>& k, const std::chrono::milliseconds& t) override { keys_->wait(k, t); }
  void setTimeout(const std::chrono::milliseconds& t) override {
    c10d::Store::setTimeout(t);
    keys_->setTimeout(t);
  }

 private:
  std::unique_ptr<StoreServer> server_;
  c10::intrusive_ptr<c10d::Store> keys_;
};

// The connection to the job's store, or the store itself for rank 0 when it hosts it.
c10::intrusive_ptr<c10d::Store> open_store(const GlooOptions& o) {
  const std::string where = fmt::format("{}:{}", o.master_addr, o.master_port);
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1000));
  if (o.agent_store) {
    c10d::TCPStoreOptions so;
    so.port = static_cast<std::uint16_t>(o.master_port);
    so.isServer = false;
    so.numWorkers = c10::nullopt;
    so.waitWorkers = false;
    so.timeout = timeout;
    try {
      return c10::make_intrusive<c10d::TCPStore>(o.master_addr, so);
    } catch (const std::exception& e) {
      const std::string msg = e.what();
      throw CommError(fmt::format("rank {} could not reach torchrun's agent store at {} within {} s: {}", o.rank, where,
                                  o.timeout_s, msg.substr(0, msg.find('\n'))),
                      "is the agent (torchrun) running, and do all ranks use the same MASTER_ADDR and MASTER_PORT?");
    }
  }
  if (o.rank == 0 && !o.connect_only) {
    StoreServerOptions so;
    so.addr = o.master_addr;
    so.port = o.master_port;
    so.all_interfaces = o.store_all_interfaces;
    so.job = o.job;
    try {
      return c10::make_intrusive<HostedStore>(std::make_unique<StoreServer>(so), timeout);
    } catch (const CommError& e) {
      throw CommError(std::string("rank 0: ") + e.what(), e.hint());
    }
  }
  try {
    return c10::make_intrusive<StoreClient>(o.master_addr, o.master_port, timeout, o.job);
  } catch (const CommError& e) {
    throw CommError(fmt::format("rank {}: {}", o.rank, e.what()), e.hint());
  }
}

// "1, 2, 5" for at most `limit` ranks, then "and N more": a world of 100000 with most ranks
// missing must not print a line of 650 KB.
std::string rank_list(const std::vector<int>& ranks, size_t total, size_t limit = 16) {
  std::string out;
  for (size_t k = 0; k < ranks.size() && k < limit; ++k) out += (k ? ", " : "") + std::to_string(ranks[k]);
  if (total > std::min(ranks.size(), limit)) out += fmt::format(" and {} more", total - std::min(ranks.size(), limit));
  return out;
}

// Fails at once when a rank published an abort or a failure while this one waits for the others.
void check_rendezvous_news(c10d::Store& store, const GlooOptions& o) {
  if (store.check({"abort"})) throw CommError(to_text(store.get("abort")), "every rank stopped because of it");
  if (store.add("failures", 0) > 0)
    for (int r = 0; r < o.world && r < 4096; ++r)
      if (auto rec = read_failure(store, r); rec && r != o.rank)
        throw CommError(fmt::format("rendezvous on rank {} stopped: rank {} failed before every rank joined: {}", o.rank, r,
                                    rec->what),
                        "fix what stopped that rank and start all ranks again", rec->root >= 0 ? rec->root : r);
}

// The ranks that never registered, named (a bounded scan), for the timeout's message.
std::string missing_ranks(c10d::Store& store, const GlooOptions& o) {
  const int64_t joined = store.add("joined", 0);
  const auto missing_count = static_cast<size_t>(std::max<int64_t>(0, o.world - joined));
  std::vector<int> missing;
  for (int r = 0; r < o.world && missing.size() < 16 && r < 65536; ++r)
    if (!store.check({key("rank", r)})) missing.push_back(r);
  if (missing.empty()) return fmt::format("{} of {} ranks never joined", missing_count, o.world);
  return fmt::format("rank{} {} of {} never joined", missing_count > 1 ? "s" : "", rank_list(missing, missing_count), o.world);
}

}  // namespace

std::string store_host_name(const GlooOptions& o) {
  if (o.agent_store) return "torchrun's agent";
  if (o.connect_only) return "gasloc launch (or gasloc store)";
  return "rank 0";
}

c10::intrusive_ptr<c10d::Store> job_keys_connection(const GlooOptions& o, double max_timeout_s) {
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(std::min(o.timeout_s, max_timeout_s) * 1000));
  return job_keys(c10::make_intrusive<StoreClient>(o.master_addr, o.master_port, timeout, o.job));
}

c10::intrusive_ptr<c10d::Store> job_keys_reconnecting(const GlooOptions& o, double max_timeout_s) {
  return c10::make_intrusive<ReconnectingStore>([o, max_timeout_s] { return job_keys_connection(o, max_timeout_s); });
}

void check_job_secret(const GlooOptions& o) {
  if (!o.job.secret.empty() && o.agent_store)
    throw ConfigError("cluster.secret_file: torchrun's agent store cannot be authenticated, so a job with a secret cannot "
                      "meet there",
                      "start the ranks with gasloc launch --secret-file FILE, or host the store with gasloc store "
                      "--secret-file FILE and give the ranks --job-id");
  if (o.job.secret.empty() && (!is_loopback(o.master_addr) || !o.interface.empty()))
    spdlog::warn("rank {}: the job has no secret and its ranks listen beyond loopback ({}): whoever reaches their ports "
                 "can join it (set cluster.secret_file; gasloc secret --out FILE writes one)",
                 o.rank, o.interface.empty() ? o.master_addr : "interface " + o.interface);
}

namespace {
// Every rank of a start met at this store already: a rank arriving now belongs to another start of
// the job (the next job, a resume) at a store that serves one, whose keys stay. Said so, without
// publishing an abort that would stop the first start's ranks, were they still running.
void check_not_served_before(c10d::Store& store, const GlooOptions& o, const std::string& where) {
  if (!store.check({"world"})) return;
  const int64_t world = std::stoll(to_text(store.get("world")));
  if (store.add("joined", 0) < world) return;
  throw CommError(fmt::format("rank {}: the store {} already served a whole start of this job (all {} ranks met there): "
                              "a store without --elastic serves one start of one job",
                              o.rank, where, world),
                  "start gasloc store again (Ctrl+C, then the same command) for each start of a job, a resume too, or "
                  "give the next one its own store (another --port); gasloc launch makes one per start");
}
}  // namespace

c10::intrusive_ptr<c10d::Store> join_store(const GlooOptions& o) {
  validate(o, /*check_rank=*/false);
  check_job_secret(o);
  const std::string where = fmt::format("{}:{}", o.master_addr, o.master_port);
  auto store = job_keys(open_store(o));
  // A mistake that one rank sees (another WORLD_SIZE, a RANK claimed twice or out of range) is
  // published as "abort", so every rank stops at once with the same message instead of waiting
  // for the timeout.
  auto abort_all = [&](const std::string& why, const std::string& hint) {
    publish_abort(*store, why);
    throw CommError(why, hint);
  };
  try {
    if (o.rank < 0 || o.rank >= o.world)
      abort_all(fmt::format("a rank started with RANK={} and WORLD_SIZE={}: RANK must be in 0..{}", o.rank, o.world,
                            o.world - 1),
                "every rank needs a distinct RANK in 0..WORLD_SIZE-1; " + std::string(kLaunchHint));
    check_not_served_before(*store, o, where);
    // WORLD_SIZE: the first rank to arrive sets it; every other rank compares.
    const auto agreed = to_text(store->compareSet("world", {}, to_bytes(std::to_string(o.world))));
    if (agreed != std::to_string(o.world))
      abort_all(fmt::format("rank {} has WORLD_SIZE={} but another rank joined the store at {} with WORLD_SIZE={}", o.rank,
                            o.world, where, agreed),
                "every rank must get the same WORLD_SIZE (resuming a run on another number of ranks is refused too)");
    if (store->add(key("rank", o.rank), 1) != 1)
      abort_all(fmt::format("two processes claim RANK={} at the store {}", o.rank, where),
                "every rank needs a distinct RANK in 0..WORLD_SIZE-1");
    store->set(key("proc", o.rank), to_bytes(fmt::format("{} {}", this_host(), ::getpid())));
    store->add("joined", 1);
    // Wait for everyone by polling the count: unlike a blocking wait() it tells us who is missing
    // when the deadline passes. A published abort, a rank recorded as failed (by itself or by the
    // launcher that saw it exit), or a stop request ends the wait at once.
    const double deadline = now_s() + o.timeout_s;
    for (int sleep_ms = 1; store->add("joined", 0) < o.world; sleep_ms = std::min(50, sleep_ms * 2)) {
      check_rendezvous_news(*store, o);
      if (interrupt_requested())
        throw CommError(fmt::format("rank {}: interrupted during the rendezvous at {}", o.rank, where),
                        "nothing was trained yet; start the ranks again");
      if (now_s() > deadline)
        throw CommError(fmt::format("rendezvous timed out after {} s on rank {}: {} at {}", o.timeout_s, o.rank,
                                    missing_ranks(*store, o), where),
                        "they may not have started, may have crashed, or were given another MASTER_PORT or WORLD_SIZE");
      std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
    }
  } catch (const CommError& e) {
    throw CommError(e.what(), e.hint().empty() ? store_host_name(o) + " hosts the store; is it running?" : e.hint(),
                    e.failed_rank());
  } catch (const std::exception& e) {
    const std::string msg = e.what();
    throw CommError(fmt::format("rank {}: rendezvous at {} failed: {}", o.rank, where, msg.substr(0, msg.find('\n'))),
                    store_host_name(o) + " hosts the store; it may have exited");
  }
  return store;
}

int64_t Arrivals::arrive(const std::string& op) noexcept {
  ++seq_;
  if (off_ || !store_ || world_ == 1) return seq_;
  try {
    store_->set(key("at", rank_), to_bytes(fmt::format("{} {}", seq_, op)));
  } catch (const std::exception& e) {
    off_ = true;
    spdlog::warn("rank {}: the rendezvous store did not take this rank's arrival at {} ({}); a timeout will not name "
                 "the ranks that never arrived",
                 rank_, op, e.what());
  }
  return seq_;
}

std::string Arrivals::behind(int64_t seq, std::vector<int>* ranks, int limit) noexcept {
  if (off_ || !store_) return "";
  std::string out;
  int named = 0, total = 0;
  try {
    for (int r = 0; r < world_ && r < 4096; ++r) {
      if (r == rank_) continue;
      std::string last = "none";
      int64_t at = 0;
      if (store_->check({key("at", r)})) {
        last = to_text(store_->get(key("at", r)));
        const auto sp = last.find(' ');
        long long v = 0;
        if (sp != std::string::npos && parse_int(last.substr(0, sp), v)) at = v;
      }
      if (at >= seq) continue;
      ++total;
      if (ranks) ranks->push_back(r);
      if (named++ < limit)
        out += fmt::format("{}rank {} (its last: {})", out.empty() ? "" : ", ", r, at == 0 ? "none" : "#" + last);
    }
  } catch (const std::exception&) {
    return out;
  }
  if (total > limit) out += fmt::format(" and {} more", total - limit);
  return out;
}

std::string describe_dead_ranks(c10d::Store& store, int self_rank, int world) {
  const std::string host = this_host();
  std::string out;
  try {
    for (int r = 0; r < world && r < 256; ++r) {
      if (r == self_rank || !store.check({key("proc", r)})) continue;
      const std::string v = to_text(store.get(key("proc", r)));
      const auto sp = v.rfind(' ');
      if (sp == std::string::npos || v.substr(0, sp) != host) continue;
      long long pid = 0;
      if (!parse_int(v.substr(sp + 1), pid) || pid == ::getpid()) continue;  // ranks as threads: no verdict
      if (!process_running(static_cast<long>(pid)))
        out += fmt::format("{}rank {} (pid {}) is no longer running", out.empty() ? "; confirmed: " : ", ", r, pid);
    }
  } catch (const std::exception&) {
    return "; the rendezvous store is unreachable too (its host may have died or be stopped)";
  }
  return out;
}

void publish_failure(c10d::Store& store, int rank, const FailureRecord& rec) noexcept {
  try {
    // compareSet answers, so the record is in the store before this rank closes a connection.
    store.compareSet(key("failed", rank), {}, to_bytes(fmt::format("{}\n{}", rec.root, rec.what)));
    store.add("failures", 1);
  } catch (const std::exception& e) {
    spdlog::warn("rank {}: could not record its failure in the rendezvous store ({}): the other ranks will not see "
                 "what it was",
                 rank, e.what());
  }
}

void publish_abort(c10d::Store& store, const std::string& why) noexcept {
  try {
    store.compareSet("abort", {}, to_bytes(why));
  } catch (const std::exception& e) {
    spdlog::warn("could not tell the other ranks to stop through the rendezvous store ({}): they stop at their timeout", e.what());
  }
}

std::optional<FailureRecord> read_failure(c10d::Store& store, int rank) noexcept {
  try {
    if (!store.check({key("failed", rank)})) return std::nullopt;
    const std::string v = to_text(store.get(key("failed", rank)));
    const auto nl = v.find('\n');
    long long root = -1;
    if (nl == std::string::npos || !parse_int(v.substr(0, nl), root)) return std::nullopt;
    return FailureRecord{static_cast<int>(root), v.substr(nl + 1)};
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

FailureRecord root_failure(c10d::Store& store, int self, int world, int peer, const std::string& own, double wait_s) {
  const double deadline = now_s() + wait_s;
  for (;;) {
    for (int r = 0; r < world; ++r) {
      if (r == self || (peer >= 0 && r != peer)) continue;
      if (auto rec = read_failure(store, r)) return *rec;
    }
    if (now_s() >= deadline) return {peer, own};
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

StoreHost::StoreHost(const std::string& addr, int port, double timeout_s, const JobIdentity& job, bool c10d_protocol,
                     bool all_interfaces) {
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  if (c10d_protocol && !job.secret.empty())
    throw ConfigError("a secret (--secret-file) needs gasloc's own store: c10d's TCPStore, for commands that are not "
                      "gasloc train or gasloc comm-check, cannot be authenticated",
                      "leave out --secret-file for such a command");
  if (!c10d_protocol) {
    server_ = std::make_unique<StoreServer>(StoreServerOptions{addr, port, all_interfaces, job});
    port_ = server_->port();
    auto keys = server_->local();
    keys->setTimeout(timeout);
    store_ = job_keys(keys);
    return;
  }
  c10d::TCPStoreOptions so;
  so.port = static_cast<std::uint16_t>(port);
  so.isServer = true;
  so.waitWorkers = false;
  so.timeout = timeout;
  try {
    auto s = c10::make_intrusive<c10d::TCPStore>(addr, so);
    port_ = s->getPort();
    store_ = job_keys(s);
  } catch (const std::exception& e) {
    const std::string msg = e.what();
    throw CommError(fmt::format("cannot host a rendezvous store on {}:{}: {}", addr, port, msg.substr(0, msg.find('\n'))));
  }
}

StoreHost::~StoreHost() = default;

int StoreHost::port() const { return port_; }
c10d::Store& StoreHost::store() { return *store_; }

}  // namespace gasloc::comm
