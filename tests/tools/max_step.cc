// max_step FILE: the highest step any rank reported in an ob-launch
// metrics stream (records of completed steps; heartbeats and exit records
// do not count), or -1 when there is none; what tests/lib/metrics.py's
// max-step prints. The process tests poll it every 50 ms while a run
// trains (tests/lib/launch.sh's wait_step): a Python start per poll cost
// the workers under test half a core. The stream may be mid-append: a
// record cut short at its end ends the reading, as it ends metrics.py's.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>

#include "ob/io/records.h"
#include "ob/metrics.pb.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: max_step FILE\n");
    return 64;
  }
  long long best = -1;
  const int fd = ::open(argv[1], O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ob::io::RecordReader in(fd, argv[1]);
    ob::pb::Metrics m;
    for (;;) {
      ob::Result<bool> more = in.Next(&m);
      if (!more.ok() || !*more) break;
      if (m.heartbeat() || m.has_exit()) continue;
      if (static_cast<long long>(m.step()) > best) best = static_cast<long long>(m.step());
    }
    ::close(fd);
  }
  std::printf("%lld\n", best);
  return 0;
}
