#include "ob/launch/master/data_checks.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "ob/log.h"
#include "ob/model/data.h"

namespace ob::launch {

namespace {

// Either part of --eval-split's split of `all` too short for the plan's
// sequence: kDataErr (model::SplitForEval's).
Status CheckEvalSplit(const model::TokenSource& all, double split, const PlanData& pd) {
  if (split <= 0) return Status::Ok();
  model::TokenSource train = all, eval = all;
  return model::SplitForEval(all, split, SequenceLength(pd.plan, pd.cfg), &train, &eval);
}

}  // namespace

Result<DataChecked> CheckDataForPlan(const std::string& data, const PlanData& pd, bool data_is_local,
                                     double eval_split) {
  if (data == "synthetic") {
    OB_RETURN_IF_ERROR(CheckEvalSplit(model::TokenSource::Synthetic(pd.cfg.vocab_size, 0), eval_split, pd));
    return DataChecked{};
  }
  // A Megatron prefix's .bin, a blend's files.
  for (const std::string& file : model::DataFiles(data)) {
    if (access(file.c_str(), R_OK) != 0) {
      if (!data_is_local) return DataChecked{};  // only on the hosts: they check
      return Status::NoInput(file + ": " + std::strerror(errno));
    }
  }
  const std::string file = model::DataFile(data);  // a blend's is no file: no identity
  const std::string identity = model::FileIdentity(file);
  OB_ASSIGN_OR_RETURN(model::TokenSource src, model::TokenSource::Open(data));
  Status st = src.Check(SequenceLength(pd.plan, pd.cfg), pd.cfg.vocab_size);
  if (!st.ok())
    return Status::DataErr(st.message() + " (the plan's model is " + pd.cfg.name + ")");
  if (src.format() == model::TokenFormat::kText && pd.cfg.vocab_size > 256) {
    // Legal, and seldom meant: GPT-2 trained (or fine-tuned) on byte ids.
    OB_LOG(Warn) << data << ": not a token file, so read as bytes (ids 0-255), while the plan's model has a "
                 << "vocabulary of " << pd.cfg.vocab_size
                 << "; for its tokenizer's ids, make a token file with ob-data tokenize";
  }
  OB_RETURN_IF_ERROR(CheckEvalSplit(src, eval_split, pd));
  return DataChecked{src.facts().Encode(), src.content_sum(),
                     model::FileIdentity(file) == identity ? identity : std::string()};
}

}  // namespace ob::launch
