#!/usr/bin/env bash
# A silent agent whose host still acknowledges is not evicted at once
# (issue 10): an agent stopped (SIGSTOP: as a starved process on a loaded
# machine) for 1.5 s with --agent-timeout 1 keeps its host. Its kernel
# still acknowledges the master's heartbeats (TCP_INFO), so the master
# writes a *suspect* line and waits up to 3 s; the agent runs again at
# 1.5 s and nothing is decided. Stopped for 4 s, it is evicted.
NAME=launch_agent_starved
source "$(dirname "$0")/../lib/launch.sh"
make_cluster 2
agent_of() { pgrep -f -- "--agent .*--host $1( |\$)" | head -1; }

stand_in_start run --agent-timeout 1
a=$(agent_of "${TAG}h2")
[ -n "$a" ] || fail "no agent for ${TAG}h2"
kill -STOP "$a"
sleep 1.5
kill -CONT "$a"
sleep 0.5
grep -q " suspect host=${TAG}h2 silent_ms=" "$WORK/run/events.log" \
  || fail "no suspect line: $(tail -3 "$WORK/run/events.log")"
! grep -q " detect \| decide " "$WORK/run/events.log" \
  || fail "a 1.5 s stop of an agent cost its host: $(grep ' detect \| decide ' "$WORK/run/events.log")"
echo "$NAME: $(grep -o 'suspect .*' "$WORK/run/events.log" | head -1)"

kill -STOP "$a"
evicted() { grep -q " decide .*lost hosts ${TAG}h2" "$WORK/run/events.log"; }
wait_for 8 evicted || { kill -CONT "$a"; fail "an agent stopped for 8 s was not evicted"; }
kill -CONT "$a" 2>/dev/null
line=$(grep " detect lost the agent on host ${TAG}h2" "$WORK/run/events.log" | head -1)
[[ "$line" =~ silent\ for\ ([0-9]+)\ ms ]] || fail "detection: $line"
ms=${BASH_REMATCH[1]}
[ "$ms" -ge 2900 ] && [ "$ms" -le 4500 ] || fail "evicted after $ms ms of silence, expected about 3000"
echo "$NAME: stopped for good: evicted after $ms ms of silence"
stop_master run
echo "$NAME: ok"
