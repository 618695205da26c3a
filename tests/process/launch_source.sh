#!/usr/bin/env bash
# Where a generation's weights come from is decided by the master and
# honoured by every worker (issue 10): 4 local hosts in 2 pipelines of 2
# stages, f = 1, checkpoints every 10 steps.
#  1. resume, then a failure before the first step completes: the next
#     generation starts from the same checkpoint again, never from the
#     initial weights (which trained steps 0.. again and exited 0);
#  2. rollback, then a failure before the first step after it completes:
#     the next generation starts from the rollback's checkpoint, never from
#     the snapshots taken before the rollback (from_step=30 after a
#     rollback to 19).
# Either way the losses are those of an uninterrupted run.
NAME=launch_source
source "$(dirname "$0")/../lib/launch.sh"
command -v python3 >/dev/null || skip "no python3"
make_two_by_two
STEPS=40
reference_run "$STEPS"
[ "$(stat -c %a "$WORK/ref.pb")" = 600 ] || fail "--metrics file mode $(stat -c %a "$WORK/ref.pb"), expected 600"
gen_started() { grep -q "start-workers generation=$2 " "$WORK/$1/events.log" 2>/dev/null; }

# 1. Resume + kill.
# (Stopped by kill -9 of its master once step 19 is saved: a run of
# other --steps would have another learning-rate schedule.)
run_start first "$STEPS" --ckpt-dir "$WORK/ckpt" --ckpt-every 10
committed() { grep -q " checkpoint step=19 " "$WORK/first/events.log" 2>/dev/null; }
wait_for 60 committed || fail "no checkpoint of step 19: $(tail -3 "$WORK/first.err")"
kill -9 $(pgrep -P "$MASTER_PID" -x ob-launch)
run_wait
wait_for 5 no_tagged || fail "processes left after kill -9 of the master: $(tagged)"
rm -rf "$WORK/ckpt/step-000000000029"  # (if it got that far)
echo step-000000000019 > "$WORK/ckpt/latest"
run_start resumed "$STEPS" --ckpt-dir "$WORK/ckpt" --ckpt-every 10 --resume auto
wait_for 30 gen_started resumed 1 || fail "resumed run did not start: $(tail -3 "$WORK/resumed.err")"
kill -9 $(host_pids "${TAG}h4")
run_wait
[ "$RC" = 0 ] || fail "resume + kill: exit $RC: $(tail -3 "$WORK/resumed.err")"
grep -q " decide generation=2 lost hosts ${TAG}h4" "$WORK/resumed/events.log" \
  || fail "the kill was not seen: $(cat "$WORK/resumed/events.log")"
first=$(python3 "$METRICS_PY" min-step "$WORK/resumed.pb")
[ "$first" = 20 ] || fail "resume + kill trained step $first: it started over instead of from step 19"
grep -q "start-workers generation=2 .* source=checkpoint:.*step-0*19 step=19 " "$WORK/resumed/events.log" \
  || fail "generation 2 does not start from the checkpoint: $(grep start-workers "$WORK/resumed/events.log")"
python3 "$METRICS_PY" compare "$WORK/resumed.pb" "$WORK/ref.pb" 1e-4 > "$WORK/cmp" \
  || fail "resume + kill: $(cat "$WORK/cmp")"
echo "$NAME: resume + kill: $(grep -c start-workers "$WORK/resumed/events.log") generations, first step 20, $(cat "$WORK/cmp")"

# 2. Rollback + kill.
run_start rb "$STEPS" --ckpt-dir "$WORK/ckpt2" --ckpt-every 10
wait_step rb 25 || fail "rollback run: no step 25: $(tail -3 "$WORK/rb.err")"
control "$WORK/rb/control.sock" "rollback from the test" | grep -q '"ok":true' || fail "rollback refused"
wait_for 30 gen_started rb 2 || fail "no generation 2 after the rollback"
kill -9 $(host_pids "${TAG}h4")
run_wait
[ "$RC" = 0 ] || fail "rollback + kill: exit $RC: $(tail -3 "$WORK/rb.err")"
to=$(sed -n 's/.* decide generation=2 rollback to .*step-0*\([0-9][0-9]*\): .*/\1/p' "$WORK/rb/events.log")
[ -n "$to" ] || fail "no rollback decision: $(grep decide "$WORK/rb/events.log")"
rec=$(grep " recovered generation=3 " "$WORK/rb/events.log") || fail "generation 3 did not recover"
[[ "$rec" == *" from_step=$to "* ]] || fail "after a rollback to $to: $rec"
grep -q "start-workers generation=3 .* source=checkpoint:.*step-0*$to step=$to " "$WORK/rb/events.log" \
  || fail "generation 3 does not start from the rollback's checkpoint (step $to): $(grep start-workers "$WORK/rb/events.log")"
python3 "$METRICS_PY" compare "$WORK/ref.pb" "$WORK/rb.pb" 1e-4 > "$WORK/cmp" || fail "rollback + kill: $(cat "$WORK/cmp")"
echo "$NAME: rollback to step $to + kill: ${rec#* recovered }; $(cat "$WORK/cmp")"
wait_for 3 no_tagged || fail "processes left behind: $(tagged)"
echo "$NAME: ok"
