#include "gasloc/comm/elastic_gloo.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <csignal>
#include <map>
#include <thread>

#include "gasloc/comm/gloo.hpp"
#include "gasloc/comm/heartbeat.hpp"
#include "gasloc/comm/pair_transfer.hpp"
#include "gasloc/comm/session_salt.hpp"
#include "gasloc/comm/by_hand.hpp"
#include "gasloc/core/error.hpp"

namespace gasloc::comm {

using Clock = std::chrono::steady_clock;

namespace {

constexpr double kConnectTimeoutS = 10.0;
// Tries at forming one pair's group, over both incarnations' lives (both ends count them in the
// store, so both stop at the same one): each on fresh ports, as a failed try is a failed edge
// that anyone who reaches the ports can cause (Gloo takes the first connection on each).
constexpr int64_t kPairGroupTries = 5;

// The keys of one pair group, under a prefix naming both incarnations; a wait for the peer's keys
// ends early, with an error, once the roster says the peer is gone (a group is never made with a
// dead process).
class PairStore final : public c10d::Store {
 public:
  PairStore(c10::intrusive_ptr<c10d::Store> base, std::string prefix, ElasticRoster& roster, int peer, int64_t peer_inc)
      : base_(std::move(base)), prefix_(std::move(prefix)), roster_(roster), peer_(peer), peer_inc_(peer_inc) {}
  // LibTorch 2.x declares c10d::Store::clone() (a handle to the same store for another thread);
  // written without `override` so that 1.13, which has none, compiles it as a new function.
  // Pair groups are Gloo's, which uses the store from the thread that made the group: itself.
  virtual c10::intrusive_ptr<c10d::Store> clone() { return c10::intrusive_ptr<c10d::Store>::reclaim_copy(this); }
  void set(const std::string& k, const std::vector<uint8_t>& v) override { base_->set(prefix_ + k, v); }
  std::vector<uint8_t> compareSet(const std::string& k, const std::vector<uint8_t>& e, const std::vector<uint8_t>& d) override {
    return base_->compareSet(prefix_ + k, e, d);
  }
  std::vector<uint8_t> get(const std::string& k) override {
    wait({k});
    std::vector<uint8_t> value = base_->get(prefix_ + k);
    if (gasloc_test_pair_key_read) gasloc_test_pair_key_read((prefix_ + k).c_str(), value.data(), value.size());
    return value;
  }
  int64_t add(const std::string& k, int64_t v) override { return base_->add(prefix_ + k, v); }
  bool deleteKey(const std::string& k) override { return base_->deleteKey(prefix_ + k); }
  bool check(const std::vector<std::string>& keys) override { return base_->check(prefixed(keys)); }
  int64_t getNumKeys() override { return base_->getNumKeys(); }
  void wait(const std::vector<std::string>& keys) override { wait(keys, getTimeout()); }
  // Gloo passes its own (short) timeout; the peer's arrival may take as long as a round, so this
  // waits for the store's timeout instead, ending early once the peer is gone. A peer found gone
  // after it published its address is refused too: Gloo would retry connecting to it until its
  // timeout.
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds&) override {
    const auto deadline = Clock::now() + getTimeout();
    for (int n = 0;; ++n) {
      if (base_->check(prefixed(keys))) {
        if (roster_.gone(peer_, peer_inc_))
          throw CommError(fmt::format("rank {} left the job before its pair group formed", peer_));
        return;
      }
      if (n % 10 == 9 && roster_.gone(peer_, peer_inc_))
        throw CommError(fmt::format("rank {} left the job before its pair group formed", peer_));
      if (Clock::now() > deadline) throw CommError(fmt::format("rank {} did not form a pair group in time", peer_));
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

 private:
  std::vector<std::string> prefixed(const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    for (const auto& k : keys) out.push_back(prefix_ + k);
    return out;
  }
  c10::intrusive_ptr<c10d::Store> base_;
  std::string prefix_;
  ElasticRoster& roster_;
  int peer_;
  int64_t peer_inc_;
};

struct PairGroup {
  c10::intrusive_ptr<C10dBackend> pg;
  int64_t peer_inc = 0;
  int64_t attempt = 0;  // the try that formed it (its ports, keys and sealed channels are its own)
  uint32_t calls = 0;   // both ends count the calls they made together (pair_transfer.hpp)
};

// The pair's name in keys and sealed channels: both ids and incarnations, the lower id first.
std::string pair_name(int me, int64_t my_inc, int peer, int64_t peer_inc) {
  return me < peer ? fmt::format("{}.{}-{}.{}", me, my_inc, peer, peer_inc)
                   : fmt::format("{}.{}-{}.{}", peer, peer_inc, me, my_inc);
}

// The try at forming the pair's group that both ends are at: el/pg/PAIR/try holds it once a try
// failed (none: the first, 0).
int64_t pair_try(c10d::Store& store, const std::string& pair) {
  const std::string key = "el/pg/" + pair + "/try";
  return store.check({key}) ? std::stoll(to_text(store.get(key))) : 0;
}
// Try `attempt` failed at this end or the other: both go on with the next (whichever end is first).
void next_pair_try(c10d::Store& store, const std::string& pair, int64_t attempt) {
  store.compareSet("el/pg/" + pair + "/try", attempt == 0 ? std::vector<uint8_t>{} : to_bytes(std::to_string(attempt)),
                   to_bytes(std::to_string(attempt + 1)));
}
// The keys of one try: the first keeps the name of a pair's only try before tries existed.
std::string pair_try_prefix(const std::string& pair, int64_t attempt) {
  return attempt == 0 ? "el/pg/" + pair + "/" : fmt::format("el/pg/{}/try{}/", pair, attempt);
}

}  // namespace

struct ElasticGlooComm::Impl {
  GlooOptions o;
  int64_t inc = 0;
  std::chrono::milliseconds timeout{};
  c10::intrusive_ptr<c10d::Store> store;
  std::unique_ptr<ElasticRoster> roster;
  std::unique_ptr<ElasticRoster> watch_roster;  // the abort watch's own connection
  std::map<int, PairGroup> groups;
  // Peers (by incarnation) whose group failed: never formed again. Their published addresses are
  // stale, and Gloo connecting to a dead process's address does not give up; the incarnation is
  // on its way out of the views (the store host declares it dead, or kills it as a suspect).
  std::map<int, int64_t> broken;
  // A job with a secret: every transfer sealed, a channel per pair of incarnations and call (the
  // pair's group forms once for two incarnations, and the salt is new at every start of the store).
  std::unique_ptr<PairSealing> sealing;
  CommStats stats;
  std::unique_ptr<LinkLimit> limit;  // network.throttle_gloo
  Clock::time_point t0 = Clock::now();
  std::unique_ptr<Heartbeat> heartbeat;  // last: stops first

