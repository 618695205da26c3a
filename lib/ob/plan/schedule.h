// One iteration's schedule per pipeline (its template's, lib/ob/schedule/),
// timed op by op, and its drawing as SVG (ob-plan --schedule-svg), so a
// person can see the bubbles and the stragglers. Torch-free, pure.
#pragma once

#include <string>
#include <vector>

#include "ob/plan/instantiation.h"
#include "ob/plan/placement.h"
#include "ob/plan/problem.h"
#include "ob/plan/templates.h"
#include "ob/schedule/schedule.h"
#include "ob/schedule/timing.h"

namespace ob::plan {

struct ScheduledOp {
  int stage = 0;
  int chunk = 0;  // with chunks (interleaved, zb-v): which of the stage's
  int microbatch = 0;
  bool forward = true;                              // type == kForward
  schedule::Op::Type type = schedule::Op::kForward;
  double start = 0, end = 0;   // seconds from the start of the iteration
};

// The op costs of template t's stages (its slices with chunks, Template::
// Virtual) for schedule::Simulate: each
// stage's compute (StageComputeSeconds) split into forward and backward by
// its layers' ratio, the tensor-parallel all-reduces half each way, the
// backward's weight gradients (the layers' weight_grad / tp) apart; and
// the per-direction halves of the boundary term, on `bw`'s links between
// nodes[q] and nodes[q + 1] (with chunks, the nodes of the two slices'
// stages; none between two chunks of one stage) when `bw` is given, else
// (and within a node) at the nominal link. REQUIRES: nodes.size() == t.nodes when bw is given.
std::vector<schedule::StageCosts> StageCostsOf(const Problem& p, const Template& t, const std::vector<int>& nodes,
                                               const BandwidthMatrix* bw);

// One pipeline of template `t` running m micro-batches under t's schedule
// (schedule/timing.h with StageCostsOf's costs). Returns every op, stage by
// stage, each stage's in execution order; empty when m <= 0.
std::vector<ScheduledOp> SimulatePipeline(const Problem& p, const Template& t, int microbatches,
                                          const std::vector<int>& nodes, const BandwidthMatrix* bw);

// How much slower a process computes with k computing at once on a local
// cluster's shared cores than alone: curve[k − 1] (Cluster::contention, as
// ob-profile --concurrency measured it), growing as k / n beyond the
// curve's n entries (the cores are full); 1 without a curve.
double ContentionSlowdown(const std::vector<double>& curve, int k);

// TimePipelines on a local cluster whose workers share one machine's cores:
// every stage's program as its workers run it (schedule::StageProgram: its
// template's schedule's computes and the batches of sends and receives
// between them)
// replayed together for all pipelines. A message arrives its one-way
// transfer (the local cluster's boundary, StageBoundarySeconds / 2) after
// both its send and its receive are posted; a batch ends with its last
// receive, the sender going on at once (the workers wait for their sends
// at the step's end). Each compute progresses at the speed the number
// of processes computing at that moment allows (ContentionSlowdown of
// p.cluster.contention; a tensor-parallel stage counts its tp processes).
// Each pipeline then adds its StepTailSeconds; busy: the computes'
// wall-clock seconds. The profile's layer times are those with all its
// processes computing; a worker that waits on its neighbours leaves the
// cores to the others, which T_j's closed form, at the profile's speed
// throughout, cannot see. REQUIRES: as SimulatePipeline's.
PipelineTimes SharedCoresTimes(const Problem& p, const TemplateSet& ts, const Instantiation& inst);

// An SVG with one lane per stage of every pipeline (labelled "pipeline j
// stage i (node n, layers a-b)", class "lane"), forward and backward boxes
// with micro-batch numbers where they fit and a tooltip each, idle time as
// gaps, a time axis in ms, and each pipeline's makespan marked. The
// data-parallel all-reduce is not drawn. Size grows with Σ S·m boxes.
std::string ScheduleSvg(const Problem& p, const TemplateSet& ts, const Instantiation& inst,
                        const BandwidthMatrix* bw);

}  // namespace ob::plan
