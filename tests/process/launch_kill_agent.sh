#!/usr/bin/env bash
# Detection with stand-in workers (sleep): kill -9 of one agent is noticed
# within a second, named, and decided (generation 2 on the survivors) with
# the dead agent's workers gone with it (PR_SET_PDEATHSIG); kill -9 of one
# worker is noticed, named with its rank, and every worker is restarted.
# SIGTERM then stops everything: exit 0, no process left. (Training through
# these failures: launch_recover.sh.)
NAME=launch_kill_agent
source "$(dirname "$0")/../lib/launch.sh"
make_cluster 4

OB_TEST_WORKER_CMD="exec sleep 60" timeout 30 "$OB_BIN/ob-launch" --rsh local \
  --secret-file "$WORK/secret" --run-dir "$WORK/run" "$WORK/plan.pb" "$WORK/hosts.txt" \
  2> "$WORK/err" &
MASTER_PID=$!
workers_up() { grep -q start-workers "$WORK/run/events.log" 2>/dev/null && [ "$(count_workers)" -ge 4 ]; }
wait_for 10 workers_up || fail "workers did not start: $(tail -3 "$WORK/err")"

victim=$(pgrep -f -- "--agent .*--host ${TAG}h3( |$)" | head -1)
[ -n "$victim" ] || fail "no agent process for ${TAG}h3"
t0=$(now_ms)
kill -9 "$victim"
decided() { grep -q " decide generation=2 " "$1" 2>/dev/null; }
wait_for 3 decided "$WORK/run/events.log" || fail "no decision within 3 s: $(tail -3 "$WORK/err")"
line=$(grep -m1 " detect " "$WORK/run/events.log")
[[ "$line" == *"detect lost the agent on host ${TAG}h3 "* ]] || fail "detection does not name the host: $line"
[[ "$line" =~ detected\ ([0-9]+)\ ms ]] || fail "no detection latency: $line"
[ "${BASH_REMATCH[1]}" -le 1000 ] || fail "detected after ${BASH_REMATCH[1]} ms"
grep -q "decide generation=2 lost hosts ${TAG}h3; re-instantiated" "$WORK/run/events.log" \
  || fail "events.log lacks the decision: $(grep decide "$WORK/run/events.log")"
echo "launch_kill_agent: agent kill detected and decided in $(( $(now_ms) - t0 )) ms"
kill -TERM "$MASTER_PID"
wait "$MASTER_PID"; rc=$?; MASTER_PID=""
[ "$rc" = 0 ] || fail "SIGTERM after the recovery: exit $rc: $(tail -3 "$WORK/err")"
wait_for 3 no_tagged || fail "orphans: $(tagged | xargs -r ps -o pid,args -p)"

OB_TEST_WORKER_CMD="exec sleep 60" timeout 30 "$OB_BIN/ob-launch" --rsh local \
  --secret-file "$WORK/secret" --run-dir "$WORK/run2" "$WORK/plan.pb" "$WORK/hosts.txt" \
  2> "$WORK/err2" &
MASTER_PID=$!
workers_up2() { grep -q start-workers "$WORK/run2/events.log" 2>/dev/null && [ "$(count_workers)" -ge 4 ]; }
wait_for 10 workers_up2 || fail "workers did not start: $(tail -3 "$WORK/err2")"
worker=$(grep -lsa "OB_RANK=2" $(grep -lsa "OB_HOST=$TAG" /proc/[0-9]*/environ) | cut -d/ -f3 | head -1)
[ -n "$worker" ] || fail "no worker with rank 2"
t0=$(now_ms)
kill -9 "$worker"
wait_for 3 decided "$WORK/run2/events.log" || fail "no decision within 3 s: $(tail -3 "$WORK/err2")"
grep -Eq "detect worker rank 2 on host ${TAG}h3 failed \(killed by signal 9\), detected in [0-9]+ ms" \
  "$WORK/run2/events.log" || fail "detection does not name the rank: $(grep detect "$WORK/run2/events.log")"
grep -q "decide generation=2 restarting every worker in place" "$WORK/run2/events.log" \
  || fail "no restart: $(grep decide "$WORK/run2/events.log")"
echo "launch_kill_agent: worker kill detected and decided in $(( $(now_ms) - t0 )) ms"
kill -TERM "$MASTER_PID"
wait "$MASTER_PID"; rc=$?; MASTER_PID=""
[ "$rc" = 0 ] || fail "SIGTERM after the restart: exit $rc: $(tail -3 "$WORK/err2")"
wait_for 2 no_tagged || fail "orphans: $(tagged | xargs -r ps -o pid,args -p)"
echo "launch_kill_agent: ok"
