#include "gasloc/train/signals.hpp"

#include <atomic>
#include <csignal>
#include <ctime>
#include <unistd.h>

#include "gasloc/core/interrupt.hpp"

namespace gasloc::train {

namespace {
std::atomic<bool> g_stop{false};
std::atomic<long long> g_first_ns{0};

// One request often arrives twice within microseconds: `timeout` sends SIGTERM to its child and
// then to its process group, and a terminal's Ctrl+C reaches a rank both directly and through
// `gasloc launch`. Only a signal this long after the first is a second request.
constexpr long long kSecondRequestNs = 1'000'000'000;

long long monotonic_ns() {  // clock_gettime is async-signal-safe
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<long long>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

extern "C" void on_signal(int) {
  request_interrupt();  // a rendezvous or store call blocked on others gives way too
  const long long now = monotonic_ns();
  long long first = 0;
  if (g_first_ns.compare_exchange_strong(first, now)) {  // the first request (on any thread)
    g_stop.store(true);
    return;
  }
  if (now - first >= kSecondRequestNs) {
    // A second Ctrl+C: say why the process ends without its checkpoint, then end it.
    static const char msg[] = "\ngasloc train: second interrupt: exiting now without a checkpoint\n";
    [[maybe_unused]] auto n = ::write(2, msg, sizeof msg - 1);
    std::signal(SIGINT, SIG_DFL);
    std::signal(SIGTERM, SIG_DFL);
    std::raise(SIGINT);
  }
}
}  // namespace

SignalScope::SignalScope() {
  g_stop.store(false);
  g_first_ns.store(0);
  clear_interrupt();
  prev_int_ = std::signal(SIGINT, on_signal);
  prev_term_ = std::signal(SIGTERM, on_signal);
}

SignalScope::~SignalScope() {
  std::signal(SIGINT, prev_int_);
  std::signal(SIGTERM, prev_term_);
}

bool stop_requested() { return g_stop.load(); }

}  // namespace gasloc::train
