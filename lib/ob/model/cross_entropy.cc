// The head's loss (see cross_entropy.h).
#include "ob/model/cross_entropy.h"

#include "ob/model/kernel_switch.h"

#ifdef OB_WITH_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "ob/model/fused_loss.h"
#endif

namespace ob::model {

torch::Tensor ReferenceCrossEntropy(const torch::Tensor& logits, const torch::Tensor& targets, int64_t vocab) {
  // log-softmax reads the logits in their dtype and writes fp32.
  auto words = logits.size(-1) == vocab ? logits : logits.narrow(-1, 0, vocab);
  return torch::nll_loss(torch::log_softmax(words, -1, torch::kFloat), targets);
}

#ifdef OB_WITH_CUDA_KERNELS
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

cuda::LogitsType TypeOf(const torch::Tensor& x) {
  return x.scalar_type() == torch::kBFloat16 ? cuda::LogitsType::kBFloat16 : cuda::LogitsType::kFloat32;
}

void Check(const char* error, const char* what) {
  TORCH_CHECK(error == nullptr, "fused cross-entropy ", what, ": ", error);
}

struct FusedCrossEntropyFn : public torch::autograd::Function<FusedCrossEntropyFn> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& logits, const torch::Tensor& targets,
                               int64_t vocab) {
    c10::cuda::CUDAGuard device(logits.device());
    auto x = logits.contiguous();
    auto t = targets.to(torch::kLong).contiguous();
    const int64_t rows = x.size(0), ld = x.size(1);
    auto lse = torch::empty({rows}, x.options().dtype(torch::kFloat));
    auto loss = torch::empty_like(lse);
    Check(cuda::CrossEntropyForward(TypeOf(x), x.data_ptr(), rows, ld, vocab, t.data_ptr<int64_t>(),
                                    lse.data_ptr<float>(), loss.data_ptr<float>(),
                                    c10::cuda::getCurrentCUDAStream(x.get_device()).stream()),
          "forward");
    ctx->save_for_backward({x, t, lse});
    ctx->saved_data["vocab"] = vocab;
    return loss.mean();
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const auto saved = ctx->get_saved_variables();
    const auto& x = saved[0];
    const auto& t = saved[1];
    const auto& lse = saved[2];
    c10::cuda::CUDAGuard device(x.device());
    const int64_t rows = x.size(0), ld = x.size(1);
    // The mean's gradient, read by the kernel where it lies: no host sync.
    auto g = grad[0].to(torch::kFloat).contiguous();
    auto out = torch::empty_like(x);
    Check(cuda::CrossEntropyBackward(TypeOf(x), x.data_ptr(), rows, ld, ctx->saved_data["vocab"].toInt(),
                                     t.data_ptr<int64_t>(), lse.data_ptr<float>(), g.data_ptr<float>(),
                                     rows > 0 ? 1.f / static_cast<float>(rows) : 0.f, out.data_ptr(),
                                     c10::cuda::getCurrentCUDAStream(x.get_device()).stream()),
          "backward");
    return {out, torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace
#endif

bool FusedCrossEntropyOn(const torch::Device& device) {
  static const bool on = kCudaKernels && KernelSwitchedOn("OB_FUSED_LOSS");
  return on && device.is_cuda();
}

torch::Tensor CrossEntropy(const torch::Tensor& logits, const torch::Tensor& targets, int64_t vocab) {
  TORCH_CHECK(logits.dim() == 2 && targets.dim() == 1 && targets.size(0) == logits.size(0) &&
                  vocab >= 1 && vocab <= logits.size(1),
              "cross-entropy: logits [N, P >= vocab] and targets [N] expected");
#ifdef OB_WITH_CUDA_KERNELS
  const auto type = logits.scalar_type();
  if (FusedCrossEntropyOn(logits.device()) && (type == torch::kFloat || type == torch::kBFloat16)) {
    return FusedCrossEntropyFn::apply(logits, targets, vocab);
  }
#endif
  return ReferenceCrossEntropy(logits, targets, vocab);
}

}  // namespace ob::model
