// What every Profile starts with, whichever mode made it: provenance (time,
// host, ob version) and, for layer profiles, the model, dtype, sequence length
// and micro-batch sizes, checked once here. Torch-free, pure but for the clock.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ob/model/config.h"
#include "ob/profile.pb.h"
#include "ob/status.h"

namespace ob::profile {

std::string HostName();

// A Profile with mode and provenance set (created_unix_ms, host, ob_version).
pb::Profile NewProfile(pb::ProfileMode mode);

// A layer Profile (measured or analytic) for model `c`: seq_len 0 means the
// model's context. kConfig if the model is invalid, the sequence is longer
// than the context, or a micro-batch size is not positive.
Result<pb::Profile> NewLayerProfile(const model::GptConfig& c, pb::ProfileMode mode,
                                    const std::string& dtype, int seq_len,
                                    const std::vector<int>& microbatches);

}  // namespace ob::profile