  // The group with `peer` as the newest view names it; nullptr when it cannot form (the peer is
  // gone, or every try failed). A failed try is a failed edge, never evidence against the peer:
  // both ends go on with the next try, on fresh ports.
  PairGroup* group(int peer, std::string& why) {
    const int64_t peer_inc = roster->incarnation_of(peer);
    auto it = groups.find(peer);
    if (it != groups.end() && it->second.peer_inc == peer_inc) return &it->second;
    if (const auto b = broken.find(peer); b != broken.end() && b->second == peer_inc) {
      why = fmt::format("its link to incarnation {} failed before", peer_inc);
      return nullptr;
    }
    if (it != groups.end()) groups.erase(it);
    const std::string pair = pair_name(o.rank, inc, peer, peer_inc);
    for (int64_t attempt = pair_try(*store, pair); attempt < kPairGroupTries; attempt = pair_try(*store, pair)) {
      if (form(peer, peer_inc, pair, attempt, why)) return &groups.at(peer);
      if (roster->gone(peer, peer_inc)) return nullptr;
      spdlog::warn("rank {}: the pair group with rank {} (incarnations {}) did not form on try {}: {}; trying again on "
                   "fresh ports", o.rank, peer, pair, attempt + 1, why);
      next_pair_try(*store, pair, attempt);
    }
    broken[peer] = peer_inc;
    why = fmt::format("no pair group of rank {} with rank {} (incarnations {}) formed in {} tries, each on fresh ports "
                      "(the last: {}); someone else may be connecting first to the pair's ports (Gloo takes the first "
                      "connection on each), or a firewall refuses them; the edge stays failed while both live",
                      o.rank, peer, pair, kPairGroupTries, why.empty() ? "at the other end" : why);
    return nullptr;
  }

