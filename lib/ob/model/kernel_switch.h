// Kernels of ob's own that an environment variable switches off, ATen's
// kernels running instead: a check of the other path, and bench/gpu.sh's
// fallback when one of them fails its test on a GPU (the runs then still
// train the model, and what they measure is ATen's path, said so).
//
//   OB_LT_GELU=0          the MLP's cuBLASLt GELU epilogues (linear.h)
//   OB_LN_KERNEL=0        the layer norms' gradient kernels (linear.h)
//   OB_GEMM_ACCUMULATE=0  weight and bias gradients summed into the fp32
//                         gradients by cuBLAS (beta = 1; linear.h)
//   OB_FUSED_LOSS=0       the head's fused cross-entropy (cross_entropy.h)
//
// Each caller reads its variable once, at its first use in the process.
#pragma once

namespace ob::model {

// False when the environment variable `name` is "0"; true when it is unset
// or holds anything else.
bool KernelSwitchedOn(const char* name);

// Whether this build has ob's CUDA kernels (OB_WITH_CUDA_KERNELS: a CUDA
// LibTorch and a toolkit with nvcc).
#ifdef OB_WITH_CUDA_KERNELS
inline constexpr bool kCudaKernels = true;
#else
inline constexpr bool kCudaKernels = false;
#endif

}  // namespace ob::model
