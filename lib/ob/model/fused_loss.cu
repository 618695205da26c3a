// The head's softmax cross-entropy kernels (fused_loss.h). One block a row:
// GPT rows are tens of thousands of words wide, so a block of 512 threads
// streams a row with 16-byte loads and reduces it in shared memory.
#include "ob/model/fused_loss.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math_constants.h>

#include <cstdint>

namespace ob::model::cuda {
namespace {

constexpr int kThreads = 512;  // a block a row
constexpr int kWarps = kThreads / 32;
constexpr int64_t kMaxRows = 0x7fffffff;  // a grid's x dimension

__device__ __forceinline__ float ToFloat(float x) { return x; }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T>
__device__ __forceinline__ T FromFloat(float x);
template <>
__device__ __forceinline__ float FromFloat<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// 16 bytes of logits.
template <typename T>
struct alignas(16) Pack {
  static constexpr int kSize = 16 / sizeof(T);
  T e[kSize];
};

// A running maximum and the sum of exp(x − max) over what it has seen.
struct MaxSum {
  float m, s;
};

__device__ __forceinline__ void Add(MaxSum& a, float x) {
  if (x == -CUDART_INF_F) return;  // exp(−inf) adds nothing; −inf − −inf would be NaN
  if (x > a.m) {
    a.s = a.s * expf(a.m - x) + 1.f;
    a.m = x;
  } else {
    a.s += expf(x - a.m);  // NaN x falls here and makes the sum NaN, as it should
  }
}

__device__ __forceinline__ MaxSum Combine(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -CUDART_INF_F) return {m, 0.f};
  return {m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}

__device__ __forceinline__ MaxSum WarpReduce(MaxSum v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const MaxSum w{__shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.s, o)};
    v = Combine(v, w);
  }
  return v;
}

// The block's total; valid in thread 0.
__device__ MaxSum BlockReduce(MaxSum v) {
  __shared__ MaxSum part[kWarps];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = WarpReduce(v);
  if (lane == 0) part[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < kWarps ? part[lane] : MaxSum{-CUDART_INF_F, 0.f};
    v = WarpReduce(v);
  }
  return v;
}

template <typename T, bool kVector>
__global__ void __launch_bounds__(kThreads)
    ForwardKernel(const T* __restrict__ logits, int64_t ld, int64_t vocab, const int64_t* __restrict__ targets,
                  float* __restrict__ lse, float* __restrict__ loss) {
  const int64_t row = blockIdx.x;
  const T* x = logits + row * ld;
  MaxSum acc{-CUDART_INF_F, 0.f};
  int64_t done = 0;
  if constexpr (kVector) {
    using P = Pack<T>;
    const int64_t packs = vocab / P::kSize;
    const P* xp = reinterpret_cast<const P*>(x);
    for (int64_t i = threadIdx.x; i < packs; i += kThreads) {
      const P p = xp[i];
#pragma unroll
      for (int k = 0; k < P::kSize; ++k) Add(acc, ToFloat(p.e[k]));
    }
    done = packs * P::kSize;
  }
  for (int64_t j = done + threadIdx.x; j < vocab; j += kThreads) Add(acc, ToFloat(x[j]));
  acc = BlockReduce(acc);
  if (threadIdx.x == 0) {
    const float l = acc.m + logf(acc.s);
    const int64_t t = targets[row];
    lse[row] = l;
    loss[row] = t >= 0 && t < vocab ? l - ToFloat(x[t]) : CUDART_NAN_F;
  }
}

__device__ __forceinline__ float GradOf(float x, float lse, float scale, int64_t j, int64_t vocab, int64_t target) {
  if (j >= vocab) return 0.f;
  return scale * (expf(x - lse) - (j == target ? 1.f : 0.f));
}

