#include "ob/profile/profile.h"

#include <unistd.h>

#include <chrono>

#include "ob/build_info.h"
#include "ob/clock.h"

namespace ob::profile {

std::string HostName() {
  char host[256] = {0};
  if (gethostname(host, sizeof host - 1) != 0) return "?";
  return host;
}

pb::Profile NewProfile(pb::ProfileMode mode) {
  pb::Profile p;
  p.set_mode(mode);
  p.set_created_unix_ms(UnixMs());
  p.set_host(HostName());
  p.set_ob_version(OB_VERSION);
  return p;
}

Result<pb::Profile> NewLayerProfile(const model::GptConfig& c, pb::ProfileMode mode,
                                    const std::string& dtype, int seq_len,
                                    const std::vector<int>& microbatches) {
  OB_RETURN_IF_ERROR(c.Validate());
  const int s = c.seq_len_or_default(seq_len);
  if (s > c.n_positions)
    return Status::Config("--seq-len " + std::to_string(s) + " exceeds the model's context " +
                          std::to_string(c.n_positions));
  if (microbatches.empty()) return Status::Config("no micro-batch sizes given");
  pb::Profile p = NewProfile(mode);
  *p.mutable_model() = c.ToProto();
  p.set_dtype(dtype);
  p.set_sequence_length(s);
  for (int b : microbatches) {
    if (b < 1) return Status::Config("micro-batch sizes must be positive");
    p.add_microbatch_sizes(b);
  }
  return p;
}

}  // namespace ob::profile
