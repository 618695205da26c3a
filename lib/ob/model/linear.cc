// The dense layers' product and its fused weight-gradient accumulation (see linear.h).
#include "ob/model/linear.h"

#include "ob/model/compute_copies.h"
#include "ob/model/kernel_switch.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "ob/torch_compat.h"

#ifdef OB_WITH_CUDA_KERNELS
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cublasLt.h>
#include <cublas_v2.h>

#include "ob/model/norm_grad.h"

#include <array>
#include <map>
#include <optional>
#endif

namespace ob::model {
namespace {

std::atomic<int64_t> lt_forwards{0}, lt_backwards{0}, norm_kernels{0};

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

#ifdef OB_WITH_CUDA_KERNELS
// g [out, in] fp32 += dyᵀ·x for dy [N, out], x [N, in] (bf16 or fp32), in
// one GEMM. In cuBLAS's column-major terms g is [in, out] = x[in, N] ·
// dy[N, out] (x as stored, dy transposed).
void CublasAccumulate(torch::Tensor& g, const torch::Tensor& dy, const torch::Tensor& x) {
  const int64_t rows = x.size(0), in = x.size(1), out = dy.size(1);
  constexpr int64_t kMax = std::numeric_limits<int>::max();
  TORCH_CHECK(rows <= kMax && in <= kMax && out <= kMax, "linear: a product larger than cuBLAS's int sizes");
  const auto type = x.scalar_type() == torch::kBFloat16 ? CUDA_R_16BF : CUDA_R_32F;
  const float one = 1.f;
  c10::cuda::CUDAGuard device(g.device());
  cublasHandle_t handle = at::cuda::getCurrentCUDABlasHandle();  // bound to the current stream
  const cublasStatus_t status =
      cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_T, static_cast<int>(in), static_cast<int>(out),
                   static_cast<int>(rows), &one, x.data_ptr(), type, static_cast<int>(in), dy.data_ptr(), type,
                   static_cast<int>(out), &one, g.data_ptr(), CUDA_R_32F, static_cast<int>(in),
                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  TORCH_CHECK(status == CUBLAS_STATUS_SUCCESS, "linear: cublasGemmEx of the weight gradient failed (status ",
              static_cast<int>(status), ")");
}

// A vector of `n` ones in `dtype` on the current device, this thread's,
// grown as needed (a fill a call would be a launch a call).
const torch::Tensor& Ones(int64_t n, const torch::TensorOptions& opt) {
  thread_local torch::Tensor ones[2];
  torch::Tensor& t = ones[opt.dtype() == torch::kBFloat16 ? 1 : 0];
  if (!t.defined() || t.numel() < n || t.device() != opt.device()) t = torch::ones({n}, opt);
  return t;
}

// g [out] fp32 += Σ_rows dy for dy [N, out] (bf16 or fp32): the weight
// gradient's GEMM with a column of ones for x (g as [out, 1]), which reads dy
// once at memory speed and adds into g (beta = 1); a column reduction and an
// add were two kernels a bias a micro-batch, the reduction well below memory
// speed.
void CublasAccumulateBias(torch::Tensor& g, const torch::Tensor& dy) {
  const int64_t rows = dy.size(0);
  torch::Tensor column = g.view({-1, 1});
  CublasAccumulate(column, dy, Ones(rows, dy.options()).narrow(0, 0, rows).view({rows, 1}));
}

// cuBLASLt products with a GELU epilogue (the MLP's, GeluMlp below). Each
// returns false, having launched nothing, where cuBLASLt has no algorithm
// for the case (or OB_LT_GELU=0): the caller then runs ATen's kernels.
// cuBLASLt's GELU is the tanh approximation, GPT-2's.
class LtGelu {
 public:
  // pre = x·wᵀ + b and h = gelu(pre), both [N, out] bf16, for x [N, in],
  // w [out, in], b [out] (bf16): one GEMM whose epilogue adds the bias,
  // keeps the sum (the aux output) and applies GELU.
  static bool Forward(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b, torch::Tensor& pre,
                      torch::Tensor& h) {
    const int64_t rows = x.size(0), in = x.size(1), out = w.size(0);
    if (!Usable({x, w, b}) || !Fits({rows, in, out}) || out % 8 != 0) return false;
    pre = torch::empty({rows, out}, x.options());
    h = torch::empty({rows, out}, x.options());
    // Column-major: h [out, N] = (w stored [in, out])ᵀ · (x stored [in, N]).
    Call c;
    if (!c.Describe(CUBLAS_OP_T, CUBLAS_OP_N, out, rows, in, in, in, out)) return false;
    if (!c.Epilogue(CUBLASLT_EPILOGUE_GELU_AUX_BIAS, b.data_ptr(), -1, pre.data_ptr(), out)) return false;
    return c.Run(x.device(), w.data_ptr(), x.data_ptr(), h.data_ptr());
  }