template <typename T, bool kVector>
__global__ void __launch_bounds__(kThreads)
    BackwardKernel(const T* __restrict__ logits, int64_t ld, int64_t vocab, const int64_t* __restrict__ targets,
                   const float* __restrict__ lse, const float* __restrict__ grad_loss, float scale,
                   T* __restrict__ grad) {
  const int64_t row = blockIdx.x;
  const T* x = logits + row * ld;
  T* g = grad + row * ld;
  const float l = lse[row];
  const float s = *grad_loss * scale;
  const int64_t t = targets[row];
  int64_t done = 0;
  if constexpr (kVector) {
    using P = Pack<T>;
    const int64_t packs = ld / P::kSize;
    const P* xp = reinterpret_cast<const P*>(x);
    P* gp = reinterpret_cast<P*>(g);
    for (int64_t i = threadIdx.x; i < packs; i += kThreads) {
      const P p = xp[i];
      P out;
#pragma unroll
      for (int k = 0; k < P::kSize; ++k) {
        out.e[k] = FromFloat<T>(GradOf(ToFloat(p.e[k]), l, s, i * P::kSize + k, vocab, t));
      }
      gp[i] = out;
    }
    done = packs * P::kSize;
  }
  for (int64_t j = done + threadIdx.x; j < ld; j += kThreads) {
    g[j] = FromFloat<T>(GradOf(ToFloat(x[j]), l, s, j, vocab, t));
  }
}

// 16-byte loads when every row starts on a 16-byte boundary.
bool Vectorizable(const void* p, int64_t ld, int elem) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0 && (ld * elem) % 16 == 0;
}

const char* LaunchError() {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

template <typename T>
void Forward(const void* logits, int64_t rows, int64_t ld, int64_t vocab, const int64_t* targets, float* lse,
             float* loss, cudaStream_t stream) {
  const T* x = static_cast<const T*>(logits);
  if (Vectorizable(logits, ld, sizeof(T))) {
    ForwardKernel<T, true><<<rows, kThreads, 0, stream>>>(x, ld, vocab, targets, lse, loss);
  } else {
    ForwardKernel<T, false><<<rows, kThreads, 0, stream>>>(x, ld, vocab, targets, lse, loss);
  }
}

template <typename T>
void Backward(const void* logits, int64_t rows, int64_t ld, int64_t vocab, const int64_t* targets,
              const float* lse, const float* grad_loss, float scale, void* grad, cudaStream_t stream) {
  const T* x = static_cast<const T*>(logits);
  T* g = static_cast<T*>(grad);
  if (Vectorizable(logits, ld, sizeof(T)) && Vectorizable(grad, ld, sizeof(T))) {
    BackwardKernel<T, true><<<rows, kThreads, 0, stream>>>(x, ld, vocab, targets, lse, grad_loss, scale, g);
  } else {
    BackwardKernel<T, false><<<rows, kThreads, 0, stream>>>(x, ld, vocab, targets, lse, grad_loss, scale, g);
  }
}

}  // namespace

const char* CrossEntropyForward(LogitsType type, const void* logits, int64_t rows, int64_t ld, int64_t vocab,
                                const int64_t* targets, float* lse, float* loss, CUstream_st* stream) {
  if (rows == 0) return nullptr;
  if (rows > kMaxRows) return "cross-entropy: more rows than a grid holds";
  if (type == LogitsType::kBFloat16) {
    Forward<__nv_bfloat16>(logits, rows, ld, vocab, targets, lse, loss, stream);
  } else {
    Forward<float>(logits, rows, ld, vocab, targets, lse, loss, stream);
  }
  return LaunchError();
}

const char* CrossEntropyBackward(LogitsType type, const void* logits, int64_t rows, int64_t ld, int64_t vocab,
                                 const int64_t* targets, const float* lse, const float* grad_loss, float scale,
                                 void* grad, CUstream_st* stream) {
  if (rows == 0) return nullptr;
  if (rows > kMaxRows) return "cross-entropy: more rows than a grid holds";
  if (type == LogitsType::kBFloat16) {
    Backward<__nv_bfloat16>(logits, rows, ld, vocab, targets, lse, grad_loss, scale, grad, stream);
  } else {
    Backward<float>(logits, rows, ld, vocab, targets, lse, grad_loss, scale, grad, stream);
  }
  return LaunchError();
}

}  // namespace ob::model::cuda
