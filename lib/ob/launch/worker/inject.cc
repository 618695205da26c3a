#include "ob/launch/worker/inject.h"

#include <sstream>

namespace ob::launch {

Result<Injection> ParseInjection(const std::string& spec, int rank, int64_t generation) {
  Injection out;
  std::istringstream items(spec);
  std::string item;
  while (std::getline(items, item, ';')) {
    if (item.find_first_not_of(" \t") == std::string::npos) continue;
    const auto colon = item.find(':'), eq = item.find('=');
    const std::string bad = "--inject: '" + item + "' is not RANK:slow=F, RANK:spin=F, RANK:hang=STEP, RANK:stall=STEP, RANK:nan=STEP, RANK:check=STEP or RANK:park=STEP, each with an optional @GEN";
    if (colon == std::string::npos || eq == std::string::npos || eq < colon) return Status::Usage(bad);
    const std::string what = item.substr(colon + 1, eq - colon - 1);
    int r = 0;
    double value = 0;
    int64_t gen = 1;
    try {
      size_t used = 0;
      r = std::stoi(item.substr(0, colon), &used);
      if (used != colon || r < 0) return Status::Usage(bad);
      std::string v = item.substr(eq + 1);
      if (const auto at = v.find('@'); at != std::string::npos) {
        const std::string g = v.substr(at + 1);
        gen = std::stoll(g, &used);
        if (used != g.size() || gen < 1) return Status::Usage(bad);
        v.resize(at);
      }
      value = std::stod(v, &used);
      if (used != v.size()) return Status::Usage(bad);
    } catch (const std::exception&) {
      return Status::Usage(bad);
    }
    const bool mine = r == rank && gen == generation;
    if (what == "slow" || what == "spin") {
      if (!(value >= 1)) return Status::Usage("--inject: '" + item + "': the factor must be >= 1");
      if (mine) {
        out.slow = value;
        out.spin = what == "spin";
      }
    } else if (what == "hang" || what == "stall" || what == "nan" || what == "check" || what == "park") {
      if (value < 0 || value != static_cast<int64_t>(value)) {
        return Status::Usage("--inject: '" + item + "': the step must be a whole number >= 0");
      }
      if (mine) {
        (what == "hang"    ? out.hang_at
         : what == "stall" ? out.stall_at
         : what == "nan"   ? out.nan_at
         : what == "park"  ? out.park_at
                           : out.check_at) = static_cast<int64_t>(value);
      }
    } else {
      return Status::Usage(bad);
    }
  }
  return out;
}

}  // namespace ob::launch
