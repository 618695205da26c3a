#!/usr/bin/env bash
# kill -9 of the master: every agent and worker is gone within
# --master-timeout + 2 s, on every host. Then a master that hangs (SIGSTOP)
# and has no standby (--standby-master off; with one, the standby takes
# over: launch_standby_*.sh): the agents notice its silence and take their
# workers down with them.
NAME=launch_kill_master
source "$(dirname "$0")/../lib/launch.sh"
make_cluster 4
TIMEOUT=1

stand_in_start killed --master-timeout "$TIMEOUT"
# The real master is ob-launch itself, not the `timeout` wrapper.
master=$(master_process)
[ -n "$master" ] || fail "cannot find the master process"
t0=$(now_ms)
kill -9 "$master"
wait_for $((TIMEOUT + 2)) no_tagged || fail "left after $((TIMEOUT + 2)) s: $(tagged | xargs -r ps -o pid,args -p)"
echo "launch_kill_master: everything gone $(( $(now_ms) - t0 )) ms after kill -9 of the master"
wait "$MASTER_PID" 2>/dev/null
MASTER_PID=""

# A hung master sends no end of file and no reset: only silence.
stand_in_start hung --master-timeout "$TIMEOUT" --standby-master off
master=$(master_process)
t0=$(now_ms)
kill -STOP "$master"
wait_for $((TIMEOUT + 2)) no_tagged || fail "left $((TIMEOUT + 2)) s after SIGSTOP of the master: $(tagged | xargs -r ps -o pid,args -p)"
echo "launch_kill_master: everything gone $(( $(now_ms) - t0 )) ms after SIGSTOP of the master"
grep -q "master has been silent" "$WORK/hung.err" || fail "agents did not say the master was silent"
kill -9 "$master"
wait "$MASTER_PID" 2>/dev/null
MASTER_PID=""
echo "launch_kill_master: ok"
