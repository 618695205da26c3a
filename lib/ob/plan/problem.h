// The planner's view of a profile and a cluster (design/plan.md, design/formulas.md): plain arrays
// of per-layer costs at one micro-batch size, the cluster's shape, and the
// cost and memory models every part of ob-plan shares. Torch-free, pure.
//
// Units: seconds, bytes. Layers are planner layers by global index
// (0 = embed, 1..L = blocks, L+1 = head). Thread-safety: values; the
// functions are pure.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ob/model/recompute_mode.h"
#include "ob/profile.pb.h"
#include "ob/schedule/schedule.h"
#include "ob/status.h"

namespace ob::plan {

// One planner layer at the plan's micro-batch size.
struct LayerCost {
  double forward = 0;          // seconds per micro-batch, one GPU
  double backward = 0;
  uint64_t state_bytes = 0;    // weights + gradients + optimizer state
  // Of state_bytes, what a sharded optimizer splits (design/shard.md):
  // AdamW's moments, and in bf16 runs the fp32 master weights.
  uint64_t sharded_bytes = 0;
  uint64_t gradient_bytes = 0; // what the data-parallel all-reduce moves
  uint64_t activation_bytes = 0;  // kept per in-flight micro-batch
  uint64_t output_bytes = 0;   // sent to the next stage per micro-batch (and its gradient back)
  double update = 0;           // once per step: gradient norm and AdamW (measured; 0 if not)
  bool is_block = false;       // tensor parallelism splits blocks (design/formulas.md)
  // Per recomputation mode (index: model::Recompute; model/recompute.h):
  // what the layer keeps per in-flight micro-batch, and what its backward
  // computes again (seconds). [kNone] is activation_bytes and 0; a layer
  // that does not recompute (embed, head) has those in every mode.
  std::array<uint64_t, 3> kept_bytes{};
  std::array<double, 3> recompute_seconds{};
  // The backward's split for the zero-bubble schedules (design/schedule.md):
  // the weight gradients' seconds (W, part of `backward`) and what a
  // micro-batch keeps between its input gradient and W; 0 where the
  // profile has no split.
  double weight_grad = 0;
  uint64_t weight_input_bytes = 0;
};

// Seconds of one collective on a local cluster: a least-squares line of
// the profile's measured all-reduce times on their bytes.
struct CollectiveFit {
  double fixed = 0, per_byte = 0;
  double Seconds(double bytes) const { return fixed + per_byte * bytes; }
};

struct Cluster {
  int nodes = 0;                     // N
  int gpus_per_node = 1;             // g
  uint64_t gpu_memory = 0;           // bytes per GPU
  double link_bytes_per_s = 12.5e9;  // nominal node-to-node bandwidth (100 Gb/s)
  double link_latency = 10e-6;       // seconds
  double intra_bytes_per_s = 200e9;  // inside a node: TP all-reduce bus bandwidth, stage-to-stage transfers
  uint64_t overhead_bytes = 0;       // per GPU: runtime context, communicator buffers
  double overhead_fraction = 0.0;    // of the stage's bytes: fragmentation
  // The nodes are processes of one machine (ob-plan --local, for ob-launch
  // --rsh local): every collective is priced by the profile's own all-reduce
  // times (MakeProblem fits them): tensor-parallel ones by their group's
  // fit, the step's data-parallel ones by the largest group the profile
  // timed that the workers reach.
  bool local = false;
  std::map<int, CollectiveFit> local_fits;  // by group size
  CollectiveFit local_step;
  // The profile's measured slowdown with k processes computing at once, k =
  // 1..n (pb::Device::contention); empty when not measured. With it, a
  // local cluster's iteration is the schedule replayed on shared cores
  // (schedule.h SharedCoresPipelineSeconds).
  std::vector<double> contention;
};

// Everything the planner needs, derived once from a Profile.
struct Problem {
  std::vector<LayerCost> layers;
  Cluster cluster;
  int faults = 0;                  // f
  // The optimizer state split in S (ob-plan --shard-optimizer;
  // design/shard.md): a layer's replicas stand in f + 1 rows of at least
  // S pipelines, each member holding 1/S or less of the layer's
  // sharded_bytes. 1: nothing sharded.
  int shards = 1;
  // The fewest pipelines an instantiation may have: f + 1 rows of S.
  int MinPipelines() const { return (faults + 1) * std::max(1, shards); }
  // " with the optimizer state in S" where sharded, for messages on the
  // pipelines it takes; "" otherwise.
  std::string ShardsText() const {
    return shards > 1 ? " with the optimizer state in " + std::to_string(shards) : std::string();
  }
  // Seconds of layer c's update on a rank holding all of it: AdamW over
  // its share of the state.
  double UpdateSeconds(const LayerCost& c) const { return c.update / std::max(1, shards); }
  // What a rank holding all of layer c keeps of its state.
  double StateBytes(const LayerCost& c) const {
    return static_cast<double>(c.state_bytes) -
           static_cast<double>(c.sharded_bytes) * (1.0 - 1.0 / std::max(1, shards));
  }
  int microbatches = 0;            // M: global batch / micro-batch size
  int microbatch_size = 1;         // sequences per micro-batch
  int sequence_length = 0;
  // Model shape, for the tensor-parallel activation formula of design/formulas.md
  // and the degrees the model splits by: heads, kv heads (0: the heads)
  // and MLP width (0: 4 × n_embd).
  int n_embd = 0, n_head = 0, n_kv_head = 0, mlp_width = 0;
  // Whether tensor parallelism of degree t splits the model (every
  // rank whole heads, whole kv heads, an equal part of the MLP); a
  // Problem without a shape allows any degree.
  bool TpDivides(int t) const {
    const int kv = n_kv_head > 0 ? n_kv_head : n_head, mlp = mlp_width > 0 ? mlp_width : 4 * n_embd;
    return (n_head <= 0 || n_head % t == 0) && (kv <= 0 || kv % t == 0) && (mlp <= 0 || mlp % t == 0);
  }
  // "the model's 32 attention heads (8 key/value heads) and MLP width 14336"
  std::string SplitText() const {
    const int kv = n_kv_head > 0 ? n_kv_head : n_head, mlp = mlp_width > 0 ? mlp_width : 4 * n_embd;
    return "the model's " + std::to_string(n_head) + " attention heads" +
           (kv != n_head ? " (" + std::to_string(kv) + " key/value heads)" : std::string()) + " and MLP width " +
           std::to_string(mlp);
  }
  // The tensor-parallel degree every stage must use (ob-plan --tp); 0: the
  // planner chooses among the degrees g/k the model splits by.
  int tp = 0;
  // Degrees for the templates of some node counts (ob-plan --template-tp
  // NODES=T), ahead of `tp`: replicas of different degrees sum their
  // gradients in pieces (runtime/topology.h).
  std::map<int, int> tp_at;
  // Also consider mixed templates (ob-plan --mixed-stages): stages of
  // different degrees, in different numbers per node (templates.h).
  bool mixed_stages = false;
  // The recomputation modes a stage may run (ob-plan --recompute), in the
  // order of their time: each stage runs the first that fits (StageMode).
  // MakeProblem: none only; every mode for --recompute auto.
  std::vector<model::Recompute> recompute_modes{model::Recompute::kNone};
  // Whether the profile has each block's costs in every mode (profiles
  // made before them do not: then none alone).
  bool has_recompute_costs = false;
  // The schedules a template may run (ob-plan --schedule), the first
  // preferred on a tie; ChooseSchedule takes the fastest that fits.
  // MakeProblem: 1F1B only.
  std::vector<const schedule::Schedule*> schedules{&schedule::OneFOneB()};
  int num_layers() const { return static_cast<int>(layers.size()); }
};

// How one stage runs: layers [first, last] on `gpus` GPUs of one node with
// tensor parallelism `tp` (== gpus).
struct StageShape {
  int first = 0, last = 0;
  int tp = 1;
  // Position of its node within the pipeline; read through
  // Template::NodeOf, which derives it for uniform templates.
  int node = 0;
  // What its blocks keep for the backward (StageMode chooses it).
  model::Recompute recompute = model::Recompute::kNone;
};

// Compute time of one micro-batch through layers [first, last] (forward +
// backward) with tensor parallelism tp: compute / tp plus the all-reduces
// over tp GPUs: 4 per block and 1 each for the embedding and the head of
// b·s·h activations, and the head's cross-entropy's 3 of b·s, back to back,
// as one (design/formulas.md).
// In recomputation mode `r`, the recomputed forwards are added (a full
// block's issues its 2 forward all-reduces again).
double StageComputeSeconds(const Problem& p, int first, int last, int tp,
                           model::Recompute r = model::Recompute::kNone);
double StageComputeSeconds(const Problem& p, const StageShape& s);
// Forward + backward transfer across the boundary after `last` over a link.
double BoundarySeconds(const Problem& p, int last, double bytes_per_s, double latency);
// The same over the cluster's nominal links: node to node when the next
// stage is on another node, else inside the node at intra_bytes_per_s (a
// boundary between two stages of one node never touches the network). On a
// local cluster, twice the profile's two-rank collective fit of the bytes.
double StageBoundarySeconds(const Problem& p, int last, bool crosses_node);
// Peak bytes per GPU of a stage holding `in_flight` micro-batches (1F1B:
// stage k of S holds S − k), overheads included. In recomputation mode
// `r` each micro-batch keeps what r keeps, and one block's activations in
// full exist again while its backward recomputes them (once, not per
// micro-batch).
uint64_t StageMemoryBytes(const Problem& p, int first, int last, int tp, int in_flight,
                          model::Recompute r = model::Recompute::kNone);
// The same for a schedule's peaks (schedule::Peaks): `held` micro-batches'
// activations and what W reads of the others, at its worst moment.
uint64_t StageMemoryBytes(const Problem& p, int first, int last, int tp, const schedule::Held& held,
                          model::Recompute r);
// The same for a stage of several chunks (schedule.h, Chain): `chunks[c]`
// its chunk c's layers (tp and recompute each's), `order` the stage's ops
// in its schedule's order. Every chunk's weights, and at the order's worst
// moment the activations of its micro-batches before their B and what W
// reads of those past it, each chunk's own size (schedule::PeakBytes);
// one recomputing block's activations in full again. The other forms' for
// one chunk, up to a byte a micro-batch (each chunk's bytes are whole).
uint64_t StageMemoryBytes(const Problem& p, const std::vector<StageShape>& chunks,
                          const std::vector<schedule::Op>& order);
// The fastest of p.recompute_modes in which the stage fits (nullopt: none).
std::optional<model::Recompute> StageMode(const Problem& p, int first, int last, int tp, int in_flight);
bool StageFits(const Problem& p, int first, int last, int tp, int in_flight);
// Data-parallel all-reduce of `gradient_bytes` per node across pipelines:
// ring bandwidth term at its bound 2·G/B plus a tree latency term for N nodes.
double AllReduceSeconds(const Problem& p, uint64_t gradient_bytes);
// Host memory of a parameter's snapshots (design/formulas.md): 3 copies (the last
// two steps and one a checkpoint may hold) of its fp32 weight and both
// AdamW moments, whatever the training precision.
constexpr uint64_t kSnapshotBytesPerParameter = 3 * 12;
// The gradient buckets the workers fill (runtime: at most 8 MiB each).
constexpr uint64_t kGradientBucketBytes = uint64_t{8} << 20;

// Builds the Problem from a profile. kDataErr for an empty profile, missing
// costs at `microbatch_size`, or zero/negative/non-finite times (naming the
// layer); kConfig for unusable cluster options.
Result<Problem> MakeProblem(const pb::Profile& profile, const Cluster& cluster, int faults,
                            int global_batch, int microbatch_size);

}  // namespace ob::plan
