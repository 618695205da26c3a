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

decided() { grep -q " decide generation=2 " "$WORK/$1/events.log" 2>/dev/null; }

stand_in_start agent
victim=$(pgrep -f -- "--agent .*--host ${TAG}h3( |$)" | head -1)
[ -n "$victim" ] || fail "no agent process for ${TAG}h3"
t0=$(now_ms)
kill -9 "$victim"
wait_for 3 decided agent || fail "no decision within 3 s: $(tail -3 "$WORK/agent.err")"
line=$(grep -m1 " detect " "$WORK/agent/events.log")
[[ "$line" == *"detect lost the agent on host ${TAG}h3 "* ]] || fail "detection does not name the host: $line"
[[ "$line" =~ detected\ ([0-9]+)\ ms ]] || fail "no detection latency: $line"
[ "${BASH_REMATCH[1]}" -le 1000 ] || fail "detected after ${BASH_REMATCH[1]} ms"
grep -q "decide generation=2 lost hosts ${TAG}h3; re-instantiated" "$WORK/agent/events.log" \
  || fail "events.log lacks the decision: $(grep decide "$WORK/agent/events.log")"
echo "launch_kill_agent: agent kill detected and decided in $(( $(now_ms) - t0 )) ms"
stop_master agent

stand_in_start worker
worker=$(grep -lsa "OB_RANK=2" $(grep -lsa "OB_HOST=$TAG" /proc/[0-9]*/environ) | cut -d/ -f3 | head -1)
[ -n "$worker" ] || fail "no worker with rank 2"
t0=$(now_ms)
kill -9 "$worker"
wait_for 3 decided worker || fail "no decision within 3 s: $(tail -3 "$WORK/worker.err")"
grep -Eq "detect worker rank 2 on host ${TAG}h3 failed \(killed by signal 9\), detected in [0-9]+ ms" \
  "$WORK/worker/events.log" || fail "detection does not name the rank: $(grep detect "$WORK/worker/events.log")"
grep -q "decide generation=2 restarting every worker in place" "$WORK/worker/events.log" \
  || fail "no restart: $(grep decide "$WORK/worker/events.log")"
echo "launch_kill_agent: worker kill detected and decided in $(( $(now_ms) - t0 )) ms"
stop_master worker
echo "launch_kill_agent: ok"
