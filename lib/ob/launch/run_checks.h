// What the master checks before any worker starts, and what the workers
// read of the plan the same way (design §5): torch-free, so that ob-launch
// itself, the master and the agents, does not load LibTorch (only
// ob-launch-worker does).
#pragma once

#include <string>

#include "ob/model/config.h"
#include "ob/plan.pb.h"
#include "ob/plan/plan_io.h"
#include "ob/status.h"

namespace ob::launch {

// A plan file as the master checks it: the message, its loaded form and its
// model (validated), read once (a plan piped in, "-" or a FIFO, can be read
// only once, and a file replaced between two reads would be checked as one
// plan and run as another). Errors name the file.
struct PlanData {
  std::string name;  // the file, as messages name it (io::DisplayName)
  pb::Plan plan;
  plan::LoadedPlan loaded;
  model::GptConfig cfg;
};
Result<PlanData> LoadPlanData(const std::string& path);

// The tokens a sample holds: the plan's sequence length, or the model's
// positions when the plan leaves it unset.
int SequenceLength(const pb::Plan& plan, const model::GptConfig& cfg);

// The plan was profiled for one precision (Profile.dtype, "float32" or
// "bfloat16"); a run in another is refused: kConfig naming the plan file
// and both (kConfig, exit 78). `precision` as ob-launch --precision takes it.
Status CheckPrecisionForPlan(const PlanData& plan, const std::string& precision);

// The checks the master makes before any worker starts: the data exists (when
// readable here), is a regular file, and fits the plan's model (vocabulary,
// sequence length). kDataErr naming the file and the mismatch. Returns the
// file's model::TokenFileFacts, encoded for WorkerOptions::data_facts, and
// its content sum (TokenSource::content_sum), both "" for synthetic data or
// a file only the hosts can read, and the identity of the file summed
// (model::FileIdentity, the same before and after the pass; "" otherwise).
// With `data_is_local` (every worker runs on this machine), a file this
// process cannot read is kNoInput naming it.
struct DataChecked {
  std::string facts;     // model::TokenFileFacts::Encode()
  std::string sum;       // model::TokenSource::content_sum()
  std::string identity;  // model::FileIdentity() of the file summed
};
Result<DataChecked> CheckDataForPlan(const std::string& data, const PlanData& plan, bool data_is_local = false);

// With `split` > 0 and `data` readable here: kDataErr when either part of
// the split (model::SplitForEval) is too short for the plan's sequence.
Status CheckEvalSplit(const std::string& data, double split, const PlanData& plan);

}  // namespace ob::launch
