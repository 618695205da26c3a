#!/usr/bin/env bash
# Slow is not dead, measured (issue 54): RUNS runs (default 10) of the
# quick-start's job widened to 8 workers (8 local hosts of one slot,
# gpt-tiny, f = 1) for STEPS steps (default 100) on this machine's cores,
# with a CPU hog beside them (one `nice -n 0` busy loop per run), and every
# detection counted: the master's (a detect line in events.log: a hang, a
# stuck start, a lost host) and ob-watch's with its default detectors
# (hang, crash and straggler events). A healthy run has none: each is a
# false alarm. Then the recall it must keep: tests/process/launch_stall.sh
# on a quiet machine (its injected stall found within 5 s; the latency it
# prints). Exits 1 on any false alarm or a missed stall.
#
#   bench/false_alarms.sh [RUNS [STEPS]]
set -euo pipefail
source "$(dirname "$0")/lib.sh"
runs=${1:-10}
steps=${2:-100}
bench_cluster false-alarms fa
bench_need ob-profile ob-plan ob-launch ob-watch
for i in 5 6 7 8; do echo "fa$i" >> hosts.txt; done
"$bin/ob-profile" --model gpt-tiny --threads 1 --concurrency 8 -k 20 -q -o tiny.pb
"$bin/ob-plan" --local --hosts hosts.txt -f 1 --global-batch 16 -q -o plan.pb tiny.pb
echo "# $(date -u +%F), $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')):" \
  "$runs runs of 8 workers x $steps steps beside a CPU hog"
echo "# run  seconds  master detections  ob-watch hang/crash/straggler events"
alarms=0
for ((r = 1; r <= runs; r++)); do
  nice -n 0 bash -c 'while :; do :; done' &
  hog=$!
  start=$(now_ms)
  rc=0
  "$bin/ob-launch" --rsh local --secret-file secret --steps "$steps" --data "$root/README.md" \
    --run-dir "run$r" --metrics "run$r.metrics" plan.pb hosts.txt 2> "run$r.err" || rc=$?
  kill "$hog" 2> /dev/null || true
  wait "$hog" 2> /dev/null || true
  took=$(( ($(now_ms) - start) / 1000 ))
  master=$(grep -c ' detect ' "run$r/events.log" || true)
  watch=$("$bin/ob-watch" --json --clock stream "run$r.metrics" 2> /dev/null | python3 -c '
import json, sys
kinds = [json.loads(l)["kind"] for l in sys.stdin]
print(sum(k in ("EVENT_HANG", "EVENT_CRASH", "EVENT_STRAGGLER") for k in kinds))')
  printf '%5d  %7d  %17d  %s\n' "$r" "$took" "$master" "$watch"
  if [ "$rc" != 0 ] || [ "$master" != 0 ] || [ "$watch" != 0 ]; then
    alarms=$((alarms + 1))
    grep ' detect ' "run$r/events.log" | cut -d' ' -f3- | cut -c1-200 | sed 's/^/#   /' || true
    [ "$rc" = 0 ] || echo "#   exit $rc: $(tail -1 "run$r.err")"
  fi
done
echo "# runs with a false alarm: $alarms of $runs"
# Recall: the injected stall, on a quiet machine (no hog).
stall=$(OB_BIN=$bin bash "$root/tests/process/launch_stall.sh" 2>&1) || {
  echo "# recall: launch_stall FAILED: $(tail -2 <<< "$stall")"
  exit 1
}
echo "# recall: the stall $(grep -m1 -o 'reported [0-9]* ms after the stall' <<< "$stall") (target <= 5000)"
[ "$alarms" = 0 ]
