#include "gasloc/train/signals.hpp"

#include <atomic>
#include <csignal>
#include <unistd.h>

#include "gasloc/core/interrupt.hpp"

namespace gasloc::train {

namespace {
std::atomic<bool> g_stop{false};

extern "C" void on_signal(int) {
  request_interrupt();  // a rendezvous or store call blocked on others gives way too
  if (g_stop.exchange(true)) {
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
