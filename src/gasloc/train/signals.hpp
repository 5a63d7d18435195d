// Ctrl+C and SIGTERM during a run: the first asks every rank to stop at a step they agree on and
// checkpoint there (Coordination::should_stop); a second ends the process at once, saying so.
#pragma once

namespace gasloc::train {

// Installs the stop handler for the duration of a run and restores the previous one.
struct SignalScope {
  SignalScope();
  ~SignalScope();
  SignalScope(const SignalScope&) = delete;
  SignalScope& operator=(const SignalScope&) = delete;

 private:
  void (*prev_int_)(int);
  void (*prev_term_)(int);
};

// True once a stop was asked for in this run.
bool stop_requested();

}  // namespace gasloc::train
