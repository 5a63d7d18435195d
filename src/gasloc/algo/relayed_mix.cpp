// A blocking mix overlapped with inner steps, one exchange at a time; see relayed_mix.hpp.
#include "gasloc/algo/relayed_mix.hpp"

#include <torch/torch.h>

#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "gasloc/core/error.hpp"

namespace gasloc::algo {

struct RelayedMix::State {
  explicit State(comm::Communicator& c) : comm(c) {}
  comm::Communicator& comm;
  std::mutex mu;
  std::condition_variable cv;
  bool mix_turn = false;   // the mix's thread runs; the worker's sleeps (and the other way round)
  bool cancelled = false;  // the worker gave up the round: the mix's next exchange throws
  bool finished = false;   // the mix returned or threw
  // The exchange the mix asked for, and where it lands.
  bool asked = false;
  std::vector<int> peers;
  torch::Tensor send;  // held until the exchange is waited for (Communicator's overlap rule)
  std::vector<torch::Tensor>* out = nullptr;
  std::vector<torch::Tensor> recv;
  std::unique_ptr<comm::Pending> pending;
  torch::Tensor result;
  std::exception_ptr error;
  std::thread thread;
};

namespace {

using State = RelayedMix::State;

// What the mix sees: its exchanges go to the worker's thread; nothing else is relayed.
class Relay final : public comm::Communicator {
 public:
  explicit Relay(State& s) : s_(s) {}
  int rank() const override { return s_.comm.rank(); }
  int world() const override { return s_.comm.world(); }
  void exchange(const std::vector<int>& peers, const torch::Tensor& send, std::vector<torch::Tensor>& recv) override {
    std::unique_lock lk(s_.mu);
    s_.peers = peers;
    s_.send = send;
    s_.out = &recv;
    s_.asked = true;
    s_.mix_turn = false;
    s_.cv.notify_all();
    s_.cv.wait(lk, [&] { return s_.mix_turn || s_.cancelled; });
    if (s_.cancelled) throw CommError("overlapped compressed round: given up before it landed (the worker stopped)");
  }
  void all_reduce_mean(torch::Tensor&) override { refuse("all_reduce_mean"); }
  void broadcast(torch::Tensor&, int) override { refuse("broadcast"); }
  void barrier() override { refuse("barrier"); }
  double now() const override { return s_.comm.now(); }  // the worker's thread sleeps meanwhile
  void compute(int64_t) override { refuse("compute"); }
  comm::CommStats stats() const override { return s_.comm.stats(); }

 private:
  [[noreturn]] static void refuse(const char* op) {
    throw Error(std::string("RelayedMix: a relayed mix may only exchange, not ") + op, "internal: see relayed_mix.hpp");
  }
  State& s_;
};

// Worker's thread: lets the mix run until it asks for an exchange or ends, then starts that exchange.
void run_mix(State& s) {
  {
    std::unique_lock lk(s.mu);
    s.mix_turn = true;
    s.cv.notify_all();
    s.cv.wait(lk, [&] { return !s.mix_turn; });
  }
  if (!s.asked) return;
  s.asked = false;
  s.recv.clear();
  s.pending = s.comm.start_exchange(s.peers, s.send, s.recv);
}

// Worker's thread: waits for the exchange in flight and hands what arrived to the mix.
void land(State& s) {
  s.pending->wait();
  s.pending.reset();
  *s.out = std::move(s.recv);
  s.send = torch::Tensor();
}

}  // namespace

RelayedMix::RelayedMix(comm::Communicator& comm, Mix mix) : s_(std::make_unique<State>(comm)) {
  s_->thread = std::thread([st = s_.get(), mix = std::move(mix)] {
    {
      std::unique_lock lk(st->mu);
      st->cv.wait(lk, [&] { return st->mix_turn || st->cancelled; });
      if (st->cancelled) {
        st->finished = true;
        st->mix_turn = false;
        st->cv.notify_all();
        return;
      }
    }
    torch::NoGradGuard no_grad;  // thread-local: the worker's guard does not reach here
    Relay relay(*st);
    torch::Tensor result;
    std::exception_ptr error;
    try {
      result = mix(relay);
    } catch (...) {
      error = std::current_exception();
    }
    std::lock_guard lk(st->mu);
    st->result = std::move(result);
    st->error = error;
    st->finished = true;
    st->mix_turn = false;
    st->cv.notify_all();
  });
  run_mix(*s_);
}

RelayedMix::~RelayedMix() {
  if (!s_ || !s_->thread.joinable()) return;
  if (s_->pending) s_->pending->abort();
  {
    std::lock_guard lk(s_->mu);
    s_->cancelled = true;
    s_->cv.notify_all();
  }
  s_->thread.join();
}

void RelayedMix::progress() {
  while (s_->pending && s_->pending->completed()) {
    land(*s_);
    run_mix(*s_);
  }
}

torch::Tensor RelayedMix::finish() {
  while (s_->pending) {
    land(*s_);
    run_mix(*s_);
  }
  // No exchange in flight after run_mix: the mix has ended.
  s_->thread.join();
  if (s_->error) std::rethrow_exception(s_->error);
  return std::move(s_->result);
}

}  // namespace gasloc::algo
