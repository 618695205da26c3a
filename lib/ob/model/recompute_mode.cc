// The recomputation modes' names (see recompute_mode.h).
#include "ob/model/recompute_mode.h"

namespace ob::model {

const char* RecomputeName(Recompute r) {
  switch (r) {
    case Recompute::kSelective: return "selective";
    case Recompute::kFull: return "full";
    default: return "none";
  }
}

Result<Recompute> ParseRecompute(const std::string& word) {
  for (Recompute r : kRecomputeModes) {
    if (word == RecomputeName(r)) return r;
  }
  return Status::Usage("recomputation '" + word + "': expected none, selective or full");
}

}  // namespace ob::model
