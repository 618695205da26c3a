#!/usr/bin/env bash
# A master stopped (SIGSTOP) for longer than --master-timeout: its agents
# give up on it and stop their workers, as they must. When it runs again it
# says that it was the one that stalled (exit 75), instead of blaming the
# hosts ("no surviving replica").
NAME=launch_master_stopped
source "$(dirname "$0")/../lib/launch.sh"
make_cluster 2
stand_in_start run --master-timeout 1
# (And the run directory is the job's user's alone, whatever the umask.)
[ "$(stat -c %a "$WORK/run")" = 700 ] || fail "run directory mode $(stat -c %a "$WORK/run"), expected 700"
master=$(master_process)
kill -STOP "$master"
sleep 2.5
kill -CONT "$master"
wait "$MASTER_PID"
RC=$?
MASTER_PID=""
[ "$RC" = 75 ] || fail "exit $RC, expected 75: $(tail -3 "$WORK/run.err")"
grep -q "the master did not run for [0-9]* ms (stopped, or starved of CPU), longer than --master-timeout 1.0 s" \
  "$WORK/run.err" || fail "the stall is not named: $(tail -3 "$WORK/run.err")"
! grep -q "no surviving replica" "$WORK/run.err" || fail "the hosts are blamed: $(tail -3 "$WORK/run.err")"
wait_for 5 no_tagged || fail "processes left behind: $(tagged)"
echo "$NAME: $(grep -o 'the master did not run for [0-9]* ms' "$WORK/run.err")"
echo "$NAME: ok"
