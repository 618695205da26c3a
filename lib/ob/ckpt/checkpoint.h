// Checkpoint directories: the on-disk layout, the commit protocol, and the
// offline operations ob-ckpt runs on them (list, verify, export, prune).
//
// Under a checkpoint root DIR (ob-formats(5), CHECKPOINTS):
//   DIR/step-<12-digit step>/           a committed checkpoint
//   DIR/step-<12-digit step>.partial/   one being written
//   DIR/latest                          "step-…\n": the one to resume from
//   DIR/step-…/REFUTED                  one line: why it must not be trained from
// Inside a checkpoint: layer-<4-digit layer>.safetensors per global layer,
// part-<rank>.pb per writer while it is being written, and at commit
// manifest.pb with its JSON twin manifest.json.
//
// Protocol. Every writer calls BeginStep, then WriteLayer for each layer it
// holds and WritePart once with the files it wrote; one process (the master)
// calls Commit when all writers are done. Commit checks that every layer is
// there exactly once, writes the manifest, and renames the .partial
// directory to its final name: the rename is the commit. `latest` moves
// after, by rename. Every file is written under a temporary name, fsynced and
// renamed, and directories are fsynced where a rename must survive a crash, so
// a checkpoint killed anywhere in a save is either absent, a .partial, or
// complete, and `latest` always names a complete one (or the previous one).
//
// Thread-safety: no shared state. Writers of one step may run concurrently
// in threads or processes on distinct layers and ranks; Commit, Prune and
// RemovePartials must not race with writers of the same step.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "ob/ckpt/safetensors.h"
#include "ob/manifest.pb.h"
#include "ob/status.h"