  // dpre = (dy·w) ∘ gelu'(pre) [N, mid] bf16, and db = Σ_rows dpre [mid]
  // (fp32 where cuBLASLt writes fp32 bias gradients for bf16 products, else
  // bf16), for dy [N, out], w [out, mid], pre [N, mid]: the second product's
  // input gradient, GELU's backward and the first product's bias gradient
  // in one GEMM.
  static bool Backward(const torch::Tensor& dy, const torch::Tensor& w, const torch::Tensor& pre,
                       torch::Tensor& dpre, torch::Tensor& db) {
    const int64_t rows = dy.size(0), out = dy.size(1), mid = w.size(1);
    if (!Usable({dy, w, pre}) || !Fits({rows, out, mid}) || mid % 8 != 0) return false;
    dpre = torch::empty({rows, mid}, dy.options());
    // Column-major: dpre [mid, N] = (w stored [mid, out]) · (dy stored [out, N]).
    for (const auto bias_type : {CUDA_R_32F, CUDA_R_16BF}) {
      db = torch::empty({mid}, dy.options().dtype(bias_type == CUDA_R_32F ? torch::kFloat : torch::kBFloat16));
      Call c;
      if (!c.Describe(CUBLAS_OP_N, CUBLAS_OP_N, mid, rows, out, mid, out, mid)) return false;
      if (!c.Epilogue(CUBLASLT_EPILOGUE_DGELU_BGRAD, db.data_ptr(), bias_type, pre.data_ptr(), mid)) continue;
      if (c.Run(dy.device(), w.data_ptr(), dy.data_ptr(), dpre.data_ptr())) return true;
    }
    return false;
  }

 private:
  static bool Enabled() {
    static const bool on = KernelSwitchedOn("OB_LT_GELU");
    return on;
  }
  // bf16, contiguous, on one GPU, and aligned as cuBLASLt's heuristic
  // assumes by default (256 bytes; the caching allocator's blocks are).
  static bool Usable(std::initializer_list<torch::Tensor> ts) {
    if (!Enabled()) return false;
    for (const auto& t : ts) {
      if (!t.is_cuda() || t.scalar_type() != torch::kBFloat16 || !t.is_contiguous() ||
          reinterpret_cast<uintptr_t>(t.data_ptr()) % 256 != 0 || t.device() != ts.begin()->device()) {
        return false;
      }
    }
    return true;
  }
  static bool Fits(std::initializer_list<int64_t> sizes) {
    for (int64_t n : sizes) {
      if (n <= 0 || n > std::numeric_limits<int32_t>::max()) return false;
    }
    return true;
  }

  // This thread's handle and workspace.
  struct Context {
    cublasLtHandle_t handle = nullptr;
    torch::Tensor workspace;
    int device = -1;
  };
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;
  static Context* Get(const torch::Device& device) {
    thread_local Context ctx;
    if (ctx.handle == nullptr && cublasLtCreate(&ctx.handle) != CUBLAS_STATUS_SUCCESS) return nullptr;
    if (ctx.device != device.index()) {
      ctx.workspace = torch::empty({static_cast<int64_t>(kWorkspaceBytes)},
                                   torch::TensorOptions().dtype(torch::kByte).device(device));
      ctx.device = device.index();
    }
    return &ctx;
  }