  // One try at the pair's group, on ports of its own; true once both ends formed it with each
  // other (then it is groups[peer]). Gloo accepts the first connection on a listening port,
  // whoever makes it: an end may "form" its group with someone else while the other end's connect
  // is refused. So both ends first swap a hello through the group (sealed when the job has a
  // secret: nobody else can write it), then each says in the store whether its side held.
  bool form(int peer, int64_t peer_inc, const std::string& pair, int64_t attempt, std::string& why) {
    const std::string prefix = pair_try_prefix(pair, attempt);
    bool held = false;
    try {
      auto ps = c10::make_intrusive<PairStore>(store, prefix, *roster, peer, peer_inc);
      ps->setTimeout(timeout);
      // Both ends have published their addresses when Gloo connects: a connect that takes long
      // is to a peer that died in between (Gloo retries a refused connect until its timeout).
      const int me = o.rank < peer ? 0 : 1;
      groups[peer] = PairGroup{gloo_group(o, ps, me, 2, std::min(o.timeout_s, kConnectTimeoutS)), peer_inc, attempt, 0};
      held = hello(peer, peer_inc, prefix, why);
    } catch (const std::exception& e) {
      why = backend_error(e);
    }
    store->set(prefix + "held/" + std::to_string(o.rank), to_bytes(held ? "1" : "0"));
    if (held && !peer_held(peer, peer_inc, prefix, why)) held = false;
    if (!held) groups.erase(peer);
    return held;
  }

  // The pair's first call: each end sends (its id, incarnation, try) and checks what came back.
  bool hello(int peer, int64_t peer_inc, const std::string& prefix, std::string& why) {
    PairGroup& g = groups.at(peer);
    const auto mine = torch::tensor({int64_t{o.rank}, inc, g.attempt}, torch::kLong);
    const auto expected = torch::tensor({int64_t{peer}, peer_inc, g.attempt}, torch::kLong);
    std::vector<torch::Tensor> got{torch::empty_like(mine)};
    PairTransferOptions po;
    po.rank = o.rank;
    po.timeout = std::chrono::milliseconds(static_cast<int64_t>(std::min(o.timeout_s, kConnectTimeoutS) * 1000));
    po.seal = sealing.get();
    // The other end gave this try up (its connect was refused): no hello is coming.
    const std::string peer_held_key = prefix + "held/" + std::to_string(peer);
    po.gone = [&](int) {
      auto& s = watch_roster->store();
      return watch_roster->gone(peer, peer_inc) || (s.check({peer_held_key}) && to_text(s.get(peer_held_key)) != "1");
    };
    const auto r = transfer_pairs({{peer, g.pg.get(), o.rank < peer ? 1 : 0, &g.calls}}, mine, got, po).at(0);
    if (r.outcome == PeerOutcome::received && torch::equal(got[0], expected)) return true;
    if (r.outcome == PeerOutcome::received) why = "the pair's hello came from someone else";
    else if (store->check({peer_held_key}) && to_text(store->get(peer_held_key)) != "1")
      why = fmt::format("rank {} could not form its end (its connect failed)", peer);
    else why = "the pair's hello: " + r.why;
    return false;
  }

