#!/usr/bin/env bash
# Scheduler signals (issue 12, acceptance 6): 4 local hosts in 2 pipelines
# of 2 stages, 40 steps, --ckpt-dir without --ckpt-every.
#  1. SIGTERM (and SIGUSR1, Slurm's --signal, and SIGHUP, a terminal or ssh
#     session gone, which killed the master at once) to the master at step 20: it
#     lets the workers save the step after the next, stops once that
#     checkpoint is committed, and exits 0; the checkpoint verifies, is of
#     a step >= 20, and is not the run's last (it stopped);
#  2. --resume auto from it trains the rest with the uninterrupted run's
#     losses exactly, and ends with the checkpoint of its last step, which
#     verifies (--ckpt-dir saves the last step without --ckpt-every: before
#     2026-11-28 it exited 0 with nothing after the stop's checkpoint);
#  3. a second signal stops at once, nothing saved: exit 75 naming the
#     steps trained since the last checkpoint, which are lost;
#  4. without --ckpt-dir, SIGTERM stops at once, exit 75 likewise (both
#     exited 0, the work lost, before 2026-11-28).
NAME=launch_signal
source "$(dirname "$0")/../lib/launch.sh"
command -v python3 >/dev/null || skip "no python3"
make_two_by_two
STEPS=40

reference_run "$STEPS"
master() { pgrep -P "$MASTER_PID" -x ob-launch; }  # the master itself, not its timeout(1)

for sig in TERM USR1 HUP; do
  run_start "sig$sig" "$STEPS" --ckpt-dir "$WORK/ckpt-$sig"
  wait_step "sig$sig" 20 || fail "SIG$sig: no step 20: $(tail -3 "$WORK/sig$sig.err")"
  kill -"$sig" "$(master)"
  run_wait
  [ "$RC" = 0 ] || fail "SIG$sig: exit $RC: $(tail -3 "$WORK/sig$sig.err")"
  [ -s "$WORK/ckpt-$sig/latest" ] || fail "SIG$sig: no checkpoint: $(grep -E 'stop|checkpoint' "$WORK/sig$sig/events.log")"
  latest=$(cat "$WORK/ckpt-$sig/latest")
  step=$((10#${latest#step-}))
  [ "$step" -ge 20 ] && [ "$step" -lt $((STEPS - 1)) ] \
    || fail "SIG$sig: the checkpoint is of step $step, not one of 20..$((STEPS - 2))"
  "$OB_BIN/ob-ckpt" verify "$WORK/ckpt-$sig/$latest" > /dev/null || fail "SIG$sig: $latest does not verify"
  grep -q " stop .*saved the checkpoint of step $step$" "$WORK/sig$sig/events.log" \
    || fail "SIG$sig: no stop line naming the checkpoint: $(grep -E ' stop' "$WORK/sig$sig/events.log")"
  last=$(max_step "$WORK/sig$sig.pb")
  [ "$last" -lt $((STEPS - 1)) ] || fail "SIG$sig: trained to the end instead of stopping"
  wait_for 5 no_tagged || fail "SIG$sig: processes left behind: $(tagged)"
  echo "$NAME: SIG$sig at step >= 20: exit 0, $latest verifies, stopped after step $last"
done

# Under nohup(1), which ignores SIGHUP, it stays ignored: the run outlives
# its terminal.
RUN_WRAP=nohup run_start nohup 12 --standby off
wait_step nohup 3 || fail "nohup: no step 3: $(tail -3 "$WORK/nohup.err")"
kill -HUP "$(master)"
run_wait
[ "$RC" = 0 ] && [ "$(max_step "$WORK/nohup.pb")" = 11 ] \
  || fail "nohup: SIGHUP stopped the run: exit $RC, last step $(max_step "$WORK/nohup.pb"): $(tail -3 "$WORK/nohup.err")"

run_start resumed "$STEPS" --ckpt-dir "$WORK/ckpt-TERM" --resume auto --standby off
run_wait
[ "$RC" = 0 ] || fail "resumed run: exit $RC: $(tail -3 "$WORK/resumed.err")"
python3 "$METRICS_PY" compare "$WORK/resumed.pb" "$WORK/ref.pb" 0 > "$WORK/cmp" || fail "resumed: $(cat "$WORK/cmp")"
[ "$(cat "$WORK/ckpt-TERM/latest" 2>/dev/null)" = "step-$(printf %012d $((STEPS - 1)))" ] ||
  fail "resumed run: the latest checkpoint is '$(cat "$WORK/ckpt-TERM/latest")', not its last step's: $(grep -E ' checkpoint' "$WORK/resumed/events.log")"
"$OB_BIN/ob-ckpt" verify "$WORK/ckpt-TERM/$(cat "$WORK/ckpt-TERM/latest")" > /dev/null ||
  fail "resumed run: the last step's checkpoint does not verify"
echo "$NAME: resumed: $(cat "$WORK/cmp"); its last step saved"

# A second signal does not wait for the checkpoint.
run_start twice "$STEPS" --ckpt-dir "$WORK/ckpt-twice"
wait_step twice 5 || fail "no step 5: $(tail -3 "$WORK/twice.err")"
m=$(master)
kill -TERM "$m"
requested() { grep -q " checkpoint-request " "$WORK/twice/events.log"; }
wait_for 5 requested || fail "no checkpoint request after SIGTERM: $(tail -3 "$WORK/twice.err")"
kill -TERM "$m"
run_wait
[ "$RC" = 75 ] || fail "second signal: exit $RC, expected 75: $(tail -3 "$WORK/twice.err")"
grep -q "ob-launch: got Terminated: stopped without saving: steps 0-[0-9]*, trained since the start, are not on disk$" \
  "$WORK/twice.err" || fail "second signal: no line naming the lost steps: $(tail -3 "$WORK/twice.err")"
[ "$(grep -c ' stop-request ' "$WORK/twice/events.log")" = 2 ] || fail "not two stop requests: $(grep stop "$WORK/twice/events.log")"
! grep -q " stop .*saved the checkpoint" "$WORK/twice/events.log" || fail "the second signal waited for the checkpoint"
wait_for 5 no_tagged || fail "processes left behind: $(tagged)"

run_start plain "$STEPS" --standby off
wait_step plain 5 || fail "no step 5: $(tail -3 "$WORK/plain.err")"
kill -TERM "$(master)"
run_wait
[ "$RC" = 75 ] || fail "SIGTERM without --ckpt-dir: exit $RC, expected 75: $(tail -3 "$WORK/plain.err")"
grep -q "stopped without saving: steps 0-[0-9]*, trained since the start, are not on disk (no --ckpt-dir)$" \
  "$WORK/plain.err" || fail "SIGTERM without --ckpt-dir: no line naming the lost steps: $(tail -3 "$WORK/plain.err")"
[ "$(max_step "$WORK/plain.pb")" -lt $((STEPS - 1)) ] || fail "SIGTERM without --ckpt-dir: trained to the end"
wait_for 5 no_tagged || fail "processes left behind: $(tagged)"
echo "$NAME: ok"
