// Measured profile of gpt-tiny on CPU: every field of every layer is filled
// from a real measurement.
#include <catch2/catch.hpp>

#include "ob/profile/analytic.h"
#include "ob/profile/collective.h"
#include "ob/profile/measured.h"

TEST_CASE("measured gpt-tiny profile has every field for every layer") {
  auto c = ob::model::Preset("gpt-tiny");
  REQUIRE(c.ok());
  ob::profile::MeasureOptions o;
  o.microbatches = {1, 2};
  o.warmup = 1;
  o.repeats = 3;
  o.max_group = 2;
  o.threads = 1;
  auto p = ob::profile::MeasureProfile(*c, o);
  REQUIRE(p.ok());
  CHECK(p->mode() == ob::pb::PROFILE_MEASURED);
  CHECK(p->device().kind() == "cpu");
  CHECK(p->dtype() == "float32");
  CHECK(p->sequence_length() == static_cast<uint32_t>(c->n_positions));
  REQUIRE(p->layers_size() == c->num_layers());
  const double s = c->n_positions, h = c->n_embd, V = c->vocab_size;
  for (const auto& l : p->layers()) {
    INFO(l.name());
    CHECK(l.parameter_count() > 0);
    CHECK(l.parameter_bytes() == 4 * l.parameter_count());
    CHECK(l.gradient_bytes() == 4 * l.parameter_count());
    CHECK(l.optimizer_state_bytes() == 8 * l.parameter_count());  // AdamW: two fp32 moments
    REQUIRE(l.costs_size() == 2);
    for (const auto& cost : l.costs()) {
      const double b = cost.microbatch();
      INFO("micro-batch " << b);
      CHECK(cost.forward_seconds() > 0);
      CHECK(cost.backward_seconds() > 0);
      CHECK(cost.activation_bytes() > 0);
      CHECK(cost.output_bytes() > 0);
      if (l.kind() != ob::pb::LAYER_HEAD) {
        CHECK(cost.output_bytes() == static_cast<uint64_t>(b * s * h * 4));
      }
      if (l.kind() == ob::pb::LAYER_BLOCK) {
        CHECK(cost.forward_flops() > 0);
        // Within a factor of two of design/formulas.md's fp32 estimate (unfused attention).
        const double spec = 2 * s * b * h * (34 + 5 * c->n_head * s / h);
        CHECK(cost.activation_bytes() > spec / 2);
        CHECK(cost.activation_bytes() < spec * 2);
      }
      if (l.kind() == ob::pb::LAYER_HEAD) {
        CHECK(cost.activation_bytes() >= static_cast<uint64_t>(s * b * V * 4));  // the logits
      }
    }
    // The gradient's all-reduce for groups 1 and 2; a block then its
    // output's (one micro-batch: a boundary's, a tensor-parallel one's).
    const bool block = l.kind() == ob::pb::LAYER_BLOCK;
    REQUIRE(l.allreduce_size() == (block ? 4 : 2));
    CHECK(l.allreduce(0).group_size() == 1);
    CHECK(l.allreduce(1).group_size() == 2);
    CHECK(l.allreduce(1).bytes() == l.gradient_bytes());
    CHECK(l.allreduce(1).seconds() > 0);
    if (block) {
      CHECK(l.allreduce(2).group_size() == 1);
      CHECK(l.allreduce(3).group_size() == 2);
      CHECK(l.allreduce(3).bytes() == l.costs(0).output_bytes());
      CHECK(l.allreduce(3).seconds() > 0);
    }
  }
  // Identical blocks share their pooled times (measure_chain.cc): one
  // preempted repeat of one block must not make the planner cut around it.
  for (int i = 2; i + 1 < c->num_layers(); ++i) {
    for (int k = 0; k < 2; ++k) {
      CHECK(p->layers(i).costs(k).forward_seconds() == p->layers(1).costs(k).forward_seconds());
      CHECK(p->layers(i).costs(k).backward_seconds() == p->layers(1).costs(k).backward_seconds());
      CHECK(p->layers(i).costs(k).weight_grad_seconds() == p->layers(1).costs(k).weight_grad_seconds());
    }
  }
  // Two micro-batches cost more than one.
  CHECK(p->layers(1).costs(1).activation_bytes() > p->layers(1).costs(0).activation_bytes());
  CHECK(p->layers(c->num_layers() - 1).tied_parameter_count() == static_cast<uint64_t>(V * h));
}