  // One cublasLtMatmul: D [m, n] = op(A)·op(B), bf16 in and out, fp32
  // accumulation, column-major as cuBLAS counts. Descriptors freed on exit.
  struct Call {
    static constexpr size_t kKeySize = 12;
    using Key = std::array<int64_t, kKeySize>;
    Key key{};
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    ~Call() {
      if (d != nullptr) cublasLtMatrixLayoutDestroy(d);
      if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
      if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
      if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
    }
    bool Describe(cublasOperation_t op_a, cublasOperation_t op_b, int64_t m, int64_t n, int64_t k, int64_t lda,
                  int64_t ldb, int64_t ldd) {
      key = {op_a, op_b, m, n, k, lda, ldb, ldd, -1, -1, -1, -1};
      if (cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS) return false;
      if (cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a) !=
              CUBLAS_STATUS_SUCCESS ||
          cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b) !=
              CUBLAS_STATUS_SUCCESS) {
        return false;
      }
      // Stored shapes: op(A) is m×k, op(B) k×n.
      const bool ta = op_a == CUBLAS_OP_T, tb = op_b == CUBLAS_OP_T;
      return cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, ta ? k : m, ta ? m : k, lda) == CUBLAS_STATUS_SUCCESS &&
             cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, tb ? n : k, tb ? k : n, ldb) == CUBLAS_STATUS_SUCCESS &&
             cublasLtMatrixLayoutCreate(&d, CUDA_R_16BF, m, n, ldd) == CUBLAS_STATUS_SUCCESS;
    }
    // bias_type < 0: cuBLASLt's default (the output's type).
    bool Epilogue(cublasLtEpilogue_t epilogue, void* bias, int bias_type, void* aux, int64_t aux_ld) {
      key[8] = epilogue;
      key[9] = bias_type;
      key[10] = aux_ld;
      if (cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue) !=
              CUBLAS_STATUS_SUCCESS ||
          cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias) !=
              CUBLAS_STATUS_SUCCESS ||
          cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux) !=
              CUBLAS_STATUS_SUCCESS) {
        return false;
      }
      const int64_t ld = aux_ld;
      if (cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld) !=
          CUBLAS_STATUS_SUCCESS) {
        return false;
      }
      if (bias_type >= 0) {
        const auto t = static_cast<cudaDataType_t>(bias_type);
        if (cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &t, sizeof t) !=
            CUBLAS_STATUS_SUCCESS) {
          return false;
        }
      }
      return true;
    }
    // False when cuBLASLt offers no algorithm (nothing launched); throws
    // when the one it offered fails. The heuristic is asked once per thread
    // for each key (shapes, operations, epilogue, bias type, device): a
    // query costs tens of microseconds of host time, and a gpt2-medium step
    // makes ~200 of these products.
    bool Run(const torch::Device& device, const void* a_ptr, const void* b_ptr, void* d_ptr) {
      c10::cuda::CUDAGuard guard(device);
      Context* ctx = Get(device);
      if (ctx == nullptr) return false;
      key[kKeySize - 1] = device.index();
      thread_local std::map<Key, std::optional<cublasLtMatmulAlgo_t>> known;
      auto it = known.find(key);
      if (it == known.end()) {
        std::optional<cublasLtMatmulAlgo_t> algo;
        cublasLtMatmulPreference_t pref = nullptr;
        if (cublasLtMatmulPreferenceCreate(&pref) != CUBLAS_STATUS_SUCCESS) return false;
        const uint64_t ws = kWorkspaceBytes;
        cublasLtMatmulHeuristicResult_t result;
        std::memset(&result, 0, sizeof result);
        int found = 0;
        if (cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws) ==
                CUBLAS_STATUS_SUCCESS &&
            cublasLtMatmulAlgoGetHeuristic(ctx->handle, desc, a, b, d, d, pref, 1, &result, &found) ==
                CUBLAS_STATUS_SUCCESS &&
            found > 0) {
          algo = result.algo;
        }
        cublasLtMatmulPreferenceDestroy(pref);
        it = known.emplace(key, algo).first;
      }
      if (!it->second) return false;
      const float alpha = 1.f, beta = 0.f;
      const cublasStatus_t st =
          cublasLtMatmul(ctx->handle, desc, &alpha, a_ptr, a, b_ptr, b, &beta, d_ptr, d, d_ptr, d, &*it->second,
                         ctx->workspace.data_ptr(), kWorkspaceBytes, at::cuda::getCurrentCUDAStream());
      TORCH_CHECK(st == CUBLAS_STATUS_SUCCESS, "linear: cublasLtMatmul with a GELU epilogue failed (status ",
                  static_cast<int>(st), ")");
      return true;
    }
  };
};
#endif

