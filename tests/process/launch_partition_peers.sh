#!/usr/bin/env bash
# A host↔host partition (issue 10): four hosts in network namespaces on a
# bridge (as launch_partition.sh), gpt-tiny in two pipelines of two stages.
# At step 15 the two stages of pipeline 1 lose each other (a blackhole
# route each way, set inside their namespaces) while both still reach the
# master. Their agents' probes (peer_probe.h) report the unreachable peer;
# the master excludes one of the two (a tie: the higher node id), the
# others go on as one pipeline, and training finishes every step with exit
# 0. Without the probes the collectives hang for the group timeout (60 s)
# and the run ends with exit 75. Needs root, `ip netns` and python3; exit
# 77 (skipped) otherwise.
NAME=launch_partition_peers
source "$(dirname "$0")/../lib/launch.sh"
source "$(dirname "$0")/../lib/netns.sh"
netns_require python3
trap 'cleanup; netns_cleanup' EXIT

STEPS=40
CUT_STEP=15
DETECT_MS=8000   # two probe rounds of 1 s after the cut, and the report

make_two_by_two
read -r b0 b1 < <(python3 -c '
import json, sys
p = json.load(open(sys.argv[1]))["instantiation"]["pipelines"][1]["nodes"]
print(p[0], p[1])' "$WORK/plan.json") || fail "no pipeline 1 in the plan"
netns_train_to "$STEPS" "$CUT_STEP"
ip netns exec "$b0" ip route add blackhole "${NETNS_ADDR[$b1]}/32" || fail "cannot cut $b0 from $b1"
ip netns exec "$b1" ip route add blackhole "${NETNS_ADDR[$b0]}/32" || fail "cannot cut $b1 from $b0"
cut_ms=$(now_ms)
echo "$NAME: cut $b0 <-> $b1 at step $(max_step "$WORK/metrics.pb"); both still reach the master"
partitioned() { grep -q " partition " "$events" 2>/dev/null || ! kill -0 "$MASTER_PID" 2>/dev/null; }
wait_for 30 partitioned || fail "no partition found in 30 s: $(tail -3 "$WORK/err")"
found_ms=$(( $(now_ms) - cut_ms ))
[ "$found_ms" -le "$DETECT_MS" ] || fail "the partition was found $found_ms ms after the cut"
wait "$MASTER_PID"
RC=$?
MASTER_PID=""
[ "$RC" = 0 ] || fail "exit $RC after the cut: $(grep -E ' partition | decide ' "$events" | cut -d' ' -f3- | tr '\n' '|') $(tail -2 "$WORK/err")"
grep -q " partition cut $b0-$b1\| partition cut $b1-$b0" "$events" \
  || fail "the partition line does not name the pair: $(grep ' partition ' "$events")"
excluded=$(grep -o "detect host [^ ]* cannot reach" "$events" | head -1 | cut -d' ' -f3)
[ "$excluded" = "$b1" ] || [ "$excluded" = "$b0" ] || fail "excluded '$excluded', not one of $b0, $b1"
grep -q " decide generation=2 lost hosts $excluded; re-instantiated" "$events" \
  || fail "no re-instantiation without $excluded: $(grep ' decide ' "$events")"
[ "$(max_step "$WORK/metrics.pb")" = $((STEPS - 1)) ] || fail "did not reach the last step"
wait_for 5 no_tagged || fail "processes left behind: $(tagged)"
echo "$NAME: found $found_ms ms after the cut; excluded $excluded; $(grep ' partition ' "$events" | head -1 | cut -d' ' -f3-)"
echo "$NAME: ok"
