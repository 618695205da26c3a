#!/usr/bin/env bash
# ob-launch --rsh local on 4 hosts: agents start, authenticate, run a trivial
# worker each, and stop cleanly (exit 0, nothing left running); the control
# socket answers `status` and `stop`.
NAME=launch_local
source "$(dirname "$0")/../lib/launch.sh"
make_cluster 4

# 1. Workers that finish: the run completes with exit 0.
start=$(now_ms)
OB_TEST_WORKER_CMD="exec sleep 0.5" timeout 30 "$OB_BIN/ob-launch" --rsh local \
  --secret-file "$WORK/secret" --run-dir "$WORK/run1" "$WORK/plan.pb" "$WORK/hosts.txt" \
  2> "$WORK/err1"
rc=$?
[ "$rc" = 0 ] || fail "exit $rc, expected 0: $(tail -5 "$WORK/err1")"
echo "launch_local: 4 agents, 4 workers, done in $(( $(now_ms) - start )) ms"
wait_for 2 no_tagged || fail "processes left after a clean run: $(tagged | xargs -r ps -o pid,args -p)"
grep -q 'start-workers generation=1 world=4' "$WORK/run1/events.log" || fail "events.log lacks start-workers"
grep -q 'done exit 0' "$WORK/run1/events.log" || fail "events.log lacks 'done exit 0'"
[ "$(grep -c 'agent-connected' "$WORK/run1/events.log")" = 4 ] || fail "not 4 agents connected"
grep -q 'authenticated after' "$WORK/run1/master.log" || fail "master.log lacks the log lines"
[ ! -e "$WORK/run1/control.sock" ] || fail "control.sock left behind"
for i in 1 2 3 4; do
  grep -q "^${TAG}h$i:[0-9]*:agent: info: stopping: told to stop" "$WORK/err1" \
    || fail "agent ${TAG}h$i did not log a clean stop"
done

# OB_INJECT left in the environment (exported for a test) injects nothing:
# only --inject does. The worker exits 1 when it sees one it was not given.
OB_INJECT="0:nan=3" OB_TEST_WORKER_CMD='[ "${OB_INJECT-none}" = "${WANT:-none}" ]' timeout 30 "$OB_BIN/ob-launch" \
  --rsh local --secret-file "$WORK/secret" --run-dir "$WORK/run-env" \
  "$WORK/plan.pb" "$WORK/hosts.txt" 2> "$WORK/err-env"
rc=$?
[ "$rc" = 0 ] || fail "a worker saw \$OB_INJECT from the environment: exit $rc: $(tail -3 "$WORK/err-env")"
WANT="1:slow=2" OB_INJECT="0:nan=3" OB_TEST_WORKER_CMD='[ "${OB_INJECT-none}" = "$WANT" ]' timeout 30 \
  "$OB_BIN/ob-launch" --rsh local --secret-file "$WORK/secret" --run-dir "$WORK/run-inject" \
  --inject "1:slow=2" "$WORK/plan.pb" "$WORK/hosts.txt" 2> "$WORK/err-inject"
rc=$?
[ "$rc" = 0 ] || fail "--inject did not reach the workers as given: exit $rc: $(tail -3 "$WORK/err-inject")"
wait_for 2 no_tagged || fail "processes left: $(tagged | xargs -r ps -o pid,args -p)"

# The open-file limit (fd_limit.h): a job started under a soft limit of
# 256 gives its workers the hard limit (at most 2^20), for Gloo's
# connection per peer rank.
hard=$(ulimit -Hn)
if [ "$hard" = unlimited ] || [ "$hard" -gt 1048576 ]; then hard=1048576; fi
if [ "$hard" -gt 256 ]; then
  ( ulimit -Sn 256
    WANT=$hard OB_TEST_WORKER_CMD='[ "$(ulimit -Sn)" = "$WANT" ]' timeout 30 "$OB_BIN/ob-launch" \
      --rsh local --secret-file "$WORK/secret" --run-dir "$WORK/run-nofile" \
      "$WORK/plan.pb" "$WORK/hosts.txt" 2> "$WORK/err-nofile" )
  rc=$?
  [ "$rc" = 0 ] || fail "workers did not get the hard open-file limit $hard: exit $rc: $(tail -3 "$WORK/err-nofile")"
else
  echo "launch_local: the hard open-file limit is $hard: nothing to raise, not tested"
fi

