// The CPUs this process may run on.
//
// Why not std::thread::hardware_concurrency(): that counts the CPUs online on the host, while a
// container (docker --cpuset-cpus), taskset or a batch scheduler's cgroup may give the process
// fewer. Plans made from the host's count oversubscribe the CPUs the process has (more compute
// slots than CPUs, so the gate cannot give each slot its own CPU; more BLAS or tokenizer threads
// than CPUs, which time-slice).
#pragma once

#include <vector>

namespace gasloc {

// The CPUs in the calling thread's affinity mask, in ascending order; the online CPUs when the
// mask cannot be read.
std::vector<int> usable_cpu_ids();

// How many they are: at least 1.
int usable_cpus();

}  // namespace gasloc
