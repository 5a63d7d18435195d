#include "gasloc/comm/pair_transfer.hpp"

#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/exception.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <numeric>
#include <optional>
#include <sstream>
#include <thread>

#include "gasloc/core/sealed_channel.hpp"
#include "gasloc/core/secret.hpp"

namespace gasloc::comm {

using Clock = std::chrono::steady_clock;

namespace {

constexpr int kHeader = 0, kPayload = 1;
constexpr int64_t kMagic = 0x6761736c6f63;  // "gasloc": a header that is not ours is a bug, not data
// A pair's tag: its call count (27 bits, wrapping), its lane and the phase, below Gloo's slots.
int make_tag(uint32_t call, int lane, int phase) {
  return static_cast<int>(((call & 0x07FFFFFFu) << 3) | (static_cast<uint32_t>(lane & 1) << 2) | static_cast<uint32_t>(phase));
}

// While a phase waits: aborts the works of a peer `gone` names, or of every peer once `abort` is
// set. A Gloo wait cannot be cut short by a timeout without breaking its group, so it is aborted.
class AbortWatch {
 public:
  struct Watched {
    int peer;
    c10::intrusive_ptr<c10d::Work> send, recv;  // held here too: aborted only while alive
  };
  AbortWatch(const PairTransferOptions& o, std::vector<Watched> watched) : o_(o), watched_(std::move(watched)) {
    if (watched_.empty() || (!o.gone && !o.abort)) return;
    thread_ = std::thread([this] { run(); });
  }
  ~AbortWatch() {
    {
      std::lock_guard lk(mu_);
      done_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  AbortWatch(const AbortWatch&) = delete;
  AbortWatch& operator=(const AbortWatch&) = delete;

 private:
  void run() {
    std::unique_lock lk(mu_);
    for (int tick = 0; !cv_.wait_for(lk, std::chrono::milliseconds(50), [this] { return done_; }); ++tick) {
      lk.unlock();
      const bool all = o_.abort && o_.abort->load();
      for (auto& w : watched_) {
        // The roster is read every 250 ms; an abort is seen within 50.
        if (!all && (!o_.gone || tick % 5 != 4 || !peer_gone(w.peer))) continue;
        if (w.recv) w.recv->abort();
        if (w.send) w.send->abort();
        w.recv.reset();
        w.send.reset();
      }
      lk.lock();
    }
  }
  bool peer_gone(int peer) {
    try {
      return o_.gone(peer);
    } catch (const std::exception& e) {
      // The store does not answer now: the wait's own deadline still bounds it. Said once a call.
      if (!store_error_logged_) {
        store_error_logged_ = true;
        fmt::print(stderr, "rank {}: cannot read the roster while waiting for rank {} ({}); waiting for the timeout\n",
                   o_.rank, peer, backend_error(e));
      }
      return false;
    }
  }
  const PairTransferOptions& o_;
  std::vector<Watched> watched_;
  bool store_error_logged_ = false;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

// One phase: posts a send of `out` and a receive into in[k] for every link still fine, waits for
// them, and records failures in results.
class Phase {
 public:
  Phase(const std::vector<PairLink>& links, const PairTransferOptions& o, std::vector<PeerResult>& results)
      : links_(links), o_(o), results_(results), order_(links.size()), recv_(links.size()), send_(links.size()) {
    // The caller's order otherwise: the first wait that fails is the peer a failure is blamed on.
    std::iota(order_.begin(), order_.end(), size_t{0});
    if (o.pairs_in_order)
      std::sort(order_.begin(), order_.end(), [&](size_t a, size_t b) { return links[a].peer < links[b].peer; });
  }

  // False when fail_fast stopped it at a failure. outs: one tensor for every link, or one each.
  bool run(const std::vector<torch::Tensor>& outs, std::vector<torch::Tensor>& in, int phase,
           const std::vector<uint32_t>& calls) {
    if (o_.pairs_in_order) {
      for (size_t k : order_) {
        const bool lower = o_.rank < links_[k].peer;
        if (!post(k, lower ? Post::send : Post::recv, outs, in, phase, calls)) return false;
        if (!post(k, lower ? Post::recv : Post::send, outs, in, phase, calls)) return false;
      }
    } else {
      for (size_t k : order_)
        if (!post(k, Post::recv, outs, in, phase, calls)) return false;
      for (size_t k : order_)
        if (!post(k, Post::send, outs, in, phase, calls)) return false;
    }
    const auto deadline = Clock::now() + o_.timeout;
    std::vector<AbortWatch::Watched> watched;
    for (size_t k : order_)
      if (live(k)) watched.push_back({links_[k].peer, send_[k], recv_[k]});
    const AbortWatch watch(o_, std::move(watched));
    for (size_t k : order_)
      if (!wait(k, recv_[k], deadline)) return false;
    for (size_t k : order_)
      if (!wait(k, send_[k], deadline)) return false;
    return true;
  }

 private:
  enum class Post { send, recv };
  bool live(size_t k) const { return results_[k].outcome == PeerOutcome::received; }

  bool post(size_t k, Post what, const std::vector<torch::Tensor>& outs, std::vector<torch::Tensor>& in, int phase,
            const std::vector<uint32_t>& calls) {
    if (!live(k)) return true;
    const PairLink& l = links_[k];
    const int tag = make_tag(calls[k], l.lane, phase);
    try {
      if (what == Post::recv) {
        std::vector<at::Tensor> r{in[k]};
        recv_[k] = l.group->recv(r, l.remote, tag);
      } else {
        std::vector<at::Tensor> s{outs.size() == 1 ? outs[0] : outs[k]};
        send_[k] = l.group->send(s, l.remote, tag);
      }
    } catch (const std::exception& e) {
      return failed(k, false, backend_error(e));
    }
    return true;
  }

  bool wait(size_t k, const c10::intrusive_ptr<c10d::Work>& w, Clock::time_point deadline) {
    if (!live(k) || !w) return true;
    // 0 ms would mean "no timeout" to c10d; never pass it.
    const auto left =
        std::max(std::chrono::milliseconds(1), std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
    bool timed_out = false;
    std::string why;
    try {
      if (w->wait(left)) return true;
      why = "aborted";
    } catch (const c10d::TimeoutError& e) {
      timed_out = true;
      why = backend_error(e);
    } catch (const std::exception& e) {
      why = backend_error(e);
    }
    if (o_.abort && o_.abort->load()) why = "aborted (Pending::abort)";
    // Gloo reports its own timeout as an IoException, the type of a closed connection too, and
    // Work::wait(timeout) as a plain c10::Error, both at the deadline they were given; the margin
    // covers the backend's clock, started a moment before ours.
    timed_out = timed_out || Clock::now() + std::chrono::milliseconds(50) >= deadline;
    return failed(k, timed_out, why);
  }

  bool failed(size_t k, bool timed_out, const std::string& why) {
    results_[k] = {PeerOutcome::failed, timed_out, why.empty() ? "failed" : why};
    return !o_.fail_fast;
  }

  const std::vector<PairLink>& links_;
  const PairTransferOptions& o_;
  std::vector<PeerResult>& results_;
  std::vector<size_t> order_;
  std::vector<c10::intrusive_ptr<c10d::Work>> recv_, send_;
};

// The headers received must be ours and announce the buffer this rank sends.
void check_header(const PairTransferOptions& o, const PairLink& l, const torch::Tensor& header, const torch::Tensor& send,
                  PeerResult& r) {
  const auto h = header.cpu();
  const auto hv = h.accessor<int64_t, 1>();
  if (hv[0] != kMagic) {
    r = {PeerOutcome::mismatch, false,
         fmt::format("rank {}: exchange with rank {}: received a malformed header (is rank {} running another program or "
                     "version?)",
                     o.rank, l.peer, l.peer)};
    return;
  }
  // A rank that sends nothing stands by (it does not mix this round): an edge that carries nothing.
  if (o.stand_by_on_empty && (hv[1] == 0 || send.numel() == 0)) {
    r = {PeerOutcome::stood_by, false, "sent nothing"};
    return;
  }
  if (hv[1] == send.numel() && hv[2] == static_cast<int64_t>(send.scalar_type())) return;
  // Lower rank first, so both ends print the same sentence.
  std::string a = fmt::format("rank {} sends {} {} elements", o.rank, send.numel(),
                              dtype_name(static_cast<int64_t>(send.scalar_type())));
  std::string b = fmt::format("rank {} sends {} {} elements", l.peer, hv[1], dtype_name(hv[2]));
  if (l.peer < o.rank) std::swap(a, b);
  r = {PeerOutcome::mismatch, false,
       fmt::format("rank {}: exchange with rank {}: {} but {}; both ends of a link must exchange buffers of the same size "
                   "and dtype",
                   o.rank, l.peer, a, b)};
}

// A sealed header: (magic, numel, dtype) and its tag.
constexpr int64_t kSealedHeaderBytes = 3 * 8 + static_cast<int64_t>(crypto::kGcmTagBytes);

// The sealing buffers of a call: the caller's kept ones, or this thread's.
torch::Tensor scratch(std::vector<torch::Tensor>* kept, size_t slot, int64_t bytes) {
  thread_local std::vector<torch::Tensor> own;
  return kept_bytes(kept ? *kept : own, slot, bytes);
}

std::span<uint8_t> bytes_of(const torch::Tensor& t) {
  return {static_cast<uint8_t*>(t.data_ptr()), static_cast<size_t>(t.numel()) * t.element_size()};
}

// One link's channel in a sealed call: seals what this rank sends and opens what the peer sent.
class Sealer {
 public:
  Sealer(const PairTransferOptions& o, const PairLink& l, uint32_t call, size_t k)
      : o_(o), peer_(l.peer), k_(k),
        ch_(o.seal->secret, o.seal->salt, o.seal->job, o.seal->channel(l, call), o.rank < l.peer) {}

  // The sealed bytes of `t` (contiguous), on the backend's device.
  torch::Tensor seal(const torch::Tensor& t, int phase) {
    const torch::Tensor host = t.to(torch::kCPU).contiguous();
    const auto plain = bytes_of(host);
    torch::Tensor out = phase == 0 ? torch::empty({kSealedHeaderBytes}, torch::kUInt8)
                                   : scratch(o_.seal_buffers, 2 * k_, static_cast<int64_t>(plain.size() + crypto::kGcmTagBytes));
    ch_.seal_into(plain, bytes_of(out));
    if (gasloc_test_tamper_sealed) gasloc_test_tamper_sealed(static_cast<uint8_t*>(out.data_ptr()), out.numel(), o_.rank, peer_, phase);
    return out.to(o_.device);
  }

  // Where the peer's sealed payload of `bytes` lands.
  torch::Tensor receive_buffer(int64_t bytes) const {
    return o_.device.is_cpu() ? scratch(o_.seal_buffers, 2 * k_ + 1, bytes) : torch::empty({bytes}, torch::TensorOptions().dtype(torch::kUInt8).device(o_.device));
  }

  // Opens the peer's sealed bytes into `into` (allocated like the plaintext). False, with r set to
  // unopened, when they do not open; `into` then holds zeros, nothing of the message.
  bool open(const torch::Tensor& sealed_t, torch::Tensor& into, PeerResult& r) {
    const torch::Tensor host = sealed_t.to(torch::kCPU).contiguous();
    const auto sealed = bytes_of(host);
    const size_t want = static_cast<size_t>(into.numel()) * into.element_size();
    if (sealed.size() != want + crypto::kGcmTagBytes) {  // the headers agreed: a bug, not an attack
      r = {PeerOutcome::mismatch, false,
           fmt::format("rank {}: exchange with rank {}: received {} sealed bytes where {} belong", o_.rank, peer_,
                       sealed.size(), want + crypto::kGcmTagBytes)};
      return false;
    }
    const bool direct = into.is_cpu() && into.is_contiguous();
    torch::Tensor plain = direct ? into : torch::empty(into.sizes(), into.options().device(torch::kCPU));
    try {
      ch_.open_into(sealed, bytes_of(plain));
    } catch (const SealError& e) {
      r = {PeerOutcome::unopened, false, fmt::format("rank {}: from rank {}: {}", o_.rank, peer_, e.what())};
      return false;
    }
    if (!direct) into.copy_(plain);
    return true;
  }

 private:
  const PairTransferOptions& o_;
  int peer_;
  size_t k_;  // the link's place in the call: its scratch slots
  SealedChannel ch_;
};

}  // namespace

std::string dtype_name(int64_t t) {
  switch (static_cast<c10::ScalarType>(t)) {
    case c10::ScalarType::Float: return "float32";
    case c10::ScalarType::Double: return "float64";
    case c10::ScalarType::Half: return "float16";
    case c10::ScalarType::BFloat16: return "bfloat16";
    case c10::ScalarType::Long: return "int64";
    case c10::ScalarType::Int: return "int32";
    case c10::ScalarType::Byte: return "uint8";
    case c10::ScalarType::Char: return "int8";
    default: return t >= 0 && t < static_cast<int64_t>(c10::ScalarType::NumOptions)
                        ? c10::toString(static_cast<c10::ScalarType>(t))
                        : fmt::format("dtype #{}", t);
  }
}

std::string backend_error(const std::exception& e) {
  const auto* c10e = dynamic_cast<const c10::Error*>(&e);
  std::istringstream in(c10e ? c10e->what_without_backtrace() : e.what());
  std::string out, line;
  while (std::getline(in, line)) {
    // Gloo's "[../third_party/gloo/gloo/transport/tcp/pair.cc:598] " before its message.
    if (!line.empty() && line[0] == '[') {
      const auto close = line.find("] ");
      if (close != std::string::npos && line.find(".cc:") < close) line = line.substr(close + 2);
    }
    if (line.empty()) continue;
    if (!out.empty()) out += "; ";
    out += line;
  }
  return gloo_ports_decoded(out);
}

torch::Tensor kept_bytes(std::vector<torch::Tensor>& pool, size_t slot, int64_t bytes, torch::Device device) {
  if (pool.size() <= slot) pool.resize(slot + 1);
  torch::Tensor& t = pool[slot];
  if (!t.defined() || t.numel() < bytes || t.device() != device || t.storage().use_count() != 1)
    t = torch::empty({bytes}, torch::TensorOptions().dtype(torch::kUInt8).device(device));
  return t.narrow(0, 0, bytes);
}

std::vector<PeerResult> transfer_pairs(const std::vector<PairLink>& links, const torch::Tensor& send,
                                       std::vector<torch::Tensor>& into, const PairTransferOptions& o,
                                       int64_t* bytes_moved) {
  return transfer_pairs(links, std::vector<torch::Tensor>{send}, into, o, bytes_moved);
}

std::vector<PeerResult> transfer_pairs(const std::vector<PairLink>& links, const std::vector<torch::Tensor>& sends,
                                       std::vector<torch::Tensor>& into, const PairTransferOptions& o,
                                       int64_t* bytes_moved) {
  if (sends.size() != 1 && sends.size() != links.size())
    throw CommError(fmt::format("transfer_pairs: {} buffers for {} links (one for all, or one each)", sends.size(), links.size()));
  for (const auto& s : sends)
    if (s.numel() != sends[0].numel() || s.scalar_type() != sends[0].scalar_type())
      throw CommError("transfer_pairs: the buffers of one call must share a size and a dtype (the headers announce one)");
  const torch::Tensor& send = sends[0];  // what the headers announce
  auto send_of = [&](size_t k) -> const torch::Tensor& { return sends.size() == 1 ? sends[0] : sends[k]; };
  std::vector<PeerResult> results(links.size());
  if (bytes_moved) *bytes_moved = 0;
  if (links.empty()) return results;
  std::vector<uint32_t> calls(links.size());
  for (size_t k = 0; k < links.size(); ++k) calls[k] = (*links[k].calls)++;
  Phase phase(links, o, results);
  std::vector<Sealer> sealers;
  sealers.reserve(o.seal ? links.size() : 0);
  if (o.seal)
    for (size_t k = 0; k < links.size(); ++k) sealers.emplace_back(o, links[k], calls[k], k);

  // 1. Headers: each side learns the other's buffer.
  const auto i64 = torch::TensorOptions().dtype(torch::kInt64).device(o.device);
  const torch::Tensor header =
      torch::tensor({kMagic, send.numel(), static_cast<int64_t>(send.scalar_type())}, torch::kInt64);
  std::vector<torch::Tensor> header_out, headers(links.size());
  if (o.seal) {
    for (auto& sealer : sealers) header_out.push_back(sealer.seal(header, kHeader));
    for (auto& h : headers) h = torch::empty({kSealedHeaderBytes}, torch::TensorOptions().dtype(torch::kUInt8).device(o.device));
  } else {
    header_out.push_back(header.to(o.device));
    for (auto& h : headers) h = torch::zeros({3}, i64);
  }
  if (!phase.run(header_out, headers, kHeader, calls)) return results;
  // A sealed header that does not open is decided after the payload: the peer's header did open
  // (or was altered too) and it moves its payload; so does this rank, as if the buffers agreed,
  // and drops what it receives. Both ends post the same transfers, and neither waits for one that
  // never comes (which would end as a failed link, against an honest peer).
  std::vector<std::optional<PeerResult>> unopened(links.size());
  for (size_t k = 0; k < links.size(); ++k) {
    if (results[k].outcome != PeerOutcome::received) continue;
    if (o.seal) {
      auto opened = torch::empty({3}, torch::kInt64);
      PeerResult r;
      if (!sealers[k].open(headers[k], opened, r)) {
        unopened[k] = r;
        continue;
      }
      headers[k] = opened;
    }
    check_header(o, links[k], headers[k], send, results[k]);
    if (o.fail_fast && results[k].outcome == PeerOutcome::mismatch) return results;
  }

  // 2. Payload, to the peers still fine. A rank with a bandwidth limit starts it late, as its
  // slow link would finish late.
  const int64_t plain_bytes = send.numel() * static_cast<int64_t>(send.element_size());
  const double nbytes = static_cast<double>(plain_bytes + (o.seal ? static_cast<int64_t>(crypto::kGcmTagBytes) : 0));
  const auto moving = std::count_if(results.begin(), results.end(),
                                    [](const PeerResult& r) { return r.outcome == PeerOutcome::received; });
  auto settle_unopened = [&] {
    for (size_t k = 0; k < links.size(); ++k)
      if (unopened[k]) results[k] = *unopened[k];
    return results;
  };
  if (moving == 0 || send.numel() == 0) return settle_unopened();
  if (o.limit) o.limit->pay(static_cast<double>(moving) * nbytes, static_cast<double>(moving) * nbytes);
  if (o.seal) {
    std::vector<torch::Tensor> sealed_out(links.size()), sealed_in(links.size());
    for (size_t k = 0; k < links.size(); ++k) {
      if (results[k].outcome != PeerOutcome::received) continue;
      sealed_out[k] = sealers[k].seal(send_of(k), kPayload);
      sealed_in[k] = sealers[k].receive_buffer(static_cast<int64_t>(nbytes));
    }
    // Links not moving keep an undefined tensor: Phase posts nothing for them.
    phase.run(sealed_out, sealed_in, kPayload, calls);
    for (size_t k = 0; k < links.size(); ++k)
      if (results[k].outcome == PeerOutcome::received && !unopened[k]) sealers[k].open(sealed_in[k], into[k], results[k]);
  } else {
    phase.run(sends, into, kPayload, calls);
  }
  if (bytes_moved)
    for (size_t k = 0; k < links.size(); ++k)
      // Sent is sent: a payload the peer could not open counts too.
      if (results[k].outcome == PeerOutcome::received || results[k].outcome == PeerOutcome::unopened)
        *bytes_moved += static_cast<int64_t>(nbytes);
  return settle_unopened();
}

}  // namespace gasloc::comm
