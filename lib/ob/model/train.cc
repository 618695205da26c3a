// Reference training loop: one process, one model, gradient accumulation.
#include "ob/model/train.h"

#include <chrono>
#include <cmath>

#include "ob/model/gpt.h"
#include "ob/torch_compat.h"

namespace ob::model {

double LearningRate(const TrainOptions& opts, int64_t step) {
  if (step < opts.warmup_steps) {
    return opts.lr * static_cast<double>(step + 1) / static_cast<double>(opts.warmup_steps);
  }
  if (!opts.cosine) return opts.lr;
  const int64_t decay_steps = std::max<int64_t>(1, opts.steps - opts.warmup_steps);
  const double progress =
      std::min(1.0, static_cast<double>(step - opts.warmup_steps) / decay_steps);
  return opts.min_lr + 0.5 * (opts.lr - opts.min_lr) * (1.0 + std::cos(M_PI * progress));
}

std::pair<torch::Tensor, torch::Tensor> MakeBatch(const TokenSource& data, uint64_t seed,
                                                  int64_t step, int64_t first, int64_t count,
                                                  int seq_len) {
  auto x = torch::empty({count, seq_len}, torch::kLong);
  auto y = torch::empty({count, seq_len}, torch::kLong);
  for (int64_t i = 0; i < count; ++i) {
    data.Sample(seed, static_cast<uint64_t>(step), static_cast<uint64_t>(first + i), seq_len,
                x.data_ptr<int64_t>() + i * seq_len, y.data_ptr<int64_t>() + i * seq_len);
  }
  return {x, y};
}

std::unique_ptr<torch::optim::AdamW> MakeOptimizer(const torch::nn::Module& module,
                                                   const TrainOptions& opts) {
  // Weight decay on matrices only, not on biases or LayerNorm gains.
  std::vector<torch::Tensor> decay, no_decay;
  for (const auto& p : module.parameters()) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  auto options = [&](double wd) {
    return std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(opts.lr)
            .betas({opts.beta1, opts.beta2})
            .eps(opts.eps)
            .weight_decay(wd));
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, options(opts.weight_decay));
  groups.emplace_back(no_decay, options(0.0));
  return std::make_unique<torch::optim::AdamW>(groups, *options(opts.weight_decay));
}

void SetLearningRate(torch::optim::AdamW& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) {
    static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
  }
}

void OptimizerStep(torch::optim::AdamW& optimizer) {
  if (!compat::FusedAdamWStep(optimizer)) optimizer.step();
}

namespace {

std::vector<StepRecord> Train(const GptConfig& cfg, const TokenSource& data,
                              const TrainOptions& opts, int seq_len, GptStage* trained) {
  GptStage model(cfg, 0, cfg.num_layers() - 1, opts.seed);
  model->to(opts.device);
  model->train();

  auto optimizer_ptr = MakeOptimizer(*model, opts);
  auto& optimizer = *optimizer_ptr;
  auto params = model->parameters();

  std::vector<StepRecord> records;
  for (int64_t step = 0; step < opts.steps; ++step) {
    const auto start = std::chrono::steady_clock::now();
    const double lr = LearningRate(opts, step);
    SetLearningRate(optimizer, lr);
    optimizer.zero_grad();
    // Each micro-batch's mean loss is weighted by its share of the global
    // batch, so the accumulated gradient is that of the global-batch mean.
    double loss_sum = 0;
    for (int first = 0; first < opts.global_batch; first += opts.microbatch) {
      const int count = std::min(opts.microbatch, opts.global_batch - first);
      auto [x, y] = MakeBatch(data, opts.seed, step, first, count, seq_len);
      auto loss = model->forward(x.to(opts.device), y.to(opts.device));
      const double weight = static_cast<double>(count) / opts.global_batch;
      (loss * weight).backward();
      loss_sum += loss.item<double>() * weight;
    }
    const double clip = opts.grad_clip > 0 ? opts.grad_clip : INFINITY;
    const double grad_norm = torch::nn::utils::clip_grad_norm_(params, clip);
    OptimizerStep(optimizer);

    StepRecord r;
    r.step = step;
    r.loss = loss_sum;
    r.grad_norm = grad_norm;
    r.lr = lr;
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    records.push_back(r);
    if (opts.on_step) opts.on_step(r);
  }
  if (trained != nullptr) *trained = model;
  return records;
}

}  // namespace

Result<std::vector<StepRecord>> train_steps(const GptConfig& cfg, const TokenSource& data,
                                            const TrainOptions& opts, GptStage* trained) {
  OB_RETURN_IF_ERROR(cfg.Validate());
  const int seq_len = cfg.seq_len_or_default(opts.seq_len);
  if (seq_len > cfg.n_positions) {
    return Status::Config(cfg.name + ": sequence length " + std::to_string(seq_len) +
                          " exceeds n_positions " + std::to_string(cfg.n_positions));
  }
  if (opts.global_batch <= 0 || opts.microbatch <= 0 || opts.global_batch % opts.microbatch != 0) {
    return Status::Config("global batch " + std::to_string(opts.global_batch) +
                          " is not a positive multiple of micro-batch " +
                          std::to_string(opts.microbatch));
  }
  OB_RETURN_IF_ERROR(data.Check(seq_len, cfg.vocab_size));
  try {
    return Train(cfg, data, opts, seq_len, trained);
  } catch (const std::exception& e) {
    return Status::Internal(std::string("training failed: ") + e.what());
  }
}

}  // namespace ob::model
