// The worker role of ob-launch (design/launch.md): one process per pipeline stage,
// started by an agent as `ob-launch-worker --worker --rank R --generation G ...`.
// It reaches the job's rendezvous store through the socket its agent
// passes as $OB_STORE_FD (store_client.h; the agent relays to the master,
// store_relay.h), reads generation G there (control.proto's Generation
// under store_keys.h's GenerationKey: the plan with this generation's
// instantiation, and the fetch list), forms its groups through it (a
// RelayStore under the generation's prefix), builds its stage (lib/ob/runtime),
// trains, and writes one delimited ob.pb.Metrics record per step to stdout,
// which its agent relays to the master.
//
// Restarts (design/recovery.md): the worker keeps its snapshots in the memfd its
// agent passes as $OB_SNAPSHOT_FD (runtime/snapshot_arena.h). Every worker
// of a generation publishes which snapshots it holds; they agree on S, the
// least newest step among them, and each restores the state after S from
// its own snapshot and from peers (StageWorker::Restore), then trains from
// step S + 1. With no snapshot anywhere it starts from the initial weights.
// A generation that names a checkpoint (Generation.resume) starts from it
// instead: each worker reads the layers of its stage, whatever layout saved
// them, and trains from the step after.
//
// Checkpoints: with ckpt_dir, the worker's snapshot of the last step, of
// every ckpt_every-th step (> 0) and of the step the master asks for is
// written in the background (runtime/checkpointer.h);
// each rank reports its finished part in its Metrics, and the master
// commits the checkpoint when every rank's part is in.
//
// Torch-free header. Failure: a bad plan or data → kDataErr/kConfig before
// any collective; no $OB_STORE_FD → kConfig; a peer lost mid-step →
// kUnavailable (the agent reports the exit and the master decides).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "ob/status.h"

namespace ob::launch {

struct WorkerOptions {
  int rank = 0;
  int world = 0;               // checked against the plan's rank count
  uint64_t generation = 1;     // reads its plan from the store's GenerationKey(generation)
  int64_t steps = 0;
  std::string data = "synthetic";  // token file, text file, or "synthetic"
  // model::TokenFileFacts::Encode() of `data` as the master found it: a
  // worker whose copy matches skips the pass over the whole file. "": scan.
  std::string data_facts;
  double lr = 1e-3;
  int64_t warmup_steps = 0;
  // The optimizer and schedule (model::TrainOptions; ob-launch(1)).
  double min_lr = 0.0;
  std::string lr_schedule = "cosine";  // or "constant"
  double weight_decay = 0.1;
  double beta1 = 0.9, beta2 = 0.95;
  double eps = 1e-8;
  double clip_norm = 1.0;      // 0: no clipping
  // Evaluation (ob-launch(1) --eval-*): a held-out token file, or the last
  // eval_split of `data`'s tokens (training then samples only the rest);
  // after every eval_every steps (0: after the last step only) the mean
  // loss over eval_batches fixed global batches of it.
  std::string eval_data;
  double eval_split = 0;
  int64_t eval_every = 0;
  int eval_batches = 1;
  uint64_t seed = 1234;        // model initialisation and data sampling
  std::string host;            // for the Metrics records
  double timeout_s = 60;       // bound on rendezvous and every collective
  std::string ckpt_dir;        // checkpoints (runtime/checkpointer.h); "" = none
  int64_t ckpt_every = 0;      // save after every that many steps (0: the last only)
  // devices.h: "auto" (CUDA when this process sees a GPU), "cpu" or
  // "cuda" (then cuda:0: the agent made our GPU the only one visible); and
  // "fp32", "bf16" or "" (the device's default).
  std::string device = "auto";
  std::string precision;
};

// One line for logs and --version -v: "device cpu, backend gloo, precision
// fp32, 2 threads, LibTorch 1.13.0" (with the GPU's name and CUDA/NCCL versions on CUDA).
// `device` and `precision` resolved (devices.h).
std::string DescribeRuntime(const std::string& device, const std::string& precision);

// The GPUs this process sees (0 in a CPU build).
int VisibleGpus();

Status RunWorker(const WorkerOptions& opts);

// Runs a tiny forward, backward and AdamW step so that LibTorch's lazy
// start-up (autograd's threads, the allocator, kernels' first use) is paid
// by a standby worker while it waits for a role, not by a recovery. With
// `cuda` and a GPU visible, also on cuda:0: the CUDA context is created and
// a first kernel run.
void WarmUpLibTorch(bool cuda = false);

}  // namespace ob::launch
