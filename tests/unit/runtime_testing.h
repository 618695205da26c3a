// The small model, fixed corpus and training options shared by the worker
// runtime tests (runtime_test, recovery_runtime_test), so they compare
// against the same single-process reference. Include after LibTorch and
// Catch (see those tests for the glog CHECK caveat).
#pragma once

#include "ob/model/config.h"
#include "ob/model/data.h"
#include "ob/model/train.h"

namespace ob::runtime::testing {

constexpr int kMicrobatch = 2;   // samples per micro-batch
constexpr int kSeqLen = 32;
constexpr int kSteps = 20;

// gpt-tiny's shape at half the width: 4 blocks, so 6 planner layers.
model::GptConfig Small();

// A fixed text (an early README): the comparison must not depend on files
// that change; README.md's edits once moved the run into a loss spike where
// summation-order differences grew past the tolerance.
model::TokenSource Text();

// kSteps steps of `total_microbatches` micro-batches, warm-up then cosine,
// clipping at 0.5 so that some steps clip.
model::TrainOptions Options(int total_microbatches);

}  // namespace ob::runtime::testing
