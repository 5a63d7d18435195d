// ProcessGroupGloo is declared only under USE_C10D_GLOO, which LibTorch's CMake config does not
// export; Linux builds of libtorch_cpu always contain Gloo, so declare it here (after the
// precompiled header, which does not include c10d).
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO
#endif
#include "gasloc/comm/gloo.hpp"

#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "gasloc/core/error.hpp"

namespace gasloc::comm {

namespace {

std::shared_ptr<::gloo::transport::Device> make_device(const GlooOptions& o) {
  try {
    if (!o.interface.empty()) return c10d::ProcessGroupGloo::createDeviceForInterface(o.interface);
    // All ranks on this host: bind the data connections to loopback too (the machine's hostname
    // may resolve to an address that is not reachable, or to nothing).
    const std::string& a = o.master_addr;
    if (a == "localhost" || a.rfind("127.", 0) == 0) return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
    if (a == "::1") return c10d::ProcessGroupGloo::createDeviceForHostname("::1");
    return c10d::ProcessGroupGloo::createDefaultDevice();
  } catch (const std::exception& e) {
    throw CommError(fmt::format("rank {}: cannot open a Gloo network device{}: {}", o.rank,
                                o.interface.empty() ? "" : " on interface " + o.interface, first_line(e.what())),
                    "set GLOO_SOCKET_IFNAME to a network interface that reaches the other ranks (see `ip addr`)");
  }
}

}  // namespace

c10::intrusive_ptr<C10dBackend> gloo_group(const GlooOptions& o, const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                           int size, double timeout_s) {
  auto opts = c10d::ProcessGroupGloo::Options::create(std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
  opts->devices.push_back(make_device(o));
  opts->threads = 1;  // its work is sends and receives, which Gloo's device thread carries
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, opts);
}

BuiltBackend gloo_backend(const GlooOptions& o, const c10::intrusive_ptr<c10d::Store>& store) {
  auto opts = c10d::ProcessGroupGloo::Options::create(std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1000)));
  opts->devices.push_back(make_device(o));
  try {
    return {c10::make_intrusive<c10d::ProcessGroupGloo>(store, o.rank, o.world, opts), DevicePolicy{}, false, {}};
  } catch (const std::exception& e) {
    throw CommError(fmt::format("rank {} could not connect to the other ranks over Gloo: {}{}", o.rank,
                                first_line(e.what()), describe_dead_ranks(*store, o.rank, o.world)),
                    "a rank may have died during start-up, or a firewall blocks the ranks' ports (GLOO_SOCKET_IFNAME "
                    "selects the interface)");
  }
}

}  // namespace gasloc::comm
