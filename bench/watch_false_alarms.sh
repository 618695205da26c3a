#!/usr/bin/env bash
# ob-watch's false alarms under CPU contention (issue 10): the quick-start's
# cluster (4 local hosts, gpt-tiny, 4 data-parallel replicas) trained for
# STEPS steps (default 500) on a machine with fewer cores than workers, its
# metrics read by ob-watch with the default detectors. A healthy run: every
# straggler event is a false alarm. Prints the counts per event kind and
# exits 1 when there is any straggler event. With PEER_WATCH=PATH, the same
# stream also goes through that ob-watch (e.g. an older build) for the
# ratio. Uses build/bin (OB_BIN); scratch in a temporary directory (KEEP=1
# keeps it).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
bench_paths
steps=${1:-500}
work=$(mktemp -d "${TMPDIR:-/tmp}/ob-watch-fa.XXXXXX")
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$work"' EXIT
cd "$work"
printf 'node0\nnode1\nnode2\nnode3\n' > hosts.txt
(umask 077; head -c 32 /dev/urandom | base64 > secret)
"$bin/ob-profile" --model gpt-tiny -q -o tiny.pb
"$bin/ob-plan" --hosts hosts.txt -f 1 --global-batch 16 -o plan.pb tiny.pb
start=$(date +%s)
"$bin/ob-launch" --rsh local --secret-file secret --steps "$steps" --data "$root/README.md" \
  --run-dir run --metrics run.metrics plan.pb hosts.txt 2> launch.err \
  || { tail -3 launch.err; echo "watch_false_alarms: the run failed"; exit 2; }
echo "# $(date -u +%F) $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')), 4 workers, $steps steps in $(( $(date +%s) - start )) s"
count() {  # count WATCH: "KIND N" per event kind of the stream, and the straggler count last
  "$1" --json --clock stream run.metrics 2>/dev/null | python3 -c '
import collections, json, sys
c = collections.Counter(json.loads(l)["kind"] for l in sys.stdin)
print(" ".join("%s=%d" % kv for kv in sorted(c.items())) or "none")
print(c.get("EVENT_STRAGGLER", 0))'
}
mapfile -t ours < <(count "$bin/ob-watch")
echo "ob-watch: events ${ours[0]}; straggler events over $steps steps: ${ours[1]}"
if [ -n "${PEER_WATCH:-}" ]; then
  mapfile -t peer < <(count "$PEER_WATCH")
  echo "peer ($PEER_WATCH): events ${peer[0]}; straggler events: ${peer[1]}"
fi
[ "${ours[1]}" = 0 ]
