// The layer norm's gain and bias gradient kernels (norm_grad.h).
//
// Partial sums: a block of 32 x 8 threads owns 256 columns (8 a thread, one
// 16-byte load of each operand a row) and a slice of rows; its 8 rows of
// threads walk the slice 8 rows apart and add their sums in shared memory
// in a fixed order. Final sums: a thread a column adds the slices in order
// into the gradients.
#include "ob/model/norm_grad.h"

#include <cuda_runtime.h>

#include <cstdint>

namespace ob::model::cuda {
namespace {

constexpr int kColsPerThread = 8;  // one 16-byte load of bf16
constexpr int kThreadsX = 32;
constexpr int kThreadsY = 8;
constexpr int kBlockCols = kThreadsX * kColsPerThread;  // 256
constexpr int64_t kMaxSlices = 64;
constexpr int64_t kMinRowsPerSlice = 64;
constexpr int64_t kMaxGrid = 65535;  // a grid's y dimension

// The slices rows are cut into: enough blocks to fill a GPU, and a function
// of the shape alone, so the sums' order is too.
int64_t Slices(int64_t rows) {
  int64_t s = (rows + kMinRowsPerSlice - 1) / kMinRowsPerSlice;
  if (s > kMaxSlices) s = kMaxSlices;
  return s < 1 ? 1 : s;
}

__device__ __forceinline__ float Bf16ToFloat(uint32_t bits16) { return __uint_as_float(bits16 << 16); }

__global__ void PartialSums(const uint4* __restrict__ dy, const uint4* __restrict__ x,
                            const float* __restrict__ mean, const float* __restrict__ rstd, int64_t rows,
                            int64_t cols, int64_t rows_per_slice, float* __restrict__ scratch) {
  __shared__ float sg[kThreadsY][kBlockCols];
  __shared__ float sb[kThreadsY][kBlockCols];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t slice = blockIdx.y;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kBlockCols + tx * kColsPerThread;
  const int64_t first = slice * rows_per_slice;
  int64_t last = first + rows_per_slice;
  if (last > rows) last = rows;
  float g[kColsPerThread], b[kColsPerThread];
#pragma unroll
  for (int k = 0; k < kColsPerThread; ++k) g[k] = b[k] = 0.f;
  if (c0 < cols) {
    const int64_t packs_per_row = cols / kColsPerThread;
    const int64_t p0 = c0 / kColsPerThread;
    for (int64_t r = first + ty; r < last; r += kThreadsY) {
      const uint4 dv = dy[r * packs_per_row + p0];
      const uint4 xv = x[r * packs_per_row + p0];
      const float m = mean[r], s = rstd[r];
      const uint32_t dw[4] = {dv.x, dv.y, dv.z, dv.w};
      const uint32_t xw[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float d0 = Bf16ToFloat(dw[k] & 0xffffu), d1 = Bf16ToFloat(dw[k] >> 16);
        const float x0 = Bf16ToFloat(xw[k] & 0xffffu), x1 = Bf16ToFloat(xw[k] >> 16);
        g[2 * k] += d0 * ((x0 - m) * s);
        g[2 * k + 1] += d1 * ((x1 - m) * s);
        b[2 * k] += d0;
        b[2 * k + 1] += d1;
      }
    }
  }
#pragma unroll
  for (int k = 0; k < kColsPerThread; ++k) {
    sg[ty][tx * kColsPerThread + k] = g[k];
    sb[ty][tx * kColsPerThread + k] = b[k];
  }
  __syncthreads();
  // 256 threads, a column each: its 8 rows of partial sums in order.
  const int t = ty * kThreadsX + tx;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kBlockCols + t;
  if (c < cols) {
    float sum_g = 0.f, sum_b = 0.f;
#pragma unroll
    for (int y = 0; y < kThreadsY; ++y) {
      sum_g += sg[y][t];
      sum_b += sb[y][t];
    }
    scratch[slice * cols + c] = sum_g;
    scratch[(gridDim.y + slice) * cols + c] = sum_b;
  }
}

__global__ void FinalSums(const float* __restrict__ scratch, int64_t slices, int64_t cols, float* __restrict__ dgamma,
                          float* __restrict__ dbeta) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float sum_g = 0.f, sum_b = 0.f;
  for (int64_t s = 0; s < slices; ++s) {
    sum_g += scratch[s * cols + c];
    sum_b += scratch[(slices + s) * cols + c];
  }
  dgamma[c] += sum_g;
  dbeta[c] += sum_b;
}

const char* LastError() {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

}  // namespace

int64_t LayerNormScratchFloats(int64_t rows, int64_t cols) { return 2 * Slices(rows) * cols; }

const char* LayerNormParamGradients(const void* dy, const void* x, const float* mean, const float* rstd,
                                    int64_t rows, int64_t cols, float* scratch, float* dgamma, float* dbeta,
                                    CUstream_st* stream) {
  if (rows <= 0 || cols <= 0) return nullptr;
  if (cols % kColsPerThread != 0) return "LayerNormParamGradients: columns not a multiple of 8";
  if ((reinterpret_cast<uintptr_t>(dy) | reinterpret_cast<uintptr_t>(x)) % 16 != 0) {
    return "LayerNormParamGradients: operands not 16-byte aligned";
  }
  const int64_t slices = Slices(rows);
  const int64_t rows_per_slice = (rows + slices - 1) / slices;
  const int64_t col_blocks = (cols + kBlockCols - 1) / kBlockCols;
  if (col_blocks > 0x7fffffff || slices > kMaxGrid) return "LayerNormParamGradients: shape too large";
  auto* s = reinterpret_cast<cudaStream_t>(stream);
  PartialSums<<<dim3(static_cast<unsigned>(col_blocks), static_cast<unsigned>(slices)), dim3(kThreadsX, kThreadsY),
                0, s>>>(static_cast<const uint4*>(dy), static_cast<const uint4*>(x), mean, rstd, rows, cols,
                        rows_per_slice, scratch);
  if (const char* e = LastError()) return e;
  FinalSums<<<static_cast<unsigned>((cols + 255) / 256), 256, 0, s>>>(scratch, slices, cols, dgamma, dbeta);
  return LastError();
}

}  // namespace ob::model::cuda