  // Whether the other end held this try too (false when it did not, left, or never said).
  bool peer_held(int peer, int64_t peer_inc, const std::string& prefix, std::string& why) {
    const std::string key = prefix + "held/" + std::to_string(peer);
    const auto deadline = Clock::now() + timeout;
    for (int n = 0; !store->check({key}); ++n) {
      if ((n % 10 == 9 && roster->gone(peer, peer_inc)) || Clock::now() > deadline) {
        why = fmt::format("rank {} did not say whether its end of the pair group held", peer);
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (to_text(store->get(key)) == "1") return true;
    why = fmt::format("rank {} could not form its end", peer);
    return false;
  }

  // After a round's transfers: a peer whose link failed while the roster still lists it alive a
  // moment later is reported, and the launcher fences it (kills it; it restarts and rejoins).
  void report(int peer, const std::string& why) {
    // A rank declared dead itself (stopped past the heartbeat timeout) sees its links fail because
    // its peers left it: it is out of the next view, and must not blame them.
    if (roster->gone(o.rank, inc)) return;
    const int64_t peer_inc = roster->incarnation_of(peer);
    for (int n = 0; n < 20; ++n) {
      if (roster->gone(peer, peer_inc)) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    spdlog::warn("rank {}: the link to rank {} failed ({}) while rank {} is alive; reporting it", o.rank, peer, why, peer);
    roster->suspect(peer, peer_inc);
  }

  // Sends `send` to every peer and receives theirs; a failed peer's entry stays undefined.
  std::vector<torch::Tensor> swap(const std::vector<int>& peers, const torch::Tensor& send);
};

std::vector<torch::Tensor> ElasticGlooComm::Impl::swap(const std::vector<int>& peers, const torch::Tensor& send) {
  std::vector<PeerResult> results(peers.size());
  // Groups form in ascending pair order: with one order for every rank no cycle of waits forms.
  std::vector<size_t> order(peers.size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = k;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return peers[a] < peers[b]; });
  std::vector<size_t> linked;  // peers[linked[i]] is links[i]
  std::vector<PairLink> links;
  for (size_t k : order) {
    std::string why;
    PairGroup* g = group(peers[k], why);
    if (!g) {
      results[k] = {PeerOutcome::failed, false, why};  // never arrived: reported too, unless it is gone
      continue;
    }
    linked.push_back(k);
    links.push_back({peers[k], g->pg.get(), o.rank < peers[k] ? 1 : 0, &g->calls});
  }
  std::vector<torch::Tensor> got(peers.size()), into(links.size());
  for (auto& t : into) t = torch::empty_like(send, torch::MemoryFormat::Contiguous);
  PairTransferOptions po;
  po.rank = o.rank;
  po.timeout = timeout;
  po.stand_by_on_empty = true;
  po.limit = limit.get();
  po.seal = sealing.get();
  // A peer cut off by a dead link sends no reset: its waits end once the roster lists it gone
  // (read over the abort watch's own connection), not at the timeout.
  if (watch_roster)
    po.gone = [this](int peer) { return watch_roster->gone(peer, roster->incarnation_of(peer)); };
  int64_t moved = 0;
  const std::vector<PeerResult> linked_results = transfer_pairs(links, send, into, po, &moved);
  for (size_t i = 0; i < links.size(); ++i) {
    results[linked[i]] = linked_results[i];
    if (linked_results[i].outcome == PeerOutcome::received) got[linked[i]] = into[i];
  }
  stats.bytes_sent += moved;
  stats.bytes_received += moved;
  for (size_t k = 0; k < peers.size(); ++k) {
    const PeerResult& r = results[k];
    if (r.outcome == PeerOutcome::mismatch)
      throw CommError(r.why, "both ends of a link must run the same job (model, algorithm and wire dtype)");
    if (r.outcome == PeerOutcome::unopened) {
      // A failed edge this round, and nothing against the peer: anyone on the path can alter a
      // message. Its group is fine (both ends finished their transfers), so it is kept.
      spdlog::warn("{} (the edge is dropped this round; the peer is not suspected)", r.why);
      continue;
    }
    if (r.outcome != PeerOutcome::failed) continue;
    // A Gloo group is unusable after a failed wait: dropped, and never formed again with this
    // incarnation (the works that referred to its buffers are released already).
    if (const auto g = groups.find(peers[k]); g != groups.end()) {
      broken[peers[k]] = g->second.peer_inc;
      groups.erase(g);
    }
    report(peers[k], r.why);
  }
  return got;
}

ElasticGlooComm::ElasticGlooComm(const GlooOptions& o, int64_t incarnation, bool join, double heartbeat_timeout_s)
    : impl_(std::make_unique<Impl>()) {
  validate(o);
  auto& I = *impl_;
  I.o = o;
  I.inc = incarnation;
  I.timeout = std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1000));
  I.limit = std::make_unique<LinkLimit>(o.bandwidth_limit_Bps);
  if (o.agent_store)
    throw CommError("cluster.elastic over Gloo needs gasloc's store: start the ranks with `gasloc launch --elastic`",
                    "torchrun's agent store has no roster of incarnations");
  check_job_secret(o);
  I.store = job_keys_connection(o, o.timeout_s);
  if (!I.store->check({elastic_keys::roster()}))
    throw CommError(fmt::format("rank {}: the store at {}:{} holds no elastic roster", o.rank, o.master_addr, o.master_port),
                    "start elastic runs with `gasloc launch --elastic -n N -- gasloc train ...`, or start the store "
                    "with `gasloc store --elastic -n N` for ranks started by hand");
  if (heartbeat_timeout_s > 0)
    I.store->compareSet(elastic_keys::heartbeat_timeout(), {}, to_bytes(fmt::format("{}", heartbeat_timeout_s)));
  // Started by hand: the store host answers which incarnation this is, and whether it founds the
  // job or joins it; gasloc launch --elastic tells its ranks.
  std::optional<bool> founding;
  if (join) founding = false;
  if (incarnation < 0) {
    // Asked before claiming an incarnation, so that a refusal leaves the host nothing to answer.
    if (join && founds_the_job(*I.store, o.rank))
      throw ConfigError(fmt::format("rank {} was started with cluster.join = true, but the job at the store has not "
                                    "started yet: rank {} is one of its founding members",
                                    o.rank, o.rank),
                        "start it without cluster.join; once every rank of the job has started, a rank started "
                        "again joins by itself");
    const Admission a = admit_by_hand(*I.store, o.rank, o.world, o.timeout_s);
    I.inc = incarnation = a.incarnation;
    founding = a.founding;
  }
  I.roster = std::make_unique<ElasticRoster>(I.store, o.rank, incarnation, founding);
  if (!o.job.secret.empty())
    I.sealing = std::make_unique<PairSealing>(PairSealing{
        o.job.secret, read_session_salt(I.store), o.job.token, [&I](const PairLink& l, uint32_t call) {
          // Each try at forming the pair's group counts its calls from 0: its channels are its own.
          const auto g = I.groups.find(l.peer);
          const int64_t peer_inc = g != I.groups.end() ? g->second.peer_inc : -1;
          const int64_t attempt = g != I.groups.end() ? g->second.attempt : 0;
          return fmt::format("el {}{} call {}", pair_name(I.o.rank, I.inc, l.peer, peer_inc),
                             attempt == 0 ? "" : fmt::format(" try {}", attempt), call);
        }});
  // Gloo writes to its sockets without MSG_NOSIGNAL: a write to a peer that just died would raise
  // SIGPIPE and kill this survivor too. Ignored, the write fails with EPIPE: a failed edge.
  std::signal(SIGPIPE, SIG_IGN);
  // Both talk to the store for the whole job, through a host that may pause: a failed call opens a
  // new connection for the next one.
  I.watch_roster = std::make_unique<ElasticRoster>(job_keys_reconnecting(o), o.rank, incarnation, founding);
  I.heartbeat = std::make_unique<Heartbeat>(job_keys_reconnecting(o), o.rank);
  if (founding.value_or(false)) await_founded(*I.store, o.rank, o.timeout_s);
  I.t0 = Clock::now();
}

ElasticGlooComm::~ElasticGlooComm() {
  if (impl_->roster) announce_out(*impl_->store, impl_->o.rank, impl_->inc);
}

int ElasticGlooComm::rank() const { return impl_->o.rank; }
int ElasticGlooComm::world() const { return impl_->o.world; }
ElasticRoster& ElasticGlooComm::roster() { return *impl_->roster; }
CommStats ElasticGlooComm::stats() const { return impl_->stats; }
double ElasticGlooComm::now() const { return std::chrono::duration<double>(Clock::now() - impl_->t0).count(); }

namespace {
[[noreturn]] void no_global(const char* op) {
  throw CommError(fmt::format("{}: an elastic run has no global collective", op),
                  "this is a bug in gasloc: elastic runs evaluate, stop and checkpoint without one");
}
}  // namespace

void ElasticGlooComm::all_reduce_mean(torch::Tensor&) { no_global("all_reduce_mean"); }
void ElasticGlooComm::broadcast(torch::Tensor&, int) { no_global("broadcast"); }
void ElasticGlooComm::barrier() { no_global("barrier"); }

void ElasticGlooComm::exchange(const std::vector<int>& peers, const torch::Tensor& send, std::vector<torch::Tensor>& recv) {
  auto& I = *impl_;
  for (int p : peers)
    if (p < 0 || p >= I.o.world || p == I.o.rank)
      throw CommError(fmt::format("rank {}: exchange with rank {}: peers must be other ranks in 0..{}", I.o.rank, p, I.o.world - 1));
  recv.assign(peers.size(), torch::Tensor());
  if (peers.empty()) return;
  const auto start = Clock::now();
  // A rank that sends nothing (undefined) sends an empty buffer: its peers' headers say so.
  recv = I.swap(peers, send.defined() ? send.contiguous() : torch::empty({0}, torch::kFloat));
  I.stats.idle_s += std::chrono::duration<double>(Clock::now() - start).count();
}

bool ElasticGlooComm::all_reduce_mean_over(torch::Tensor& t, const std::vector<int>& members, int64_t call_id) {
  auto& I = *impl_;
  const auto me = std::find(members.begin(), members.end(), I.o.rank);
  if (!t.defined() || me == members.end()) return true;  // not a member: nothing to do
  const auto start = Clock::now();
  std::vector<int> others;
  for (int m : members)
    if (m != I.o.rank) others.push_back(m);
  const torch::Tensor flat = t.reshape({-1}).contiguous();
  const std::vector<torch::Tensor> got = I.swap(others, flat);
  const bool complete = std::all_of(got.begin(), got.end(), [](const torch::Tensor& g) { return g.defined(); });
  // One key decides for every member: commit once all received everything, abort otherwise.
  const std::string decision = elastic_keys::all_reduce(call_id);
  auto ok_key = [&](int m) { return elastic_keys::all_reduce_ok(call_id, m); };
  auto decide = [&](const char* d) { return to_text(I.store->compareSet(decision, {}, to_bytes(d))) == "commit"; };
  bool commit = false;
  if (!complete) {
    commit = decide("abort");
  } else {
    I.store->set(ok_key(I.o.rank), to_bytes("1"));
    std::vector<std::string> oks;
    for (int m : members) oks.push_back(ok_key(m));
    const auto deadline = Clock::now() + I.timeout;
    for (int n = 0;; ++n) {
      if (I.store->check({decision})) {
        commit = to_text(I.store->get(decision)) == "commit";
        break;
      }
      if (I.store->check(oks)) {
        commit = decide("commit");
        break;
      }
      const bool someone_gone = n % 10 == 9 && std::any_of(others.begin(), others.end(), [&](int m) {
        return !I.store->check({ok_key(m)}) && I.roster->gone(m, I.roster->incarnation_of(m));
      });
      if (someone_gone || Clock::now() > deadline) {
        commit = decide("abort");
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  I.stats.idle_s += std::chrono::duration<double>(Clock::now() - start).count();
  if (!commit) return false;
  // The in-process reference's sum: ids ascending, half precision summed in fp32, then / k.
  const bool upcast = flat.scalar_type() == torch::kHalf || flat.scalar_type() == torch::kBFloat16;
  torch::Tensor acc;
  size_t k = 0;
  for (int m : members) {
    const torch::Tensor& x = m == I.o.rank ? flat : got[k++];
    if (!acc.defined()) acc = upcast ? x.to(torch::kFloat) : x.clone();
    else acc.add_(x);
  }
  acc.div_(static_cast<int>(members.size()));
  t.copy_(acc.view(t.sizes()));
  return true;
}

}  // namespace gasloc::comm
