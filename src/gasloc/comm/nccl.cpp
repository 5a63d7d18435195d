// The CUDA-only part of the NCCL backend: NOT COMPILED on CPU machines (CMakeLists.txt drops this
// file unless GASLOC_WITH_NCCL), so keep it to building the backend; everything else is in
// process_group.cpp, which every build compiles. Check it with scripts/gpu_check.sh.
//
// ProcessGroupNCCL is declared only under USE_C10D_NCCL, which LibTorch's CMake config does not
// export; CUDA builds of LibTorch always contain it.
#ifndef USE_C10D_NCCL
#define USE_C10D_NCCL
#endif
#include "gasloc/comm/nccl.hpp"

#include <c10/cuda/CUDAFunctions.h>
#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include <cstdlib>

#include "gasloc/core/error.hpp"

namespace gasloc::comm {

BuiltBackend nccl_backend(const GlooOptions& o, const c10::intrusive_ptr<c10d::Store>& store) {
  const int count = static_cast<int>(c10::cuda::device_count());
  if (count < 1)
    throw CommError(fmt::format("rank {}: the NCCL backend needs a CUDA device and none is visible", o.rank),
                    "use cluster.backend = \"gloo\" on CPU machines; check CUDA_VISIBLE_DEVICES and nvidia-smi");
  const auto index = static_cast<c10::DeviceIndex>((o.local_rank >= 0 ? o.local_rank : o.rank) % count);
  c10::cuda::set_device(index);
  // Without blocking wait, c10d's Work::wait only orders CUDA streams and returns at once; with
  // it, wait(timeout) blocks the CPU and throws on timeout, which the contract requires. The
  // user's own setting wins (overwrite = 0). TORCH_NCCL_BLOCKING_WAIT from 2.2 on; the older
  // name only before (2.11 warns that it is deprecated when it is set: seen on the H200).
  ::setenv("TORCH_NCCL_BLOCKING_WAIT", "1", 0);
#if TORCH_VERSION_MAJOR < 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 2)
  ::setenv("NCCL_BLOCKING_WAIT", "1", 0);
#endif
  auto opts = c10d::ProcessGroupNCCL::Options::create();
  opts->timeout = std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1000));
  BuiltBackend b;
  b.devices = {"NCCL", torch::Device(torch::kCUDA, index), /*stage_cpu=*/true};
  b.pairs_in_order = true;
  try {
    b.backend = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, o.rank, o.world, opts);
  } catch (const std::exception& e) {
    throw CommError(fmt::format("rank {} could not create the NCCL process group: {}", o.rank, first_line(e.what())));
  }
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  // 2.4+ warns when a group is destroyed without shutdown(); it also frees NCCL's resources.
  b.shutdown = [](C10dBackend& pg) { static_cast<c10d::ProcessGroupNCCL&>(pg).shutdown(); };
#endif
  return b;
}

}  // namespace gasloc::comm