namespace ob::ckpt {

// Told how far a long operation has come, in bytes.
using Progress = std::function<void(uint64_t done, uint64_t total)>;

// "step-000000000100".
std::string StepDirName(int64_t step);
// "layer-0007.safetensors".
std::string LayerFileName(int layer);
// Whether a layer file's tensor is an Adam moment ("<name>.exp_avg",
// "<name>.exp_avg_sq"; WriteLayer below), not a weight.
bool IsMoment(const std::string& tensor);
// DIR/step-….partial and DIR/step-….
std::string PartialPath(const std::string& dir, int64_t step);
std::string StepPath(const std::string& dir, int64_t step);

// Creates DIR (and its parents) and DIR/step-….partial. Idempotent: every
// writer of the step calls it. kIoErr when a directory cannot be made.
Status BeginStep(const std::string& dir, int64_t step);

// Writes layer-NNNN.safetensors into the step's .partial directory (see
// safetensors.h for the file and its errors). Tensor names are
// "<layer>.<param>", "<layer>.<param>.exp_avg", "<layer>.<param>.exp_avg_sq",
// with metadata "<layer>.<param>.adam_step"; layer 0's file also holds the
// tied LM weight as "tied" (+ ".exp_avg", ".exp_avg_sq", "tied.adam_step").
// Returns the manifest entry: path relative to the checkpoint directory,
// size, checksum, layers = {layer}. REQUIRES: BeginStep(dir, step).
Result<pb::CheckpointFile> WriteLayer(const std::string& dir, int64_t step, int layer,
                                      const std::vector<TensorView>& tensors,
                                      const std::map<std::string, std::string>& metadata);

// Writes part-<rank>.pb (a Manifest whose files are those this writer wrote;
// step and rank are set here) atomically into the .partial directory.
Status WritePart(const std::string& dir, int64_t step, int rank, const pb::Manifest& part);

// Commits the step, once every writer has called WritePart: merges the
// files of every part-*.pb into `base` (which carries the model, plan, data
// position and creation time; step and num_layers are set here), requires
// layers 0..num_layers-1 each exactly once and every listed file present
// at its size, writes manifest.pb and manifest.json, removes the part files,
// renames the directory to step-… and points `latest` at it. A committed
// step-… of the same step (a run resumed from an older checkpoint saves it
// again) is replaced: moved aside first, removed after. Returns the merged
// manifest. kDataErr "…: incomplete: layers 3, 7 missing" (and for a
// layer given twice, a bad part or a file of the wrong size) with nothing
// committed; kNoInput when no .partial directory exists; kIoErr on I/O.
Result<pb::Manifest> Commit(const std::string& dir, int64_t step, const pb::Manifest& base,
                            int num_layers);

// Removes every .partial directory under DIR: what a crashed run left. Call
// once when a run starts or resumes, before any BeginStep, so that stale
// parts of an earlier attempt at the same step are never merged. Returns the
// paths removed; a missing DIR is not an error.
Result<std::vector<std::string>> RemovePartials(const std::string& dir);

struct CheckpointInfo {
  int64_t step = 0;
  std::string path;     // DIR/step-… or DIR/step-….partial
  uint64_t bytes = 0;   // the manifest's files if complete, else what is on disk
  bool complete = false;
  bool latest = false;  // `latest` names it
  std::string refuted;  // why it was refuted (Refute), "" when it was not
};

// Every step-… and step-….partial directory of DIR, by step. Complete: a
// step-… directory whose manifest loads, is of that step, and lists files
// that all exist at their sizes (checksums are Verify's). kNoInput when DIR
// cannot be read.
Result<std::vector<CheckpointInfo>> List(const std::string& dir);

// The checkpoint to resume from: DIR/<what latest names> if that is complete
// and not refuted, else the newest such one. kNoInput when there is none.
Result<std::string> Latest(const std::string& dir);

// The checkpoint to restore from when its bytes matter (a resume, a
// restart beyond f, a rollback): the newest one of DIR that passes Verify
// and `accept` (when given: "" accepts, anything else is why not, e.g.
// another job's), trying what Latest returns first, then every complete one
// newest first. Each one passed over is in `skipped` with why. kNoInput
// when DIR holds no complete checkpoint; kDataErr when it holds some and
// none qualifies, naming the newest and why it was passed over.
struct Verified {
  std::string path;
  pb::Manifest manifest;
  std::vector<std::string> skipped;  // "DIR/step-…: <why>"
};
Result<Verified> NewestVerified(
    const std::string& dir,
    const std::function<std::string(const pb::Manifest&)>& accept = {});

// Loads CKPT/manifest.pb. kNoInput when CKPT does not exist; kDataErr for a
// missing or damaged manifest, one naming a file twice or by a path that is
// empty, absolute, contains "..", or otherwise leaves the checkpoint
// directory, and one whose files do not hold layers 0..num_layers-1 exactly
// once. Files are not opened (Verify does).
Result<pb::Manifest> LoadManifest(const std::string& ckpt_path);

// Recomputes every file's checksum and parses every safetensors header.
// kDataErr naming the first damaged file: missing, of the wrong size
// (truncated), a checksum mismatch, a bad header, or a path that leaves the
// checkpoint directory (also through a symbolic link); and for a refuted
// checkpoint, before any file is read: "CKPT: refuted: WHY (…)".
Status Verify(const std::string& ckpt_path, const Progress& progress = {});

// Writes one safetensors file holding every layer's weights ("<layer>.<param>"
// and "tied"), and with `with_optimizer` the Adam moments and adam_step
// metadata too. Streams file by file, checking each source file's checksum
// as it goes: a damaged checkpoint is kDataErr and no output is left. `out`
// "-" is standard output.
Status Export(const std::string& ckpt_path, const std::string& out, bool with_optimizer,
              const Progress& progress = {});

// Deletes complete checkpoints older than the newest `keep` complete ones;
// never the newest complete one, the one `latest` names, a .partial (being
// written), an incomplete step directory or a refuted one (left for a person
// to look at; refuted ones are not counted in `keep` either).
// Returns the paths removed. kUsage when keep < 1.
Result<std::vector<std::string>> Prune(const std::string& dir, int keep);

// A committed checkpoint found afterwards to have been trained on data that
// was not the job's (ob-launch: a host's copy of --data still being compared
// with the job's when the checkpoint was committed, which then differed).
// Refute writes CKPT/REFUTED, `why` on one line, atomically, and keeps every
// file of the checkpoint: Verify fails on it, so NewestVerified and every
// resume pass over it, Latest never picks it (nor `latest` names it: it is
// moved to the newest good one, or removed), and Prune leaves it. Removing
// the file takes the verdict back. kNoInput when CKPT is not a committed
// checkpoint; kIoErr.
Status Refute(const std::string& ckpt_path, const std::string& why);
// Why CKPT was refuted (its REFUTED file's line, made printable), or "".
std::string RefutedWhy(const std::string& ckpt_path);
// Ok, or for a refuted CKPT kDataErr "CKPT: refuted: WHY (remove
// CKPT/REFUTED to use it anyway)": what Verify and Export (and so
// ExportHf, which verifies first) say.
Status NotRefuted(const std::string& ckpt_path);

}  // namespace ob::ckpt
