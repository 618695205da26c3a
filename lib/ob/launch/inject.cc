#include "ob/launch/inject.h"

#include <sstream>

namespace ob::launch {

Result<Injection> ParseInjection(const std::string& spec, int rank) {
  Injection out;
  std::istringstream items(spec);
  std::string item;
  while (std::getline(items, item, ';')) {
    if (item.find_first_not_of(" \t") == std::string::npos) continue;
    const auto colon = item.find(':'), eq = item.find('=');
    const std::string bad = "--inject: '" + item + "' is not RANK:slow=F, RANK:spin=F, RANK:hang=STEP, RANK:stall=STEP, RANK:nan=STEP, RANK:check=STEP or RANK:park=STEP";
    if (colon == std::string::npos || eq == std::string::npos || eq < colon) return Status::Usage(bad);
    const std::string what = item.substr(colon + 1, eq - colon - 1);
    int r = 0;
    double value = 0;
    try {
      size_t used = 0;
      r = std::stoi(item.substr(0, colon), &used);
      if (used != colon || r < 0) return Status::Usage(bad);
      const std::string v = item.substr(eq + 1);
      value = std::stod(v, &used);
      if (used != v.size()) return Status::Usage(bad);
    } catch (const std::exception&) {
      return Status::Usage(bad);
    }
    if (what == "slow" || what == "spin") {
      if (!(value >= 1)) return Status::Usage("--inject: '" + item + "': the factor must be >= 1");
      if (r == rank) {
        out.slow = value;
        out.spin = what == "spin";
      }
    } else if (what == "hang" || what == "stall" || what == "nan" || what == "check" || what == "park") {
      if (value < 0 || value != static_cast<int64_t>(value)) {
        return Status::Usage("--inject: '" + item + "': the step must be a whole number >= 0");
      }
      if (r == rank) {
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
