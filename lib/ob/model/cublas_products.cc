// A CUDA build's cuBLAS and cuBLASLt calls for the dense layers (see
// linear_impl.h): weight and bias gradients summed into fp32 gradients by
// a GEMM (beta = 1), and the MLP's products with a GELU epilogue. Empty
// without OB_WITH_CUDA_KERNELS.
#ifdef OB_WITH_CUDA_KERNELS
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cublasLt.h>
#include <cublas_v2.h>

#include <array>
#include <cstring>
#include <limits>
#include <map>
#include <optional>

#include "ob/model/kernel_switch.h"
#include "ob/model/linear_impl.h"

namespace ob::model::detail {
namespace {

// A vector of `n` ones in `dtype` on the current device, this thread's,
// grown as needed (a fill a call would be a launch a call).
const torch::Tensor& Ones(int64_t n, const torch::TensorOptions& opt) {
  thread_local torch::Tensor ones[2];
  torch::Tensor& t = ones[opt.dtype() == torch::kBFloat16 ? 1 : 0];
  if (!t.defined() || t.numel() < n || t.device() != opt.device()) t = torch::ones({n}, opt);
  return t;
}

// cuBLASLt products with a GELU epilogue (the MLP's, GeluMlp in mlp.cc). Each
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

}  // namespace

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

bool LtGeluForward(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b, torch::Tensor& pre,
                   torch::Tensor& h) {
  return LtGelu::Forward(x, w, b, pre, h);
}

bool LtGeluBackward(const torch::Tensor& dy, const torch::Tensor& w, const torch::Tensor& pre,
                    torch::Tensor& dpre, torch::Tensor& db) {
  return LtGelu::Backward(dy, w, pre, dpre, db);
}

}  // namespace ob::model::detail
#endif  // OB_WITH_CUDA_KERNELS