// The products of bf16 operands on the CPU, as the GPU's GEMM computes
// them: widened to fp32 (a product of two bf16 values is exact in fp32),
// summed in fp32 with the bias, the result rounded to bf16 once. LibTorch's
// CPU kernel for bf16 products, on a CPU without AVX-512 BF16, took 3.5
// times as long as an fp32 step's (gpt-tiny on 2x2 workers, 0.39 s a step
// against 0.10). Anything else goes to LibTorch as given.
bool WidenOnCpu(const torch::Tensor& a) { return !a.is_cuda() && a.scalar_type() == torch::kBFloat16; }

torch::Tensor Widened(const torch::Tensor& t) { return t.defined() ? t.to(torch::kFloat) : t; }

// x·wᵀ + b (b may be undefined).
torch::Tensor CpuWideAffine(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b) {
  if (!WidenOnCpu(x)) return b.defined() ? torch::linear(x, w, b) : torch::linear(x, w);
  auto y = b.defined() ? torch::linear(Widened(x), Widened(w), Widened(b)) : torch::linear(Widened(x), Widened(w));
  return y.to(x.scalar_type());
}

// a·b, as torch::matmul.
torch::Tensor CpuWideProduct(const torch::Tensor& a, const torch::Tensor& b) {
  if (!WidenOnCpu(a)) return torch::matmul(a, b);
  return torch::matmul(Widened(a), Widened(b)).to(a.scalar_type());
}

// p.grad() += update, or p.grad() = update where it is not defined yet, as
// autograd's accumulation does.
void AddToGradient(const torch::Tensor& p, const torch::Tensor& update) {
  auto& g = const_cast<torch::Tensor&>(p).mutable_grad();
  if (g.defined()) {
    g.add_(update);
  } else {
    g = update.to(p.scalar_type()).clone(at::MemoryFormat::Contiguous);
  }
}

// True where `p`'s gradient is an fp32 tensor of its shape on `on`'s device
// that a product can add into.
bool SummableGradient(const torch::Tensor& p, const torch::Tensor& on) {
  const auto& g = p.grad();
  return g.defined() && g.scalar_type() == torch::kFloat && g.sizes() == p.sizes() && g.device() == on.device() &&
         g.is_contiguous();
}

// w.grad() += dyᵀ·x for dy [N, out], x [N, in] (both bf16 or both fp32), accumulated
// in fp32, in the product itself where the gradient is an fp32 tensor of
// w's shape.
void AddWeightGradient(const torch::Tensor& w, const torch::Tensor& dy, const torch::Tensor& x) {
  auto& g = const_cast<torch::Tensor&>(w).mutable_grad();
  const bool in_place = SummableGradient(w, x);
#ifdef OB_WITH_CUDA_KERNELS
  if (in_place && g.is_cuda() && (x.scalar_type() == torch::kBFloat16 || x.scalar_type() == torch::kFloat)) {
    if (GradientGemmsOn(g.device())) {
      CublasAccumulate(g, dy, x);
    } else {  // ATen's product in the operands' dtype, then an add (autograd's arithmetic)
      g.add_(torch::mm(dy.t(), x));
    }
    return;
  }
#endif
  if (in_place) {
    // As the GPU's GEMM does: bf16 operands, their products and sums in fp32
    // (a product of two bf16 values is exact in fp32), the result in fp32;
    // a bf16 product would round each micro-batch's gradient to bf16 first.
    g.addmm_(dy.t().to(torch::kFloat), x.to(torch::kFloat));
    return;
  }
  AddToGradient(w, torch::mm(dy.t().to(torch::kFloat), x.to(torch::kFloat)));
}

