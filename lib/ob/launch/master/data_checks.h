// What the master checks of the training data before any worker starts
// (design: launch): the file fits the plan's model. Torch-free.
#pragma once

#include <string>

#include "ob/launch/wire/plan_data.h"
#include "ob/status.h"

namespace ob::launch {

// The checks the master makes before any worker starts: the data exists (when
// readable here), is a regular file, and fits the plan's model (vocabulary,
// sequence length). kDataErr naming the file and the mismatch. Returns the
// file's model::TokenFileFacts, encoded for WorkerOptions::data_facts, and
// its content sum (TokenSource::content_sum), both "" for synthetic data or
// a file only the hosts can read, and the identity of the file summed
// (model::FileIdentity, the same before and after the pass; "" otherwise).
// With `data_is_local` (every worker runs on this machine), a file this
// process cannot read is kNoInput naming it. With `eval_split` > 0 (the
// fraction --eval-split holds out), kDataErr too when either part of the
// split (model::SplitForEval) is too short for the plan's sequence: checked
// on the source opened for the rest, not by reading the file again.
struct DataChecked {
  std::string facts;     // model::TokenFileFacts::Encode()
  std::string sum;       // model::TokenSource::content_sum()
  std::string identity;  // model::FileIdentity() of the file summed
};
Result<DataChecked> CheckDataForPlan(const std::string& data, const PlanData& plan, bool data_is_local = false,
                                     double eval_split = 0);

}  // namespace ob::launch
