// ob-ckpt: Inspect, verify, export and prune asynchronous checkpoints.
// Not built yet: see the issue that introduces it. The common flags
// (--help, --version, -o, --json) already behave as in every ob tool.
#include "ob/cli/cli.h"

int main(int argc, char** argv) {
  return ob::cli::Main(argc, argv,
                       {"ckpt", "Inspect, verify, export and prune asynchronous checkpoints.",
                        [](CLI::App&) {},
                        [](const ob::cli::CommonOptions&) {
                          return ob::Status::Internal("not implemented yet in this version of ob");
                        }});
}