// b.grad() += Σ_rows dy for dy [N, out], summed in fp32.
void AddBiasGradient(const torch::Tensor& b, const torch::Tensor& dy) {
#ifdef OB_WITH_CUDA_KERNELS
  if (GradientGemmsOn(dy.device()) && SummableGradient(b, dy) &&
      (dy.scalar_type() == torch::kBFloat16 || dy.scalar_type() == torch::kFloat)) {
    auto& g = const_cast<torch::Tensor&>(b).mutable_grad();
    CublasAccumulateBias(g, dy);
    return;
  }
#endif
  AddToGradient(b, dy.sum(0, false, torch::kFloat));
}

// dx for dy, the weight and bias gradients summed (b may be undefined).
torch::Tensor Backward(AutogradContext* ctx, const torch::Tensor& dy_out, const torch::Tensor& x,
                       const torch::Tensor& w, const torch::Tensor& b, const torch::Tensor& wc) {
  compat::AutocastOff off;
  const int64_t in = x.size(-1), out = wc.size(0);
  auto dy = dy_out.to(x.scalar_type());
  torch::Tensor dx;
  if (ctx->needs_input_grad(0)) dx = CpuWideProduct(dy, wc);
  auto dy2 = dy.reshape({-1, out}).contiguous();
  if (w.requires_grad()) AddWeightGradient(w, dy2, x.reshape({-1, in}).contiguous());
  if (b.defined() && b.requires_grad()) AddBiasGradient(b, dy2);
  return dx;
}

// x in the compute dtype; wc, bc the compute-dtype copies of w, b; w, b the
// parameters whose gradients it sums. (Two functions, with and without a
// bias: LibTorch 1.13's custom functions take no undefined inputs.)
struct LinearFn : public torch::autograd::Function<LinearFn> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& w,
                               const torch::Tensor& b, const torch::Tensor& wc, const torch::Tensor& bc) {
    compat::AutocastOff off;
    ctx->save_for_backward({x, w, b, wc});
    return CpuWideAffine(x, wc, bc);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const auto s = ctx->get_saved_variables();
    return {Backward(ctx, grad[0], s[0], s[1], s[2], s[3]), torch::Tensor(), torch::Tensor(), torch::Tensor(),
            torch::Tensor()};
  }
};

struct LinearNoBiasFn : public torch::autograd::Function<LinearNoBiasFn> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& w,
                               const torch::Tensor& wc) {
    compat::AutocastOff off;
    ctx->save_for_backward({x, w, wc});
    return CpuWideAffine(x, wc, torch::Tensor());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const auto s = ctx->get_saved_variables();
    return {Backward(ctx, grad[0], s[0], s[1], torch::Tensor(), s[2]), torch::Tensor(), torch::Tensor()};
  }
};

// `p` in `dtype`, without a graph: the current ComputeCopies' copy, else
// autocast's cached cast where it makes one.
torch::Tensor InDtype(const torch::Tensor& p, at::ScalarType dtype) {
  if (p.scalar_type() == dtype) return p.detach();
  if (auto copy = ComputeCopies::Find(p, dtype); copy.defined()) return copy;
  return compat::CachedCast(p, dtype).detach();
}

// The MLP's forward, x [..., in] in the compute dtype and w1c, b1c, w2c,
// b2c (b2c may be undefined) its weights in it: pre = x·w1cᵀ + b1c, h =
// gelu(pre), the result h·w2cᵀ + b2c. Saves what the backward reads: x,
// pre and h, as autograd would for the three operations; with `recompute`
// an undefined tensor in h's place (the backward computes it again).
torch::Tensor MlpForward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& w1c,
                         const torch::Tensor& b1c, const torch::Tensor& w2c, const torch::Tensor& b2c,
                         std::vector<torch::Tensor> keep, bool recompute) {
  compat::AutocastOff off;
  auto x2 = x.reshape({-1, x.size(-1)}).contiguous();
  torch::Tensor pre, h;
  bool fused = false;
#ifdef OB_WITH_CUDA_KERNELS
  fused = !recompute && LtGelu::Forward(x2, w1c, b1c, pre, h);
  if (fused) lt_forwards.fetch_add(1, std::memory_order_relaxed);
#endif
  if (!fused) {
    pre = CpuWideAffine(x2, w1c, b1c);
    h = at::gelu(pre, "tanh");
  }
  auto y = CpuWideAffine(h, w2c, b2c);
  ctx->saved_data["recompute"] = recompute;
  keep.insert(keep.begin(), {x2, pre, recompute ? torch::Tensor() : h});
  ctx->save_for_backward(keep);
  auto shape = x.sizes().vec();
  shape.back() = y.size(-1);
  return y.view(shape);
}

