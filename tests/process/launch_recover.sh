#!/usr/bin/env bash
# In-place recovery (issue 4, acceptance 3; design/recovery.md), f = 1, 4 local
# hosts in 2 pipelines of 2 stages, 60 steps on the fixed corpus:
#  1. kill -9 of one host's agent and everything it started, after step 15:
#     the master re-instantiates on the 3 survivors, training reaches the
#     last step and exits 0, and every step's loss equals an uninterrupted
#     run's within 1e-4 relative (no lost or repeated samples), with no
#     checkpoint anywhere: the state comes from the survivors' snapshots;
#  2. kill -9 of a single worker: the same, every worker restarted in place
#     (the workers ignore SIGPIPE, so a survivor's write to the dead peer
#     cannot kill it).
# Each recovery is logged with its phases (`recovered ...` in events.log).
NAME=launch_recover
source "$(dirname "$0")/../lib/launch.sh"
command -v python3 >/dev/null || skip "no python3"
make_two_by_two
STEPS=60

reference_run "$STEPS"

# 1. A host: its agent, its worker and its standby, all at once.
run_start host "$STEPS"
kill_host_at host 15 "${TAG}h3"
grep -q "decide generation=2 lost hosts ${TAG}h3; re-instantiated" "$WORK/host/events.log" \
  || fail "no re-instantiation decision: $(grep decide "$WORK/host/events.log")"
check_recovered host "$STEPS" "kill -9 of host ${TAG}h3"

# 2. One worker (rank 1: the last stage of the first pipeline).
run_start worker "$STEPS"
wait_step worker 15 || fail "worker run did not reach step 15: $(tail -3 "$WORK/worker.err")"
victim=$(worker_pid 1)
[ -n "$victim" ] || fail "no worker process for rank 1"
# Every worker ignores SIGPIPE: Gloo's writes to the peer about to die must
# fail with EPIPE, not kill the survivors (signal 13 = mask 0x1000).
for r in 0 1 2 3; do
  p=$(worker_pid $r)
  mask=$(awk '/^SigIgn:/ { print $2 }' "/proc/$p/status" 2>/dev/null)
  [ -n "$mask" ] && (( 0x$mask & 0x1000 )) || fail "worker rank $r (pid $p) does not ignore SIGPIPE (SigIgn ${mask:-?})"
done
kill -9 "$victim"
run_wait
grep -q "decide generation=2 restarting every worker in place" "$WORK/worker/events.log" \
  || fail "no restart decision: $(grep decide "$WORK/worker/events.log")"
check_recovered worker "$STEPS" "kill -9 of worker rank 1"
echo "$NAME: ok"
