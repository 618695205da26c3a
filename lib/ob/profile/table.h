// Human tables of a Profile in the nccl-tests manner: '#' comment lines, a
// header with a units row, fixed-width rows, a summary footer and warnings
// when the figures cannot be trusted. Torch-free, pure.
#pragma once

#include <string>

#include "ob/profile.pb.h"

namespace ob::profile {

std::string FormatProfile(const pb::Profile& p);

}  // namespace ob::profile