// Its backward: dx for dy, the four (or three) parameters' gradients summed.
torch::Tensor MlpBackward(AutogradContext* ctx, const torch::Tensor& dy_out, const torch::Tensor& x2,
                          const torch::Tensor& pre, torch::Tensor h, const torch::Tensor& w1,
                          const torch::Tensor& b1, const torch::Tensor& w2, const torch::Tensor& b2,
                          const torch::Tensor& w1c, const torch::Tensor& w2c, at::IntArrayRef x_shape) {
  compat::AutocastOff off;
  if (ctx->saved_data["recompute"].toBool()) h = at::gelu(pre, "tanh");  // as the forward computed it
  auto dy = dy_out.to(x2.scalar_type()).reshape({-1, w2c.size(0)}).contiguous();
  torch::Tensor dpre, db1;
  bool fused = false;
#ifdef OB_WITH_CUDA_KERNELS
  fused = LtGelu::Backward(dy, w2c, pre, dpre, db1);
  if (fused) lt_backwards.fetch_add(1, std::memory_order_relaxed);
#endif
  if (!fused) dpre = at::gelu_backward(CpuWideProduct(dy, w2c), pre, "tanh");
  if (w2.requires_grad()) AddWeightGradient(w2, dy, h);
  if (b2.defined() && b2.requires_grad()) AddBiasGradient(b2, dy);
  if (w1.requires_grad()) AddWeightGradient(w1, dpre, x2);
  if (b1.requires_grad()) {
    if (fused) {
      AddToGradient(b1, db1.to(torch::kFloat));
    } else {
      AddBiasGradient(b1, dpre);
    }
  }
  if (!ctx->needs_input_grad(0)) return torch::Tensor();
  return CpuWideProduct(dpre, w1c).view(x_shape);
}

// Inputs x, then the parameters (w1, b1, w2[, b2]) whose gradients it sums,
// then their compute-dtype copies.
struct MlpFn : public torch::autograd::Function<MlpFn> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& w1,
                               const torch::Tensor& b1, const torch::Tensor& w2, const torch::Tensor& b2,
                               const torch::Tensor& w1c, const torch::Tensor& b1c, const torch::Tensor& w2c,
                               const torch::Tensor& b2c, bool recompute) {
    ctx->saved_data["shape"] = x.sizes().vec();
    return MlpForward(ctx, x, w1c, b1c, w2c, b2c, {w1, b1, w2, b2, w1c, w2c}, recompute);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const auto s = ctx->get_saved_variables();
    const auto shape = ctx->saved_data["shape"].toIntVector();
    auto dx = MlpBackward(ctx, grad[0], s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7], s[8], shape);
    variable_list out(10);
    out[0] = dx;
    return out;
  }
};

struct MlpNoBias2Fn : public torch::autograd::Function<MlpNoBias2Fn> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& w1,
                               const torch::Tensor& b1, const torch::Tensor& w2, const torch::Tensor& w1c,
                               const torch::Tensor& b1c, const torch::Tensor& w2c, bool recompute) {
    ctx->saved_data["shape"] = x.sizes().vec();
    return MlpForward(ctx, x, w1c, b1c, w2c, torch::Tensor(), {w1, b1, w2, w1c, w2c}, recompute);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const auto s = ctx->get_saved_variables();
    const auto shape = ctx->saved_data["shape"].toIntVector();
    auto dx = MlpBackward(ctx, grad[0], s[0], s[1], s[2], s[3], s[4], s[5], torch::Tensor(), s[6], s[7], shape);
    variable_list out(8);
    out[0] = dx;
    return out;
  }
};

