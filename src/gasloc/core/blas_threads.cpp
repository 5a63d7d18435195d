#include "gasloc/core/blas_threads.hpp"

#include <dlfcn.h>

namespace gasloc {
namespace {

// OpenBLAS exports these; they are looked up in the libraries already loaded (LibTorch's BLAS),
// not linked, so gasloc builds and runs on any BLAS.
using SetThreads = void (*)(int);
using GetThreads = int (*)();

SetThreads set_fn() { return reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads")); }
GetThreads get_fn() { return reinterpret_cast<GetThreads>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads")); }

}  // namespace

BlasThreads::BlasThreads(int n) {
  const SetThreads set = set_fn();
  const GetThreads get = get_fn();
  if (set == nullptr || get == nullptr || n <= 0) return;
  previous_ = get();
  set(n);
}

BlasThreads::~BlasThreads() {
  if (previous_ > 0) set_fn()(previous_);
}

}  // namespace gasloc
