#!/usr/bin/env bash
# A hang with nobody dead (design/recovery.md; detection ≤ 5 s): 4 local
# hosts in 2 pipelines of 2 stages, 40 steps on the fixed corpus. Rank 1
# (the last stage of pipeline 0) stalls in step 20 (--inject 1:stall=20):
# its training loop stops while its process and its heartbeat thread go on,
# as a stuck peer under NCCL, where no collective throws. Its peers block in
# their receives and all-reduces, alive too. Asserts:
#  - the master names rank 1 and its host (and no other rank) in one
#    detect line within 5 s of the stall (from the worker's own injection
#    line to the line in events.log), with a worker-hang line and a hang
#    record in the metrics stream;
#  - it tears the generation down (the agents SIGKILL every worker: the
#    stalled one never exits by itself) and restarts in place from the
#    snapshots: the run exits 0 with every step's loss equal to an
#    uninterrupted run's within 1e-4 relative, from step K-1's snapshots;
#  - no process is left behind.
# STALL_FLAGS adds ob-launch flags to the stalled run (e.g. "--hang-timeout
# 600" shows the test failing without the detection).
NAME=launch_stall
source "$(dirname "$0")/../lib/launch.sh"
command -v python3 >/dev/null || skip "no python3"
make_two_by_two
STEPS=40
K=20

reference_run "$STEPS"

# shellcheck disable=SC2086
run_start stall "$STEPS" --inject "1:stall=$K" ${STALL_FLAGS:-}
injected() { grep -q "fault injection: stalling in step $K" "$WORK/stall.err"; }
injected_or_gone() { injected || ! kill -0 "$MASTER_PID" 2>/dev/null; }
wait_for 120 injected_or_gone && injected || fail "rank 1 never stalled: $(tail -3 "$WORK/stall.err")"
t0=$(now_ms)
# The stalled worker is alive and names its host.
pid=$(worker_pid 1)
[ -n "$pid" ] || fail "no worker process for rank 1 while it stalls"
host=$(tr '\0' '\n' < "/proc/$pid/environ" | sed -n 's/^OB_HOST=//p')
[ -n "$host" ] || fail "rank 1's worker names no host"
detected() { grep -q " detect worker rank 1 on host $host hung: " "$WORK/stall/events.log"; }
if ! wait_for 10 detected; then
  kill -0 "$pid" 2>/dev/null && alive="alive" || alive="gone"
  fail "no hang of rank 1 on $host reported within 10 s of the stall (the stalled worker is $alive): $(grep -E ' detect | decide ' "$WORK/stall/events.log" | cut -d' ' -f3- | cut -c1-200)"
fi
t1=$(now_ms)
latency=$((t1 - t0))
line=$(grep -m1 " detect worker rank 1 on host $host hung: " "$WORK/stall/events.log")
[ "$latency" -le 5000 ] || fail "the hang was reported $latency ms after the stall, expected <= 5000: $line"
run_wait
[ "$RC" = 0 ] || fail "exit $RC: $(grep -E ' detect | decide ' "$WORK/stall/events.log" | tail -3; tail -3 "$WORK/stall.err")"
grep -q "trained $STEPS steps: final loss" "$WORK/stall.err" || fail "no closing line"
hangs=$(grep " worker-hang " "$WORK/stall/events.log")
[ "$(grep -c . <<< "$hangs")" = 1 ] && [[ "$hangs" =~ " worker-hang rank=1 host=$host step=$K " ]] \
  || fail "worker-hang lines: $hangs"
[ "$(grep -c " detect " "$WORK/stall/events.log")" = 1 ] \
  || fail "more than the hang detected: $(grep ' detect ' "$WORK/stall/events.log")"
grep -q " decide generation=2 restarting every worker in place" "$WORK/stall/events.log" \
  || fail "no restart in place: $(grep decide "$WORK/stall/events.log")"
rec=$(grep " recovered generation=2 " "$WORK/stall/events.log") || fail "no recovery logged"
# Every rank completed step K-1, and the stalled one's snapshot of it was
# copied in the background before it stalled: nothing is replayed but step
# K (a snapshot marked complete only when the next step settles it would
# send the run back to K-2).
[[ "$rec" =~ " from_step=$((K - 1)) " ]] || fail "restarted from the wrong step: $rec"
grep -q "worker rank 1 on host $host hung: no progress for" "$WORK/stall.err" \
  || fail "the master's log lacks the hang line"
record=$(python3 "$METRICS_PY" hangs "$WORK/stall.pb")
[[ "$record" =~ ^1\ $host\ 1\ $K\  ]] || fail "hang records in the metrics stream: '$record'"
python3 "$METRICS_PY" compare "$WORK/ref.pb" "$WORK/stall.pb" 1e-4 > "$WORK/cmp" || fail "$(cat "$WORK/cmp")"
wait_for 3 no_tagged || fail "processes left behind: $(tagged | xargs -r ps -o pid,args -p)"
echo "$NAME: ${line#* detect }"
echo "$NAME: reported $latency ms after the stall (poll granularity 50 ms); $(cat "$WORK/cmp"); ${rec#* recovered }"
echo "$NAME: ok"
