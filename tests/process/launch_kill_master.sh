#!/usr/bin/env bash
# kill -9 of the master: every agent and worker is gone within
# --master-timeout + 2 s, on every host. Then a master that hangs (SIGSTOP):
# the agents notice its silence and take their workers down with them.
NAME=launch_kill_master
source "$(dirname "$0")/../lib/launch.sh"
make_cluster 4
TIMEOUT=1

OB_TEST_WORKER_CMD="exec sleep 60" timeout 30 "$OB_BIN/ob-launch" --rsh local \
  --master-timeout "$TIMEOUT" --secret-file "$WORK/secret" --run-dir "$WORK/run" \
  "$WORK/plan.pb" "$WORK/hosts.txt" 2> "$WORK/err" &
MASTER_PID=$!
workers_up() { grep -q start-workers "$WORK/run/events.log" 2>/dev/null && [ "$(count_workers)" -ge 4 ]; }
wait_for 10 workers_up || fail "workers did not start: $(tail -3 "$WORK/err")"
# The real master is ob-launch itself, not the `timeout` wrapper.
master=$(pgrep -P "$MASTER_PID" -f ob-launch | head -1)
[ -n "$master" ] || fail "cannot find the master process"
t0=$(now_ms)
kill -9 "$master"
wait_for $((TIMEOUT + 2)) no_tagged || fail "left after $((TIMEOUT + 2)) s: $(tagged | xargs -r ps -o pid,args -p)"
echo "launch_kill_master: everything gone $(( $(now_ms) - t0 )) ms after kill -9 of the master"
wait "$MASTER_PID" 2>/dev/null
MASTER_PID=""

# A hung master sends no end of file and no reset: only silence.
OB_TEST_WORKER_CMD="exec sleep 60" timeout 30 "$OB_BIN/ob-launch" --rsh local \
  --master-timeout "$TIMEOUT" --secret-file "$WORK/secret" --run-dir "$WORK/run2" \
  "$WORK/plan.pb" "$WORK/hosts.txt" 2> "$WORK/err2" &
MASTER_PID=$!
workers_up2() { grep -q start-workers "$WORK/run2/events.log" 2>/dev/null && [ "$(count_workers)" -ge 4 ]; }
wait_for 10 workers_up2 || fail "workers did not start: $(tail -3 "$WORK/err2")"
master=$(pgrep -P "$MASTER_PID" -f ob-launch | head -1)
t0=$(now_ms)
kill -STOP "$master"
wait_for $((TIMEOUT + 2)) no_tagged || fail "left $((TIMEOUT + 2)) s after SIGSTOP of the master: $(tagged | xargs -r ps -o pid,args -p)"
echo "launch_kill_master: everything gone $(( $(now_ms) - t0 )) ms after SIGSTOP of the master"
grep -q "master has been silent" "$WORK/err2" || fail "agents did not say the master was silent"
kill -9 "$master"
wait "$MASTER_PID" 2>/dev/null
MASTER_PID=""
echo "launch_kill_master: ok"
