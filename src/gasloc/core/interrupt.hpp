// A process-wide "the user asked to stop" flag (Ctrl+C, SIGTERM). A signal handler sets it; code
// that blocks for a long time on something outside this process (the rendezvous store, a rank
// that never arrives) polls it, so that a stop request never waits for a timeout.
#pragma once

namespace gasloc {

// Async-signal-safe: a lock-free atomic store.
void request_interrupt() noexcept;
bool interrupt_requested() noexcept;
// Forgets an earlier request (a new run in the same process, tests).
void clear_interrupt() noexcept;

}  // namespace gasloc
