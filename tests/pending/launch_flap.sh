#!/usr/bin/env bash
# PENDING (issue 10, "0.5 s link flap"): not registered with CTest. It fails
# on today's code: the master evicts the host about 1.07 s into the silence
# (TCP retransmits back off past --agent-timeout), and an evicted agent does
# not rejoin. Move it to tests/process/ once evicted agents reconnect and
# rejoin at the next generation (or the flap is otherwise survived).
# A link flap is not a lost host (issue 10): four hosts in network
# namespaces on a bridge (as launch_partition.sh), gpt-tiny in two pipelines
# of two stages; at step 15 one host's link goes down for 0.5 s and comes
# back. Its agent is silent for longer than --agent-timeout while TCP
# retransmits, but its host's kernel acknowledges the master's heartbeats
# again as soon as the link is up: the master logs a *suspect* line and
# evicts nobody; training finishes in generation 1 with exit 0. Needs root,
# `ip netns` and python3; exit 77 (skipped) otherwise.
NAME=launch_flap
source "$(dirname "$0")/../lib/launch.sh"
source "$(dirname "$0")/../lib/netns.sh"
netns_require python3
trap 'cleanup; netns_cleanup' EXIT
STEPS=40
CUT_STEP=15
make_two_by_two
mapfile -t hosts < "$WORK/hosts.txt"
victim=${hosts[3]}
netns_add "${hosts[@]}"
netns_star_ready "${hosts[@]}"
netns_rsh "$WORK/rsh"
"$OB_BIN/ob-launch" --rsh "$WORK/rsh" --bind "$NETNS_GATEWAY" --secret-file "$WORK/secret" \
  --run-dir "$WORK/run" --steps "$STEPS" --data "$OB_SOURCE_DIR/tests/data/corpus.txt" \
  --metrics "$WORK/metrics.pb" "$WORK/plan.pb" "$WORK/hosts.txt" 2> "$WORK/err" &
MASTER_PID=$!
events="$WORK/run/events.log"
at_cut() { [ "$(max_step "$WORK/metrics.pb")" -ge "$CUT_STEP" ] || ! kill -0 "$MASTER_PID" 2>/dev/null; }
wait_for 90 at_cut || fail "no step $CUT_STEP in 90 s: $(tail -3 "$WORK/err")"
kill -0 "$MASTER_PID" 2>/dev/null || fail "the master exited before the flap: $(tail -3 "$WORK/err")"
grep -q " detect " "$events" && fail "a failure was detected before the flap: $(grep " detect " "$events")"
ip link set "${NETNS_HOSTDEV[$victim]}" down || fail "cannot set the link down"
sleep 0.5
ip link set "${NETNS_HOSTDEV[$victim]}" up || fail "cannot set the link up"
echo "$NAME: flapped $victim's link for 0.5 s at step $(max_step "$WORK/metrics.pb")"
wait "$MASTER_PID"
RC=$?
MASTER_PID=""
[ "$RC" = 0 ] || fail "exit $RC after a 0.5 s flap: $(tail -3 "$WORK/err")"
! grep -q " detect \| decide " "$events" || fail "a 0.5 s flap cost a host: $(grep ' detect \| decide ' "$events")"
[ "$(max_step "$WORK/metrics.pb")" = $((STEPS - 1)) ] || fail "did not reach the last step"
echo "$NAME: $(grep -c ' suspect ' "$events") suspect line(s): $(grep ' suspect ' "$events" | cut -d' ' -f3- | head -2 | tr '\n' '|')"
wait_for 5 no_tagged || fail "processes left behind: $(tagged)"
echo "$NAME: ok"