#ifdef OB_WITH_CUDA_KERNELS
// dgamma/dbeta of a layer norm summed into w's and b's fp32 gradients by
// norm_grad.cu's kernels, where they apply: bf16 x and dy contiguous on a
// GPU, 16-byte aligned, a multiple of 8 columns, fp32 statistics, and fp32
// gradients to add into (OB_LN_KERNEL=0: never). False: nothing done.
bool NormKernelGradients(const torch::Tensor& dy, const torch::Tensor& x, const torch::Tensor& mean,
                         const torch::Tensor& rstd, const torch::Tensor& w, const torch::Tensor& b) {
  static const bool enabled = KernelSwitchedOn("OB_LN_KERNEL");
  if (!enabled || !x.is_cuda() || x.scalar_type() != torch::kBFloat16 || dy.scalar_type() != torch::kBFloat16 ||
      !x.is_contiguous() || !dy.is_contiguous() || dy.sizes() != x.sizes() || w.dim() != 1 ||
      mean.scalar_type() != torch::kFloat || rstd.scalar_type() != torch::kFloat || !mean.is_contiguous() ||
      !rstd.is_contiguous() || !SummableGradient(w, x) || !SummableGradient(b, x) || dy.device() != x.device()) {
    return false;
  }
  const int64_t cols = w.size(0), rows = x.numel() / std::max<int64_t>(cols, 1);
  if (cols == 0 || cols % 8 != 0 || x.size(-1) != cols || mean.numel() != rows || rstd.numel() != rows ||
      reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 != 0 || reinterpret_cast<uintptr_t>(dy.data_ptr()) % 16 != 0) {
    return false;
  }
  c10::cuda::CUDAGuard device(x.device());
  auto scratch = torch::empty({cuda::LayerNormScratchFloats(rows, cols)}, x.options().dtype(torch::kFloat));
  const char* error = cuda::LayerNormParamGradients(
      dy.data_ptr(), x.data_ptr(), mean.data_ptr<float>(), rstd.data_ptr<float>(), rows, cols,
      scratch.data_ptr<float>(), const_cast<torch::Tensor&>(w).mutable_grad().data_ptr<float>(),
      const_cast<torch::Tensor&>(b).mutable_grad().data_ptr<float>(),
      c10::cuda::getCurrentCUDAStream(x.get_device()).stream());
  TORCH_CHECK(error == nullptr, "layer norm: gain and bias gradients: ", error);
  norm_kernels.fetch_add(1, std::memory_order_relaxed);
  return true;
}
#endif

// A layer norm over the last dimensions `shape` of x (in the compute
// dtype) with gain and bias copies wc, bc in it; the gradients of the fp32
// gain and bias w, b are added into theirs.
struct LayerNormFn : public torch::autograd::Function<LayerNormFn> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& w,
                               const torch::Tensor& b, const torch::Tensor& wc, const torch::Tensor& bc,
                               std::vector<int64_t> shape, double eps) {
    compat::AutocastOff off;
    auto [y, mean, rstd] = at::native_layer_norm(x, shape, wc, bc, eps);
    ctx->save_for_backward({x, mean, rstd, w, b, wc, bc});
    ctx->saved_data["shape"] = shape;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    compat::AutocastOff off;
    const auto s = ctx->get_saved_variables();
    const auto shape = ctx->saved_data["shape"].toIntVector();
    const torch::Tensor &x = s[0], &w = s[3], &b = s[4];
    const auto dy = grad[0].to(x.scalar_type()).contiguous();
    bool want_w = w.requires_grad(), want_b = b.requires_grad();
#ifdef OB_WITH_CUDA_KERNELS
    if (want_w && want_b && NormKernelGradients(dy, x, s[1], s[2], w, b)) want_w = want_b = false;  // summed
#endif
    const bool want_x = ctx->needs_input_grad(0);
    if (!want_x && !want_w && !want_b) return variable_list(7);
    auto [dx, dw, db] =
        at::native_layer_norm_backward(dy, x, shape, s[1], s[2], s[5], s[6], {want_x, want_w, want_b});
    // fp32 += bf16 in one kernel, where autograd casts and then adds.
    if (dw.defined()) AddToGradient(w, dw);
    if (db.defined()) AddToGradient(b, db);
    return {dx, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(),
            torch::Tensor()};
  }
};

}  // namespace

