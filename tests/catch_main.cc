#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

#include "ob/launch/worker/blas.h"

namespace {
// One OpenBLAS thread, as the workers run where they share a host's cores
// (the agent's OPENBLAS_NUM_THREADS): a pool of every core spins in
// sched_yield between calls, which under ctest -j2 took the other test's
// core (gpt-tiny's 300 steps: 30 s of CPU against 19 with one thread), and
// in the runtime tests, whose ranks are threads that each call BLAS, 12% of
// a tensor-parallel recovery test's time. A test binary without OpenBLAS
// has no pool to size (SetBlasThreads finds no such function).
[[maybe_unused]] const bool kOneBlasThread = (ob::launch::SetBlasThreads(1, 0), true);
}  // namespace
