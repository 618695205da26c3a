#!/usr/bin/env bash
# A second failure 90 ms (or less) after a recovery's decision (issue 10): f = 1, 4
# local hosts in 2 pipelines of 2 stages. The first node of pipeline 1 is
# killed after step 15: its partner is left idle, holding stage 1's layers.
# 90 ms after that decision, before the new generation has stepped, the
# last node of pipeline 0 is killed: the only other holder of stage 1. The
# survivors (pipeline 0's first node and the idle host) still hold every
# layer, as they would had both hosts been lost at once, so training must
# go on and exit 0 with the reference's losses. (Before the decision was
# made against where the layers are, plan/recovery.h saw only the new
# instantiation's nodes, counted the idle host as holding nothing, and the
# run ended with exit 75 "no surviving replica".)
NAME=launch_second_failure
source "$(dirname "$0")/../lib/launch.sh"
command -v python3 >/dev/null || skip "no python3"
make_two_by_two
STEPS=40

reference_run "$STEPS"

read -r a1 b0 < <(python3 - "$WORK/plan.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))["instantiation"]["pipelines"]
print(p[0]["nodes"][1], p[1]["nodes"][0])
PY
)
# The premise: the second kill lands before generation 2 completes a step.
# After that step the idle host's snapshot is a step older than the
# survivors' newest, the master restarts from a checkpoint (none here: exit
# 75), and this attempt says nothing; on a fast machine generation 2 can
# step within the 90 ms (or a rank of it between the kill and its agent's
# death), so the attempt is made again (at most 3).
# Each attempt kills sooner after the decision (90, 30, then 0 ms: a
# machine fast enough to step within 90 ms skipped the test on every
# attempt), and the decision is watched for every 5 ms, not wait_for's 50.
delays=(0.09 0.03 0)
for attempt in 1 2 3; do
  run_start second "$STEPS"
  wait_step second 15 || fail "did not reach step 15: $(tail -3 "$WORK/second.err")"
  kill -9 $(host_pids "$b0")
  for ((i = 0; i < 1000; i++)); do
    grep -q " decide generation=2 " "$WORK/second/events.log" 2>/dev/null && break
    sleep 0.005
  done
  [ "$i" -lt 1000 ] || fail "no decision after the first kill"
  sleep "${delays[$((attempt - 1))]}"
  kill -9 $(host_pids "$a1")
  if grep -q " recovered generation=2 " "$WORK/second/events.log"; then
    echo "$NAME: attempt $attempt: generation 2 stepped before the second kill; again" >&2
    run_wait
    wait_for 5 no_tagged || fail "processes left after attempt $attempt: $(tagged)"
    [ "$attempt" = 3 ] && skip "generation 2 stepped before the second kill in 3 attempts"
    continue
  fi
  run_wait
  # A rank of generation 2 may have completed a step between the kill and
  # its agent's death (the recovered line needs every rank): the premise
  # broke too.
  if [ "$RC" != 0 ] && python3 - "$OB_SOURCE_DIR/tests/lib" "$WORK/second.pb" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
import metrics
sys.exit(0 if any(r.get(metrics.GENERATION, 0) == 2 for r in metrics.records(sys.argv[2])) else 1)
PY
  then
    echo "$NAME: attempt $attempt: a rank of generation 2 stepped before the second kill took effect; again" >&2
    wait_for 5 no_tagged || fail "processes left after attempt $attempt: $(tagged)"
    [ "$attempt" = 3 ] && skip "generation 2 stepped before the second kill in 3 attempts"
    continue
  fi
  break
done
[ "$RC" = 0 ] || fail "exit $RC: $(grep -E ' decide ' "$WORK/second/events.log" | tail -2; tail -2 "$WORK/second.err"; grep -E 'cannot start from|no rank of the new plan|claims layers|re-shard|error' "$WORK/second.err" | grep -v ' decide ' | tail -4)"
grep -q "decide generation=3 lost hosts $a1; re-instantiated as pipelines of 2 nodes, 0 layer copies" \
  "$WORK/second/events.log" || fail "generation 3 is not a copy-free re-instantiation: $(grep decide "$WORK/second/events.log")"
rec=$(grep " recovered generation=3 " "$WORK/second/events.log") \
  || fail "no recovery at generation 3: $(grep -E 'decide|recovered' "$WORK/second/events.log")"
python3 "$METRICS_PY" compare "$WORK/ref.pb" "$WORK/second.pb" 1e-4 > "$WORK/cmp" || fail "$(cat "$WORK/cmp")"
wait_for 3 no_tagged || fail "processes left behind: $(tagged)"
echo "$NAME: $b0, then $a1 ${delays[$((attempt - 1))]} s after the decision: $(cat "$WORK/cmp"); ${rec#* recovered }"
echo "$NAME: ok"
