#include "ob/launch/wire/plan_data.h"

#include "ob/io/file.h"
#include "ob/io/message.h"

namespace ob::launch {

int SequenceLength(const pb::Plan& plan, const model::GptConfig& cfg) {
  return cfg.seq_len_or_default(static_cast<int>(plan.sequence_length()));
}

Result<PlanData> LoadPlanData(const std::string& path) {
  pb::Plan plan;
  OB_RETURN_IF_ERROR(io::LoadMessage(path, io::kPlanFormatVersion, &plan));
  return PlanDataOf(std::move(plan), io::DisplayName(path));
}

Result<PlanData> PlanDataOf(pb::Plan plan, const std::string& name) {
  PlanData out;
  out.name = name;
  out.plan = std::move(plan);
  auto loaded = plan::FromProto(out.plan);
  if (!loaded.ok()) return loaded.status().WithContext(out.name);
  out.loaded = std::move(loaded).value();
  out.cfg = model::GptConfig::FromProto(out.plan.model());
  OB_RETURN_IF_ERROR(out.cfg.Validate().WithContext(out.name));
  return out;
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
