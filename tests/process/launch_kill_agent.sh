#!/usr/bin/env bash
# kill -9 of one agent: the master notices within a second, stops the other
# agents and exits 75 naming the host, well within 5 s; no process survives
# (the dead agent's workers die with it: PR_SET_PDEATHSIG). Then kill -9 of
# one worker: exit 75 naming its rank and host.
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
wait "$MASTER_PID"; rc=$?
MASTER_PID=""
elapsed=$(( $(now_ms) - t0 ))
echo "launch_kill_agent: master exited $rc after $elapsed ms"
[ "$rc" = 75 ] || fail "exit $rc, expected 75: $(tail -3 "$WORK/err")"
[ "$elapsed" -le 5000 ] || fail "master took $elapsed ms (> 5000) to exit"
tail -1 "$WORK/err" | grep -q "^ob-launch: lost the agent on host ${TAG}h3 " \
  || fail "last line does not name the host: $(tail -1 "$WORK/err")"
tail -1 "$WORK/err" | grep -Eq 'detected [0-9]+ ms' || fail "no detection latency: $(tail -1 "$WORK/err")"
grep -q "detect lost the agent on host ${TAG}h3" "$WORK/run/events.log" || fail "events.log lacks the detection"
grep -q "decide lost hosts ${TAG}h3: " "$WORK/run/events.log" || fail "events.log lacks the decision"
wait_for 2 no_tagged || fail "orphans: $(tagged | xargs -r ps -o pid,args -p)"

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
wait "$MASTER_PID"; rc=$?
MASTER_PID=""
elapsed=$(( $(now_ms) - t0 ))
echo "launch_kill_agent: after kill -9 of worker rank 2, master exited $rc after $elapsed ms"
[ "$rc" = 75 ] || fail "worker kill: exit $rc, expected 75: $(tail -3 "$WORK/err2")"
[ "$elapsed" -le 5000 ] || fail "master took $elapsed ms (> 5000) to exit"
tail -1 "$WORK/err2" | grep -Eq "^ob-launch: worker rank 2 on host ${TAG}h3 failed \(killed by signal 9\), detected in [0-9]+ ms" \
  || fail "last line does not name the rank: $(tail -1 "$WORK/err2")"
wait_for 2 no_tagged || fail "orphans: $(tagged | xargs -r ps -o pid,args -p)"
echo "launch_kill_agent: ok"
