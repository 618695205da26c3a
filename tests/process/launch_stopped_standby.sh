#!/usr/bin/env bash
# A stopped standby worker (issue 10): 4 local hosts in 2 pipelines of 2
# stages. After step 15 the standby process waiting on host 2 is stopped
# (SIGSTOP) and a worker on host 1 is killed: the restart in place hands
# the stopped standby its role, and it never starts. Its agent's deadline
# (agent.h: a heartbeat within kRoleAckMs of the handing) kills it and
# reports it; the master restarts once more with a fresh process in that
# slot, and training goes on to the last step with the reference's losses,
# the whole recovery in seconds (not the 60 s group timeout). While it
# waits, the master's status names the rank it waits for and the phase.
NAME=launch_stopped_standby
source "$(dirname "$0")/../lib/launch.sh"
command -v python3 >/dev/null || skip "no python3"
make_two_by_two
STEPS=40

reference_run "$STEPS"

# standby_of HOST: the standby process waiting for a role there.
standby_of() {
  local p
  for p in $(pgrep -f -- "--standby-worker"); do
    grep -qsa "OB_HOST=$1\b" "/proc/$p/environ" || continue
    # Not one that became a worker (named ob-worker-R); comm is 15 bytes.
    [ "$(cat "/proc/$p/comm" 2>/dev/null)" = ob-launch-worke ] && { echo "$p"; return; }
  done
}
run_start stb "$STEPS"
wait_step stb 15 || fail "did not reach step 15: $(tail -3 "$WORK/stb.err")"
sb=$(standby_of "${TAG}h2")
[ -n "$sb" ] || fail "no standby on ${TAG}h2"
kill -STOP "$sb"
t0=$(date +%s%N)
kill -9 "$(worker_pid 0)"
# What the status says while the stopped worker holds the recovery up:
# the others have started, it has not.
said=""
for _ in $(seq 1 40); do
  s=$(control "$WORK/stb/control.sock" status 2>/dev/null)
  if [[ "$s" =~ \;\ rank\(s\)\ [0-9]+\ on\ ${TAG}h2\ to\ start ]]; then said=$s; break; fi
  sleep 0.1
done
run_wait
t1=$(date +%s%N)
[ "$RC" = 0 ] || fail "exit $RC: $(tail -3 "$WORK/stb.err")"
kill -CONT "$sb" 2>/dev/null
grep -q "worker-exit .*showed no sign of life since it got its role" "$WORK/stb/events.log" \
  || fail "the stopped standby was not found out: $(grep -E 'worker-exit|decide' "$WORK/stb/events.log")"
rec=$(grep " recovered generation=3 " "$WORK/stb/events.log") \
  || fail "no recovery at generation 3: $(grep -E 'decide|recovered|worker-exit' "$WORK/stb/events.log")"
total=$(sed -E 's/.* total_ms=([0-9]+).*/\1/' <<< "$rec")
[ "$total" -lt 15000 ] || fail "the recovery took $total ms: $(grep -E 'detect|decide|recovered|worker-exit' "$WORK/stb/events.log" | cut -d' ' -f2- | cut -c 1-200)"
[ -n "$said" ] || fail "the status never said what the recovery waits for"
python3 - "$said" <<'PY' || fail "status: $said"
import json, re, sys
w = json.loads(sys.argv[1])["waiting_for"]
assert re.search(r"^recovery to generation 2 for [0-9.]+ s; rank\(s\) [0-9]+ on \S+h2 to start", w), w
PY
python3 "$METRICS_PY" compare "$WORK/ref.pb" "$WORK/stb.pb" 1e-4 > "$WORK/cmp" || fail "$(cat "$WORK/cmp")"
wait_for 3 no_tagged || fail "processes left behind: $(tagged)"
echo "$NAME: status said: $(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["waiting_for"])' "$said")"
echo "$NAME: kill to the end of the run $(( (t1 - t0) / 1000000 )) ms; $(cat "$WORK/cmp"); ${rec#* recovered }"
echo "$NAME: ok"
