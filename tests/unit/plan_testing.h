// Random small planning problems for property tests, shared by the plan_*
// tests. Deterministic from the seed.
#pragma once

#include <cstdint>

#include "ob/plan/plan_io.h"
#include "ob/plan/problem.h"

namespace ob::plan::testing {

struct RandomProblemOptions {
  int max_layers = 12;
  int max_nodes = 10;
  int max_faults = 2;
  int max_gpus_per_node = 2;
};

// A problem with 3..max_layers layers of random costs and sizes, 1..max_nodes
// nodes, a random f, GPU memory between "barely one layer" and "everything",
// and a global batch of M micro-batches, M ≥ f + 1. Not always plannable.
Problem RandomProblem(uint64_t seed, const RandomProblemOptions& opts = {});

// A Profile with the costs of `p` (the plan stores and re-reads it).
pb::Profile ProfileOf(const Problem& p);

// A GPT-like problem: embed, `blocks` equal blocks, head; plenty of memory.
Problem UniformProblem(int blocks, int nodes, int faults, int microbatches, int gpus_per_node = 1);

// UniformProblem(4, nodes, faults, 8) with the GPU memory shrunk until one
// pipeline needs two nodes (n0 = 2), its templates, their instantiation,
// and hosts "h0".."hN-1": a plan as ob-launch loads it. Leaves `templates`
// empty (min_nodes 0) if no memory size gives n0 = 2.
LoadedPlan TwoNodeStagesPlan(int nodes, int faults);

}  // namespace ob::plan::testing
