#include "ob/io/fd_limit.h"

#include <sys/resource.h>

#include <algorithm>

namespace ob::io {

FileLimit RaiseOpenFileLimit() {
  rlimit r{};
  if (::getrlimit(RLIMIT_NOFILE, &r) != 0) return {};
  FileLimit out{r.rlim_cur, r.rlim_cur};
  const rlim_t want = std::min<rlim_t>(r.rlim_max, kMaxOpenFiles);
  if (r.rlim_cur == RLIM_INFINITY || r.rlim_cur >= want) return out;
  r.rlim_cur = want;
  if (::setrlimit(RLIMIT_NOFILE, &r) == 0) out.after = want;
  return out;
}

}  // namespace ob::io
