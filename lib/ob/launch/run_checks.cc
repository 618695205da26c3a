#include "ob/launch/run_checks.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "ob/io/file.h"
#include "ob/io/message.h"
#include "ob/log.h"
#include "ob/model/data.h"

namespace ob::launch {

int SequenceLength(const pb::Plan& plan, const model::GptConfig& cfg) {
  const int seq = static_cast<int>(plan.sequence_length());
  return seq > 0 ? seq : cfg.default_seq_len();
}

Result<PlanData> LoadPlanData(const std::string& path) {
  PlanData out;
  out.name = io::DisplayName(path);
  OB_RETURN_IF_ERROR(io::LoadMessage(path, io::kPlanFormatVersion, &out.plan));
  auto loaded = plan::FromProto(out.plan);
  if (!loaded.ok()) return loaded.status().WithContext(out.name);
  out.loaded = std::move(loaded).value();
  out.cfg = model::GptConfig::FromProto(out.plan.model());
  OB_RETURN_IF_ERROR(out.cfg.Validate().WithContext(out.name));
  return out;
}

Result<DataChecked> CheckDataForPlan(const std::string& data, const PlanData& pd, bool data_is_local) {
  if (data == "synthetic") return DataChecked{};
  if (access(data.c_str(), R_OK) != 0) {
    if (!data_is_local) return DataChecked{};  // only on the hosts: they check
    return Status::NoInput(data + ": " + std::strerror(errno));
  }
  const std::string identity = model::FileIdentity(data);
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
  return DataChecked{src.facts().Encode(), src.content_sum(),
                     model::FileIdentity(data) == identity ? identity : std::string()};
}

Status CheckEvalSplit(const std::string& data, double split, const PlanData& pd) {
  if (split <= 0) return Status::Ok();
  model::TokenSource all = model::TokenSource::Synthetic(pd.cfg.vocab_size, 0);
  if (data != "synthetic") {
    if (access(data.c_str(), R_OK) != 0) return Status::Ok();  // only on the hosts: they check
    OB_ASSIGN_OR_RETURN(all, model::TokenSource::Open(data));
  }
  model::TokenSource train = all, eval = all;
  return model::SplitForEval(all, split, SequenceLength(pd.plan, pd.cfg), &train, &eval);
}

Status CheckPrecisionForPlan(const PlanData& pd, const std::string& precision) {
  OB_ASSIGN_OR_RETURN(model::Precision want, model::ParsePrecision(precision));
  const std::string& dtype = pd.plan.profile().dtype();
  if (dtype.empty()) return Status::Ok();  // a profile that does not say
  auto planned = model::ParsePrecision(dtype);
  if (planned.ok() && *planned == want) return Status::Ok();
  return Status::Config(pd.name + ": the plan was made for " +
                         (planned.ok() ? std::string(model::PrecisionName(*planned)) : "'" + dtype + "'") +
                         " (its profile's dtype " + dtype + "), the run asks for " + model::PrecisionName(want) +
                         ": profile and plan again with --dtype " + model::PrecisionDtype(want) +
                         ", or give --precision " +
                         (planned.ok() ? std::string(model::PrecisionName(*planned)) : dtype));
}

}  // namespace ob::launch
