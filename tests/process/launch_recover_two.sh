#!/usr/bin/env bash
# Two hosts at once with f = 2 (issue 4, acceptance 3): 6 local hosts in 3
# pipelines of 2 stages; kill -9 of two hosts in different pipelines (agent,
# worker and standby of each) in the same instant, after step 15. The
# failures are decided together as one re-instantiation, training reaches
# the last step with every step's loss equal to an uninterrupted run's.
# Then a failure during recovery: one host killed, and the other as soon as
# the first decision is made: a second re-instantiation (generation 3)
# takes over, with the same losses.
NAME=launch_recover_two
source "$(dirname "$0")/../lib/launch.sh"
command -v python3 >/dev/null || skip "no python3"
make_pipelines 6 2
STEPS=50

reference_run "$STEPS"

# The first node of pipeline 0 and the last of pipeline 2.
read -r a b < <(python3 - "$WORK/plan.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))["instantiation"]["pipelines"]
print(p[0]["nodes"][0], p[2]["nodes"][-1])
PY
)
run_start two "$STEPS"
wait_step two 15 || fail "did not reach step 15: $(tail -3 "$WORK/two.err")"
victims=$(host_pids "$a"; host_pids "$b")
kill -9 $victims
run_wait
[ "$RC" = 0 ] || fail "exit $RC: $(tail -3 "$WORK/two.err")"
[ "$(grep -c " decide " "$WORK/two/events.log")" = 1 ] \
  || fail "not one decision: $(grep decide "$WORK/two/events.log")"
grep -Eq "decide generation=2 lost hosts ($a, $b|$b, $a); re-instantiated" "$WORK/two/events.log" \
  || fail "the decision does not name both hosts: $(grep decide "$WORK/two/events.log")"
rec=$(grep " recovered generation=2 " "$WORK/two/events.log") || fail "no recovery logged"
python3 "$METRICS_PY" compare "$WORK/ref.pb" "$WORK/two.pb" 1e-4 > "$WORK/cmp" || fail "$(cat "$WORK/cmp")"
wait_for 3 no_tagged || fail "processes left behind: $(tagged)"
echo "$NAME: hosts $a and $b: $(cat "$WORK/cmp"); ${rec#* recovered }"

run_start during "$STEPS"
wait_step during 15 || fail "did not reach step 15: $(tail -3 "$WORK/during.err")"
kill -9 $(host_pids "$a")
decided() { grep -q " decide generation=2 " "$WORK/during/events.log"; }
wait_for 5 decided || fail "no decision after the first kill"
kill -9 $(host_pids "$b")
run_wait
[ "$RC" = 0 ] || fail "failure during recovery: exit $RC: $(tail -3 "$WORK/during.err")"
rec=$(grep " recovered generation=3 " "$WORK/during/events.log") \
  || fail "no generation 3: $(grep -E 'decide|recovered' "$WORK/during/events.log")"
python3 "$METRICS_PY" compare "$WORK/ref.pb" "$WORK/during.pb" 1e-4 > "$WORK/cmp" || fail "$(cat "$WORK/cmp")"
wait_for 3 no_tagged || fail "processes left behind: $(tagged)"
echo "$NAME: failure during recovery: $(cat "$WORK/cmp"); ${rec#* recovered }"
echo "$NAME: ok"
