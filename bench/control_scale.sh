#!/usr/bin/env bash
# The control plane at many hosts: one master and N agents on this machine
# (--rsh local, --standby off), each agent running one stand-in worker
# (a shell that sleeps: no LibTorch, no training), so that what is measured
# is the master, the agents and their peer probes (peer_probe.h: every
# agent probes every other host once a second). Per N:
#   start_ms      the master's start to its start-workers line (events.log)
#   master_cpu    the master's CPU over WINDOW seconds after that, % of a core
#   agents_cpu    every agent's CPU summed, % of a core (peer probes included)
#   lost_ms       kill -9 of one agent: the master's "detected N ms after its
#                 last message" (events.log)
#   regroup_ms    that verdict to the next generation's start-workers line
# Every process shares this machine's cores: figures for a machine of two
# cores are an upper bound of what a host of a real cluster would see.
#
#   bench/control_scale.sh [N ...]       (default: 64 128 256)
#
# Environment: OB_BIN (default build/bin), WINDOW (5 seconds).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
bench_paths
window=${WINDOW:-5}
bench_need ob-profile ob-plan ob-launch
tag=csc$$h
bench_workdir control-scale "--host ${tag}[0-9]" 9
bench_secret
"$bin/ob-profile" --model gpt-tiny --analytic --gpu h100 --dtype float32 --seq-len 64 -q -o prof.pb
ticks=$(getconf CLK_TCK)
cpu_ticks() {  # cpu_ticks PID...: user + system ticks of each, summed
  local p sum=0 f
  for p in "$@"; do
    f=$(cut -d' ' -f14,15 "/proc/$p/stat" 2>/dev/null) || continue
    sum=$(( sum + ${f% *} + ${f#* } ))
  done
  echo "$sum"
}
ms_of() {  # ms_of EVENTS PATTERN: the "+S.SSSs" offset of the first line matching, in ms
  awk -v pat="$2" '$0 ~ pat { s = $2; sub(/^\+/, "", s); sub(/s$/, "", s); printf "%d\n", s * 1000; exit }' "$1"
}

echo "# ob-launch control plane: one master, N agents and N stand-in workers on $(getconf _NPROCESSORS_ONLN) cores, $(date -u +%F)"
printf '# %6s %9s %11s %11s %8s %11s\n' hosts start_ms master_cpu agents_cpu lost_ms regroup_ms
printf '# %6s %9s %11s %11s %8s %11s\n' "" ms "% of core" "% of core" ms ms
counts=("$@")
[ ${#counts[@]} -gt 0 ] || counts=(64 128 256)
for n1 in "${counts[@]}"; do
  run=run$n1
  : > "hosts$n1.txt"
  for ((i = 1; i <= n1; i++)); do echo "$tag$i" >> "hosts$n1.txt"; done
  "$bin/ob-plan" --hosts "hosts$n1.txt" -g 1 -f 1 -B $((2 * n1)) -o "plan$n1.pb" prof.pb 2> /dev/null
  OB_TEST_WORKER_CMD="exec sleep 60" timeout 90 "$bin/ob-launch" --rsh local --standby off \
    --secret-file secret --run-dir "$run" "plan$n1.pb" "hosts$n1.txt" 2> "$run.err" &
  launcher=$!
  end=$(( $(date +%s) + 60 ))
  until grep -qs start-workers "$run/events.log"; do
    [ "$(date +%s)" -lt "$end" ] || { echo "control_scale.sh: $n1 hosts: no start-workers: $(tail -2 "$run.err")" >&2; exit 1; }
    sleep 0.1
  done
  start=$(ms_of "$run/events.log" start-workers)
  master=$(pgrep -P "$launcher" -x ob-launch)
  mapfile -t agents < <(pgrep -P "$master" -x ob-launch)
  m0=$(cpu_ticks "$master"); a0=$(cpu_ticks "${agents[@]}")
  sleep "$window"
  m1=$(cpu_ticks "$master"); a1=$(cpu_ticks "${agents[@]}")
  master_cpu=$(( (m1 - m0) * 100 / ticks / window ))
  agents_cpu=$(( (a1 - a0) * 100 / ticks / window ))
  victim=$(pgrep -f -- "--host $tag$((n1 / 2)) " | head -1 || true)
  if [ -z "$victim" ] || grep -qs "generation=2" "$run/events.log"; then
    # The processes of N hosts on this machine's few cores starved the
    # master or the agents, which then did what they do when starved.
    echo "# $n1 hosts: the job lost hosts before the kill (this machine overloaded): $(grep -v -e agent- -e start-workers "$run/events.log" | sed -n '1,/detect/p' | tail -1 | cut -c1-160)"
    kill -TERM "$master" 2> /dev/null || true
    wait "$launcher" 2> /dev/null || true
    pkill -9 -f -- "--host ${tag}[0-9]" 2> /dev/null || true
    continue
  fi
  kill -9 "$victim"
  end=$(( $(date +%s) + 30 ))
  until grep -qs "start-workers generation=2" "$run/events.log"; do
    [ "$(date +%s)" -lt "$end" ] || { echo "control_scale.sh: $n1 hosts: no second generation: $(tail -2 "$run.err")" >&2; exit 1; }
    sleep 0.05
  done
  detect=$(ms_of "$run/events.log" " detect ")
  lost=$(sed -n 's/.* detect .*detected \([0-9]*\) ms after its last message.*/\1/p' "$run/events.log" | head -1)
  regroup=$(( $(ms_of "$run/events.log" "start-workers generation=2") - detect ))
  kill -TERM "$master" 2> /dev/null || true
  wait "$launcher" 2> /dev/null || true
  pkill -9 -f -- "--host ${tag}[0-9]" 2> /dev/null || true
  printf '  %6d %9d %11d %11d %8s %11d\n' "$n1" "$start" "$master_cpu" "$agents_cpu" "${lost:--}" "$regroup"
done
