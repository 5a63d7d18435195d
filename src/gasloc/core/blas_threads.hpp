// How many threads the BLAS library (OpenBLAS on Debian) may use for one matrix product.
//
// Why it matters: the in-process cluster runs one thread per worker. OpenBLAS's pthread build
// serves every caller from one pool, so eight workers asking for two-thread products spin on it
// (sched_yield) and train about half as fast as with one BLAS thread each, while the workers
// themselves already keep the cores busy. The count can change the last bits of some products
// (OpenBLAS picks other kernels for other splits; tests/test_model.cpp shows it), so runs compared
// bit for bit, as in-process against Gloo, must use the same count: a run is deterministic for it.
#pragma once

namespace gasloc {

// Sets the BLAS thread count for the whole process while it lives and restores the previous
// count after. Looked up at run time, so any BLAS works: with one that has no such control
// (BLIS, reference BLAS) it changes nothing and active() is false.
class BlasThreads {
 public:
  explicit BlasThreads(int n);
  ~BlasThreads();
  BlasThreads(const BlasThreads&) = delete;
  BlasThreads& operator=(const BlasThreads&) = delete;
  bool active() const { return previous_ > 0; }

 private:
  int previous_ = 0;
};

}  // namespace gasloc
