// Stands in for gloo.cpp where Gloo's own headers, which c10d's ProcessGroupGloo.hpp includes,
// are missing (a LibTorch that ships none on a machine without libgloo-dev; CMakeLists.txt picks
// one of the two files). The Gloo backend is then not in this build: asking for it is a
// ConfigError, and everything else (in-process clusters, NCCL) works.
#include "gasloc/comm/gloo.hpp"
#include "gasloc/core/error.hpp"

namespace gasloc::comm {

namespace {
[[noreturn]] void no_gloo() {
  throw ConfigError("the gloo backend is not in this build of gasloc: Gloo's headers were missing when it was built",
                    "build against a LibTorch that ships them, or install libgloo-dev (scripts/setup.sh)");
}
}  // namespace

BuiltBackend gloo_backend(const GlooOptions&, const c10::intrusive_ptr<c10d::Store>&) { no_gloo(); }

c10::intrusive_ptr<C10dBackend> gloo_group(const GlooOptions&, const c10::intrusive_ptr<c10d::Store>&, int, int, double) {
  no_gloo();
}

}  // namespace gasloc::comm
