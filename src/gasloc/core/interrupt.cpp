#include "gasloc/core/interrupt.hpp"

#include <atomic>

namespace gasloc {

namespace {
std::atomic<bool> g_interrupt{false};
static_assert(std::atomic<bool>::is_always_lock_free, "set from a signal handler");
}  // namespace

void request_interrupt() noexcept { g_interrupt.store(true); }
bool interrupt_requested() noexcept { return g_interrupt.load(); }
void clear_interrupt() noexcept { g_interrupt.store(false); }

}  // namespace gasloc
