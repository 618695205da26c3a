#!/usr/bin/env bash
# What the standby seed saves (lib/ob/launch/agent/standby_seed.h): the CPU a job
# spends starting worker processes. gpt-tiny on 4 local hosts (one worker
# each, 2 pipelines of 2 stages), STEPS steps; a worker is killed with
# SIGKILL at step KILL_STEP, so every host starts a standby, hands it a
# role, starts another, and does it again in the recovery. Each round runs
# the three --standby modes in turn: on (standbys forked from one seed per
# agent), exec (each standby loads LibTorch itself: before the seed) and
# off (no standbys: each worker loads when it starts). Measured per run:
# the CPU seconds of the whole job (user + system of ob-launch and every
# process it waited for: agents, seeds, standbys, workers), its wall
# seconds, and the recovery's kill-to-next-step time from events.log.
# Every worker runs one thread (OpenMP and the BLAS pinned).
#
#   bench/standby.sh [ROUNDS]        (default 3; medians)
#
# Environment: OB_BIN (default build/bin), STEPS (30), KILL_STEP (10).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
TAG=sby$$h
bench_cluster standby "$TAG"
rounds=${1:-3}
steps=${STEPS:-30}
kill_step=${KILL_STEP:-10}
bench_need ob-profile ob-plan ob-launch
[ -x /usr/bin/time ] || { echo "standby.sh: needs /usr/bin/time" >&2; exit 1; }
"$bin/ob-profile" --model gpt-tiny --analytic --gpu h100 --dtype float32 --seq-len 32 -q -o tiny.pb
"$bin/ob-plan" --hosts hosts.txt -g 1 -f 1 -B 8 --gpu-memory 0.1 --overhead-gib 0 -o plan.pb tiny.pb

# one MODE: prints "cpu_s wall_s recovery_ms" (recovery "-" if none logged).
one() {
  local mode=$1 run=run-$1 pid end victim
  rm -rf "$run" "$run.pb"
  OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 /usr/bin/time -f "%U %S %e" -o "$run.time" \
    timeout 300 "$bin/ob-launch" --rsh local --secret-file secret --run-dir "$run" --steps "$steps" \
    --data "$root/tests/data/corpus.txt" --metrics "$run.pb" --standby "$mode" plan.pb hosts.txt \
    > /dev/null 2> "$run.err" &
  pid=$!
  end=$(( $(date +%s) + 240 ))
  until [ "$(max_step "$run.pb")" -ge "$kill_step" ]; do
    [ "$(date +%s)" -lt "$end" ] && kill -0 "$pid" 2>/dev/null || { echo "standby.sh: $mode: no step $kill_step" >&2; exit 1; }
    sleep 0.05
  done
  victim=$(pgrep -x ob-worker-1 | while read -r p; do
    grep -qsa "OB_HOST=${TAG}" "/proc/$p/environ" && echo "$p"; done | head -1)
  [ -n "$victim" ] || { echo "standby.sh: $mode: no worker of rank 1" >&2; exit 1; }
  kill -9 "$victim"
  wait "$pid" || { echo "standby.sh: $mode: ob-launch failed: $(tail -2 "$run.err")" >&2; exit 1; }
  local rec
  rec=$(sed -n 's/.* recovered generation=2 .*total_ms=\([0-9]*\).*/\1/p' "$run/events.log" | head -1)
  awk -v r="${rec:--}" '{ printf "%.2f %.2f %s\n", $1 + $2, $3, r }' "$run.time"
}

modes=(on exec off)
for ((i = 1; i <= rounds; i++)); do
  for m in "${modes[@]}"; do
    echo "$m $(one "$m")" | tee -a results.txt
  done
done
median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
echo "standby.sh: gpt-tiny, 4 hosts x 1 worker, $steps steps, worker killed at step $kill_step, $rounds rounds (medians):"
for m in "${modes[@]}"; do
  cpu=$(awk -v m="$m" '$1 == m { print $2 }' results.txt | median)
  wall=$(awk -v m="$m" '$1 == m { print $3 }' results.txt | median)
  rec=$(awk -v m="$m" '$1 == m && $4 != "-" { print $4 }' results.txt | median)
  printf "  --standby %-4s  CPU %6.1f s  wall %5.1f s  kill to next step %s ms\n" "$m" "$cpu" "$wall" "$rec"
  eval "cpu_$m=$cpu"
done
awk -v a="$cpu_on" -v b="$cpu_exec" -v c="$cpu_off" \
  'BEGIN { printf "  CPU on / exec = %.2f, on / off = %.2f\n", a / b, a / c }'