torch::Tensor LayerNorm(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                        const std::vector<int64_t>& shape, double eps) {
  const auto dtype = compat::AutocastDtype(x);
  if (!dtype || x.scalar_type() != *dtype || w.scalar_type() == *dtype) {
    return torch::layer_norm(x, shape, w, b, eps);
  }
  const bool graph = torch::GradMode::is_enabled() && w.requires_grad() && b.requires_grad() && w.is_leaf() &&
                     b.is_leaf();
  if (!graph) {  // as autograd would, from the copies or autocast's casts
    auto wc = ComputeWeight(w, *dtype), bc = ComputeWeight(b, *dtype);
    compat::AutocastOff off;
    return torch::layer_norm(x, shape, wc, bc, eps);
  }
  return LayerNormFn::apply(x, w, b, InDtype(w, *dtype), InDtype(b, *dtype), shape, eps);
}

torch::Tensor Linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b) {
  const bool leaves = w.is_leaf() && (!b.defined() || b.is_leaf());
  if (!torch::GradMode::is_enabled() || !w.requires_grad() || !leaves) return torch::linear(x, w, b);
  // Without autocast the operands must agree already (torch::linear says so).
  const auto autocast = compat::AutocastDtype(x);
  if (!autocast && w.scalar_type() != x.scalar_type()) return torch::linear(x, w, b);
  const auto dtype = autocast.value_or(x.scalar_type());
  if (!b.defined()) return LinearNoBiasFn::apply(x.to(dtype), w, InDtype(w, dtype));
  return LinearFn::apply(x.to(dtype), w, b, InDtype(w, dtype), InDtype(b, dtype));
}

torch::Tensor GeluMlp(const torch::Tensor& x, const torch::Tensor& w1, const torch::Tensor& b1,
                      const torch::Tensor& w2, const torch::Tensor& b2, bool recompute_activation) {
  auto composed = [&] {
    auto h = at::gelu(Linear(x, w1, b1), "tanh");
    return Linear(h, w2, b2);
  };
  const bool leaves = w1.is_leaf() && b1.is_leaf() && w2.is_leaf() && (!b2.defined() || b2.is_leaf());
  if (!torch::GradMode::is_enabled() || !w1.requires_grad() || !w2.requires_grad() || !leaves) return composed();
  const auto autocast = compat::AutocastDtype(x);
  if (!autocast && (w1.scalar_type() != x.scalar_type() || w2.scalar_type() != x.scalar_type())) return composed();
  const auto dtype = autocast.value_or(x.scalar_type());
  const auto xc = x.to(dtype);
  if (!b2.defined()) {
    return MlpNoBias2Fn::apply(xc, w1, b1, w2, InDtype(w1, dtype), InDtype(b1, dtype), InDtype(w2, dtype),
                               recompute_activation);
  }
  return MlpFn::apply(xc, w1, b1, w2, b2, InDtype(w1, dtype), InDtype(b1, dtype), InDtype(w2, dtype),
                      InDtype(b2, dtype), recompute_activation);
}

bool GradientGemmsOn(const torch::Device& device) {
  static const bool on = kCudaKernels && KernelSwitchedOn("OB_GEMM_ACCUMULATE");
  return on && device.is_cuda();
}

bool KernelSwitchedOn(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr || std::strcmp(v, "0") != 0;
}

int64_t LayerNormKernelCount() { return norm_kernels.load(std::memory_order_relaxed); }

std::pair<int64_t, int64_t> GeluMlpEpilogueCounts() {
  return {lt_forwards.load(std::memory_order_relaxed), lt_backwards.load(std::memory_order_relaxed)};
}

}  // namespace ob::model
