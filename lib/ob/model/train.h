// Single-process reference training (design/model.md): the whole GPT as one GptStage,
// AdamW, global-norm clipping, warm-up + cosine learning rate, gradient
// accumulation over micro-batches. Pipeline and data-parallel runs are
// checked against these loss curves, so every choice here (sample order, loss
// scaling, schedule) is the definition the distributed runtime must match.
//
// Thread-safety: train_steps uses only its own model and optimizer (LibTorch's
// intra-op thread pool aside). Failure: data that does not fit the model is
// kDataErr; LibTorch errors are caught and returned as kSoftware.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ob/model/config.h"
#include "ob/model/data.h"
#include "ob/model/gpt.h"
#include "ob/status.h"

namespace ob::model {

struct StepRecord {
  int64_t step = 0;
  double loss = 0;       // mean over the global batch
  double grad_norm = 0;  // global L2 norm before clipping
  double lr = 0;         // learning rate used for this step
  double seconds = 0;    // wall time of the step
};

// Precision (the arithmetic of a run): config.h.

struct TrainOptions {
  int64_t steps = 10;
  int global_batch = 8;    // samples per optimizer step
  int microbatch = 8;      // samples per forward/backward; REQUIRES divides global_batch
  int seq_len = 0;         // 0: cfg.n_positions
  double lr = 1e-3;        // peak learning rate
  double min_lr = 0.0;     // floor of the cosine decay
  bool cosine = true;      // after warm-up: cosine decay to min_lr, else lr throughout
  int64_t warmup_steps = 0;
  double weight_decay = 0.1;  // on >= 2-D weights only
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double grad_clip = 1.0;  // <= 0: no clipping (the norm is still reported)
  uint64_t seed = 0;       // model initialisation and data sampling
  torch::Device device = torch::kCPU;
  Precision precision = Precision::kFp32;
  // Pipeline workers (runtime/stage_worker.h): start each gradient bucket's
  // data-parallel all-reduce during the last micro-batch's backward (true),
  // or all of them after the pipeline schedule (false: the schedule before
  // issue 13, kept for the overlap benchmark).
  bool overlap_allreduce = true;
  // Pipeline workers: copy each step's host snapshot in the background
  // (true), or on the training thread before the step returns (false: as
  // before issue 13, kept for the snapshot benchmark).
  bool async_snapshot = true;
  std::function<void(const StepRecord&)> on_step;  // optional progress callback
};

// Learning rate at `step` (0-based): linear warm-up to opts.lr over
// warmup_steps, then cosine decay to min_lr at opts.steps (or opts.lr
// throughout when !opts.cosine).
double LearningRate(const TrainOptions& opts, int64_t step);

// Samples [first, first + count) of global step `step`: {x, y}, each [count,
// seq_len] int64 on CPU. REQUIRES: data.Check(seq_len, ...) ok.
std::pair<torch::Tensor, torch::Tensor> MakeBatch(const TokenSource& data, uint64_t seed,
                                                  int64_t step, int64_t first, int64_t count,
                                                  int seq_len);

// AdamW over module's parameters with opts' hyperparameters: weight decay on
// >= 2-D parameters only (not biases or LayerNorm gains), lr = opts.lr. The
// reference and the pipeline workers build their optimizers with this, so a
// stage's update is the same per parameter as the whole model's.
// The optimizer holds the module's parameter tensors (shared, not copied).
std::unique_ptr<torch::optim::AdamW> MakeOptimizer(const torch::nn::Module& module,
                                                   const TrainOptions& opts);

// Sets the learning rate of every parameter group of an AdamW optimizer.
void SetLearningRate(torch::optim::AdamW& optimizer, double lr);

// One AdamW update: on CUDA (LibTorch >= 2.1) one fused multi-tensor kernel
// per parameter group (compat::FusedAdamWStep), else optimizer.step(); the
// same math and the same state either way.
void OptimizerStep(torch::optim::AdamW& optimizer);

// Trains a fresh model (GptStage [0, L+1] seeded with opts.seed) for
// opts.steps steps; step k uses samples (seed, k, i), i in [0, global_batch).
// When `trained` is given it receives the model after the last step.
Result<std::vector<StepRecord>> train_steps(const GptConfig& cfg, const TokenSource& data,
                                            const TrainOptions& opts,
                                            GptStage* trained = nullptr);

}  // namespace ob::model
