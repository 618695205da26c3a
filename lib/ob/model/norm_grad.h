// The layer norm's gain and bias gradients as two CUDA kernels (built with
// nvcc where the CUDA toolkit is found; see lib/CMakeLists.txt), summed in
// fp32 into fp32 gradients.
//
// Shapes: dy and x [rows, cols] bf16 row-major (the norm's output gradient
// and its input), mean and rstd [rows] fp32 (what the forward kept),
// dgamma and dbeta [cols] fp32.
//
// Why: ATen's kernel for them (GammaBetaBackward) took 43 µs a norm of 8,192
// × 1,024 on an H100, 8.4 ms of a 236 ms gpt2-medium step, for 32 MB read
// (about 11 µs at the memory's speed), and gave bf16 gradients that autograd
// then added into the fp32 ones with two more kernels. Here every block
// sums a fixed slice of rows for 256 columns with 16-byte loads, and a
// second kernel adds the slices in a fixed order into the gradients: the
// same sums whatever the run (no atomics), in fp32 throughout.
//
// Plain C++ interface (no LibTorch here), so that nvcc compiles only this.
// Thread-safety: the functions only queue work on `stream`.
// Failure: a launch error comes back as its message; nullptr is success.
#pragma once

#include <cstdint>

struct CUstream_st;

namespace ob::model::cuda {

// The floats of scratch LayerNormParamGradients needs for rows x cols.
int64_t LayerNormScratchFloats(int64_t rows, int64_t cols);

// dgamma[c] += Σ_r dy[r,c]·(x[r,c] − mean[r])·rstd[r]; dbeta[c] += Σ_r
// dy[r,c]. REQUIRES: cols % 8 == 0; dy and x 16-byte aligned; scratch of
// LayerNormScratchFloats(rows, cols) floats on the device.
const char* LayerNormParamGradients(const void* dy, const void* x, const float* mean, const float* rstd,
                                    int64_t rows, int64_t cols, float* scratch, float* dgamma, float* dbeta,
                                    CUstream_st* stream);

}  // namespace ob::model::cuda