TEST_CASE("a measured bf16 profile counts the weights' bf16 compute copies as the run keeps them") {
  auto c = ob::model::Preset("gpt-tiny");
  REQUIRE(c.ok());
  ob::profile::MeasureOptions o;
  o.microbatches = {1};
  o.warmup = 1;
  o.repeats = 1;
  o.max_group = 1;
  o.threads = 1;
  o.bf16 = true;
  auto p = ob::profile::MeasureProfile(*c, o);
  REQUIRE(p.ok());
  CHECK(p->dtype() == "bfloat16");
  for (const auto& l : p->layers()) {
    INFO(l.name());
    // The fp32 weight and its bf16 copy; fp32 gradients; two fp32 moments.
    CHECK(l.parameter_bytes() == 6 * l.parameter_count());
    CHECK(l.gradient_bytes() == 4 * l.parameter_count());
    CHECK(l.optimizer_state_bytes() == 8 * l.parameter_count());
    CHECK(l.costs(0).forward_seconds() > 0);
    CHECK(l.costs(0).activation_bytes() > 0);
  }
}

TEST_CASE("measured mode refuses what it cannot do") {
  auto c = ob::model::Preset("gpt-tiny");
  ob::profile::MeasureOptions o;
  o.seq_len = c->n_positions + 1;
  CHECK(ob::profile::MeasureProfile(*c, o).status().code() == ob::Code::kConfig);
  o = {};
  o.device = "tpu";
  CHECK(ob::profile::MeasureProfile(*c, o).status().code() == ob::Code::kConfig);
  o = {};
  o.repeats = 0;
  CHECK(ob::profile::MeasureProfile(*c, o).status().code() == ob::Code::kConfig);
#ifndef OB_WITH_CUDA
  o = {};
  o.device = "cuda";
  auto r = ob::profile::MeasureProfile(*c, o);
  CHECK(r.status().code() == ob::Code::kConfig);
  CHECK_THAT(r.status().message(), Catch::Contains("without CUDA"));
#endif
}

TEST_CASE("measured mode: all-reduce groups up to the node's, 4 ranks on the CPU, when not given") {
  // On a one-GPU machine the old default (groups up to 4) refused to profile
  // at all: "all-reduce group of 2 needs 2 GPUs, this node has 1".
  auto c = ob::model::Preset("gpt-tiny");
  ob::profile::MeasureOptions o;
  o.warmup = 0;
  o.repeats = 1;
  CHECK(o.max_group == 0);
  auto p = ob::profile::MeasureProfile(*c, o);
  REQUIRE(p.ok());
  const auto& l = p->layers(1);
  REQUIRE(l.allreduce_size() == 6);  // a block: its gradient's, then its output's
  CHECK(l.allreduce(2).group_size() == 4);
  CHECK(l.allreduce(5).group_size() == 4);
  CHECK(p->device().peak_tflops() == 0);  // no published peak for a CPU
}

TEST_CASE("all-reduce timed between products, as a worker issues it") {
  // ob-profile --concurrency times its all-reduces this way (collective.h):
  // each rank computes a product before every all-reduce, and the extra
  // time per all-reduce over the products alone is kept.
  const ob::profile::Between between{64, 128, 512};
  REQUIRE(between.any());
  CHECK_FALSE(ob::profile::Between{}.any());
  auto t = ob::profile::TimeAllReduce({4096, 1 << 20}, 2, "cpu", 1, 5, between);
  REQUIRE(t.ok());
  REQUIRE(t->size() == 2);
  for (double s : *t) {
    CHECK(s >= 0);
    CHECK(s < 1.0);
  }
  // The one-rank group runs its local path whatever `between` says.
  auto one = ob::profile::TimeAllReduce({4096}, 1, "cpu", 0, 3, between);
  REQUIRE(one.ok());
  CHECK(one->size() == 1);
}
