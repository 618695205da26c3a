#include "torch_catch.h"

#include "runtime_testing.h"

namespace ob::runtime::testing {

model::GptConfig Small() {
  model::GptConfig c;
  c.name = "gpt-small-test";
  c.n_layer = 4;
  c.n_embd = 64;
  c.n_head = 4;
  c.n_positions = kSeqLen;
  c.vocab_size = 256;
  return c;
}

model::TokenSource Text() {
  auto data = model::TokenSource::Open(OB_SOURCE_DIR "/tests/data/corpus.txt");
  REQUIRE(data.ok());
  return *data;
}

model::TrainOptions Options(int total_microbatches) {
  model::TrainOptions o;
  o.steps = kSteps;
  o.global_batch = total_microbatches * kMicrobatch;
  o.microbatch = kMicrobatch;
  o.seq_len = kSeqLen;
  o.lr = 3e-3;
  o.min_lr = 3e-4;
  o.warmup_steps = 3;
  o.grad_clip = 0.5;
  o.seed = 1234;
  return o;
}

}  // namespace ob::runtime::testing
