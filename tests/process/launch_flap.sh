#!/usr/bin/env bash
# A link flap is not a lost host (issue 10): four hosts in network
# namespaces on a bridge (as launch_partition.sh), gpt-tiny in two pipelines
# of two stages; at step 15 one host's link goes down for 0.5 s and comes
# back. Its agent is silent for longer than --agent-timeout while TCP
# retransmits. If its host's kernel acknowledges the master's heartbeats
# again in time, the master only logs a *suspect* line; if the silence
# outlasts that (TCP's retransmissions back off, so eviction comes about
# 1.1 s in), the host is evicted but its agent is left alive: it stops its
# workers, rejoins, and the master adds it back at the next generation, so
# the run ends on two pipelines again. Either way training finishes with
# exit 0, and no host is lost for good. Needs root, `ip netns` and python3;
# exit 77 (skipped) otherwise.
NAME=launch_flap
source "$(dirname "$0")/../lib/launch.sh"
source "$(dirname "$0")/../lib/netns.sh"
netns_require python3
trap 'cleanup; netns_cleanup' EXIT
STEPS=40
CUT_STEP=15
make_two_by_two
netns_train_to "$STEPS" "$CUT_STEP"
victim=${hosts[3]}
ip link set "${NETNS_HOSTDEV[$victim]}" down || fail "cannot set the link down"
sleep 0.5
ip link set "${NETNS_HOSTDEV[$victim]}" up || fail "cannot set the link up"
echo "$NAME: flapped $victim's link for 0.5 s at step $(max_step "$WORK/metrics.pb")"
wait "$MASTER_PID"
RC=$?
MASTER_PID=""
[ "$RC" = 0 ] || fail "exit $RC after a 0.5 s flap: $(tail -3 "$WORK/err")"
[ "$(max_step "$WORK/metrics.pb")" = $((STEPS - 1)) ] || fail "did not reach the last step"
if grep -q " detect " "$events"; then
  grep -q " agent-rejoined host=$victim " "$events" \
    || fail "$victim was evicted and never rejoined: $(grep -E ' detect | decide | agent-' "$events" | cut -d' ' -f3- | tr '\n' '|')"
  last=$(grep " start-workers " "$events" | tail -1)
  [[ "$last" == *" pipelines=2+2 "* ]] || fail "the run did not end on two pipelines: $last"
  echo "$NAME: evicted, rejoined: $(grep -E ' decide ' "$events" | cut -d' ' -f3- | cut -c 1-120 | tr '\n' '|')"
else
  echo "$NAME: not evicted; $(grep -c ' suspect ' "$events") suspect line(s)"
fi
wait_for 5 no_tagged || fail "processes left behind: $(tagged)"
echo "$NAME: ok"
