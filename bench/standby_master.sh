#!/usr/bin/env bash
# The master's host against another host (issue 61, acceptance 2): four
# hosts in network namespaces, the master in the first, its standby master
# on the second (tests/process/launch_standby_master.sh); at step 15 every
# process of one host's namespace is SIGKILLed and its link goes down: the
# master's host (the standby takes over), or the last host (the master
# recovers in place). Prints each run's time from the kill to the next
# completed step, ROUNDS rounds of each (default 3). Needs root.
#
#   bench/standby_master.sh [ROUNDS]
set -euo pipefail
source "$(dirname "$0")/lib.sh"
bench_paths
rounds=${1:-3}
for victim in master other; do
  for r in $(seq 1 "$rounds"); do
    line=$(VICTIM=$victim OB_BIN="$bin" OB_SOURCE_DIR="$root" bash "$root/tests/process/launch_standby_master.sh" 2>&1 \
      | grep "from the kill to the next completed step") || { echo "# $victim round $r failed" >&2; exit 1; }
    echo "$victim round $r: ${line#*: from the kill to the next completed step: }"
  done
done
