// The recomputation modes (recompute.h), torch-free: the planner chooses
// them (plan/problem.h), the plan carries them, the workers apply them.
#pragma once

#include <string>

#include "ob/status.h"

namespace ob::model {

// In the order of what they keep: everything, less, a block's input only
// (and so in the order of what they compute again).
enum class Recompute { kNone = 0, kSelective = 1, kFull = 2 };
inline constexpr Recompute kRecomputeModes[] = {Recompute::kNone, Recompute::kSelective, Recompute::kFull};

// "none", "selective", "full".
const char* RecomputeName(Recompute r);
// The inverse; kUsage naming the word otherwise.
Result<Recompute> ParseRecompute(const std::string& word);

}  // namespace ob::model
