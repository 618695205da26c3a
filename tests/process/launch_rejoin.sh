#!/usr/bin/env bash
# Rejoin (issue 4, acceptance 5): 4 local hosts in 2 pipelines of 2 stages,
# f = 1. kill -9 of one host after step 10: training goes on re-instantiated
# on the survivors. Then an agent is started again for that host by hand
# (as a supervisor would: same secret, the master's address from
# events.log): it is admitted, added at the next generation, and the
# cluster returns to the full-size instantiation (4 ranks, pipelines of 2+2)
# and trains to the last step with the uninterrupted run's losses.
NAME=launch_rejoin
source "$(dirname "$0")/../lib/launch.sh"
command -v python3 >/dev/null || skip "no python3"
make_two_by_two
STEPS=80

reference_run "$STEPS"

run_start rejoin "$STEPS"
wait_step rejoin 10 || fail "did not reach step 10: $(tail -3 "$WORK/rejoin.err")"
kill -9 $(host_pids "${TAG}h3")
events="$WORK/rejoin/events.log"
recovered() { grep -q " recovered generation=$1 " "$events"; }
wait_for 20 recovered 2 || fail "no recovery from the loss: $(tail -3 "$WORK/rejoin.err")"
grep -q "start-workers generation=2 world=2 pipelines=2" "$events" \
  || fail "unexpected generation 2: $(grep start-workers "$events")"

master=$(sed -n 's/.* listen \([^ ]*\)$/\1/p' "$events" | head -1)
[ -n "$master" ] || fail "no listen line in events.log"
"$OB_BIN/ob-launch" --agent --master "$master" --host "${TAG}h3" < "$WORK/secret" \
  2> "$WORK/agent.err" &
wait_for 20 recovered 3 || fail "no rejoin: $(grep -E 'rejoin|decide' "$events"; tail -3 "$WORK/agent.err")"
grep -q "agent-rejoined host=${TAG}h3 " "$events" || fail "no agent-rejoined line"
grep -q "start-workers generation=3 world=4 pipelines=2+2" "$events" \
  || fail "not back to full size: $(grep start-workers "$events")"
run_wait
[ "$RC" = 0 ] || fail "exit $RC: $(tail -3 "$WORK/rejoin.err")"
python3 "$METRICS_PY" compare "$WORK/ref.pb" "$WORK/rejoin.pb" 1e-4 > "$WORK/cmp" || fail "$(cat "$WORK/cmp")"
wait_for 5 no_tagged || fail "processes left behind: $(tagged)"
echo "$NAME: $(cat "$WORK/cmp"); $(grep -o 'recovered generation=3 .*' "$events")"
echo "$NAME: ok"
