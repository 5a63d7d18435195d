// The CPUs this process may run on; see cpus.hpp.
#include "gasloc/core/cpus.hpp"

#include <sched.h>

#include <algorithm>
#include <thread>

namespace gasloc {

std::vector<int> usable_cpu_ids() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
  if (cpus.empty())
    for (int c = 0; c < static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); ++c) cpus.push_back(c);
  return cpus;
}

int usable_cpus() { return static_cast<int>(usable_cpu_ids().size()); }

}  // namespace gasloc
