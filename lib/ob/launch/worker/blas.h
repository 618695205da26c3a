// The BLAS pools' sizes of the process that calls (design: launch, "Devices").
#pragma once


namespace ob::launch {

// Sizes this process's BLAS pools to `openblas` and `mkl` threads (<= 0:
// leaves that one), whichever of the two is loaded. Each reads its
// variable only when it loads and is deaf to torch::set_num_threads, so a
// process that was forked (launch/agent/standby_seed.h) or that picks its count
// later (ob-profile --threads) must call this.
void SetBlasThreads(int openblas, int mkl);

}  // namespace ob::launch