# --probe-port reaches the agents: with a port where nothing answers (a
# listener whose full queue drops each attempt), every agent reports every
# other host unreachable, which the master takes for its own firewall, not
# a partition ("nobody excluded"). With the default port 9 on loopback
# (refused: an answer), no partition line at all. (--standby off: a
# stand-in, not a worker, would miss the 3 s a standby has to answer.)
python3 - "$WORK/silent-port" <<'PY' &
import socket, sys, time
l = socket.socket(); l.bind(("0.0.0.0", 0)); l.listen(0)
q = socket.socket(); q.connect(("127.0.0.1", l.getsockname()[1]))
open(sys.argv[1], "w").write(str(l.getsockname()[1]))
time.sleep(30)
PY
silent_pid=$!
wait_for 5 test -s "$WORK/silent-port" || fail "no silent listener"
OB_TEST_WORKER_CMD="exec sleep 9" timeout 30 "$OB_BIN/ob-launch" --rsh local --secret-file "$WORK/secret" \
  --run-dir "$WORK/run-probe" --standby off --probe-port "$(cat "$WORK/silent-port")" "$WORK/plan.pb" "$WORK/hosts.txt" \
  2> "$WORK/err-probe"
rc=$?
kill "$silent_pid" 2> /dev/null
[ "$rc" = 0 ] || fail "--probe-port run: exit $rc: $(tail -3 "$WORK/err-probe")"
grep -q " partition cut .*nobody excluded" "$WORK/run-probe/events.log" \
  || fail "the agents did not probe the port given: $(grep -c partition "$WORK/run-probe/events.log") partition lines"
[ "$(grep -c ' start-workers ' "$WORK/run-probe/events.log")" = 1 ] \
  || fail "probes that every host fails excluded a host: $(grep -m1 ' partition cut' "$WORK/run-probe/events.log" | cut -d' ' -f3- | cut -c1-200)"
! grep -q " partition " "$WORK/run1/events.log" || fail "a partition line with the default port"

# 2. Workers that write Metrics records (step 5, loss 2.5, 1000 tokens/s,
#    and a host "forged" and generation 99 that are not theirs, encoded by
#    hand): relayed to --metrics with host, rank and generation the agent's,
#    and summarised on stderr (each rank reports the global throughput:
#    the summary averages, it does not add).
rec='\036\022\006forged\060\005\070\143\151\0\0\0\0\0\0\004\100\171\0\0\0\0\0\100\217\100'
OB_TEST_WORKER_CMD="printf '$rec'; exec sleep 0.3" timeout 30 "$OB_BIN/ob-launch" --rsh local \
  --secret-file "$WORK/secret" --run-dir "$WORK/run3" --metrics "$WORK/metrics.pb" \
  "$WORK/plan.pb" "$WORK/hosts.txt" 2> "$WORK/err3"
rc=$?
[ "$rc" = 0 ] || fail "metrics run: exit $rc: $(tail -3 "$WORK/err3")"
grep -q 'master: info: step 6/100  loss 2.5000  tokens/s 1000  MFU -  ETA 0s' "$WORK/err3" \
  || fail "no progress line: $(grep -c step "$WORK/err3")"
if command -v python3 >/dev/null; then
  python3 - "$WORK/metrics.pb" "$TAG" "$METRICS_PY" <<'PY' || fail "metrics file"
import importlib.util, sys
spec = importlib.util.spec_from_file_location("metrics", sys.argv[3])
metrics = importlib.util.module_from_spec(spec)
spec.loader.exec_module(metrics)
recs = metrics.records(sys.argv[1])             # the workers' records (exits left out)
assert len(recs) == 4, recs
for r in recs:
    assert r[2].decode().startswith(sys.argv[2] + "h"), r   # host, filled by the agent
    assert r[metrics.STEP] == 5, r
    assert r[metrics.GENERATION] == 1, r                  # the generation the agent started it for
assert {r.get(metrics.RANK, 0) for r in recs} == {0, 1, 2, 3}, recs
PY
fi

# 3. Long workers, stopped through the control socket.
command -v python3 >/dev/null || skip "no python3 for the control socket part"
stand_in_start run2
status=$(control "$WORK/run2/control.sock" status) || fail "control socket: no answer to status"
echo "$status" | grep -q '"state":"running"' || fail "status: $status"
echo "$status" | grep -q '"world_size":4' || fail "status: $status"
[ "$(echo "$status" | grep -o '"state":"connected"' | wc -l)" = 4 ] || fail "status hosts: $status"
control "$WORK/run2/control.sock" stop > /dev/null || fail "control socket: no answer to stop"
wait "$MASTER_PID"; rc=$?
MASTER_PID=""
[ "$rc" = 0 ] || fail "stop via control socket: exit $rc: $(tail -3 "$WORK/run2.err")"
wait_for 2 no_tagged || fail "processes left after stop: $(tagged | xargs -r ps -o pid,args -p)"

# 4. SIGTERM to the master: everyone stops, exit 0.
stand_in_start run4
stop_master run4
grep -q 'stop-request got Terminated' "$WORK/run4/events.log" || fail "events.log lacks the stop request"
echo "launch_local: ok"
