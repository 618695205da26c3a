#include "ob/launch/wire/weight_source.h"

namespace ob::launch {

std::string DescribeSource(const pb::WeightSource& s) {
  std::string from;
  switch (s.kind()) {
    case pb::WeightSource::INITIAL: from = "initial"; break;
    case pb::WeightSource::CHECKPOINT: from = "checkpoint:" + s.checkpoint(); break;
    case pb::WeightSource::SNAPSHOTS: from = "snapshots"; break;
    default: return "no source";
  }
  return from + " step=" + std::to_string(s.step()) + " lineage=" + std::to_string(s.lineage());
}

}  // namespace ob::launch
