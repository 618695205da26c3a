#!/usr/bin/env bash
# ob-watch --attach --act on a NaN loss (issue 6, acceptance 3): 4 local
# hosts, 2 pipelines of 2 stages, checkpoints every 10 steps, rank 0 reports
# a NaN loss for step 25 (ob-launch --inject). ob-watch raises a loss-NaN
# event at step 25 and asks the master to roll back; the master restarts
# every worker from the latest checkpoint (step 19) and training reaches its
# last step with finite losses. Without a checkpoint, the rollback stops the
# run with exit 65.
NAME=watch_nan
source "$(dirname "$0")/../lib/launch.sh"
[ -x "$OB_BIN/ob-watch" ] || fail "no $OB_BIN/ob-watch"
command -v python3 >/dev/null || skip "no python3"
make_two_by_two
STEPS=60

# watched RUN [DURING] [ob-launch flags...]: a run with ob-watch --act
# attached, calling the function DURING while it trains; RC, WRC.
watched() {
  local run=$1 during=:; shift
  [[ "${1:-}" != -* && $# -gt 0 ]] && { during=$1; shift; }
  run_start "$run" "$STEPS" --inject "0:nan=25" "$@"
  wait_for 30 test -S "$WORK/$run/control.sock" || fail "no control socket: $(tail -3 "$WORK/$run.err")"
  # Only the NaN is under test: two cores shared by four workers make
  # stragglers of their own, which the master would keep anyway.
  timeout 120 "$OB_BIN/ob-watch" --attach "$WORK/$run" --act --json --straggler-ratio 10 \
    > "$WORK/$run.events" 2> "$WORK/$run.watch" &
  local watch=$!
  "$during"
  run_wait
  wait "$watch"; WRC=$?
}

watched rollback --ckpt-dir "$WORK/ckpt" --ckpt-every 10
[ "$RC" = 0 ] || fail "exit $RC: $(tail -3 "$WORK/rollback.err")"
# Each run has an id of its own, named in events.log and on every record.
RUN_ID=$(sed -n 's/.* run id=\([0-9a-f]\{16\}\) pid=.*/\1/p' "$WORK/rollback/events.log")
[ -n "$RUN_ID" ] || fail "events.log names no run: $(head -3 "$WORK/rollback/events.log")"
python3 - "$WORK/rollback.events" "$RUN_ID" <<'PY' || fail "events: $(cut -c 1-300 "$WORK/rollback.events")"
import json, sys
events = [json.loads(l) for l in open(sys.argv[1])]
nan = [e for e in events if e["kind"] == "EVENT_LOSS_NAN"]
assert nan and int(nan[0]["step"]) == 25, nan
acts = [e for e in events if e["kind"] == "EVENT_ACTION"]
# The request names the run its evidence came from: this one's.
run = sys.argv[2]
assert acts and acts[0]["request"].startswith("run=%s rollback" % run), (run, acts)
assert nan[0]["run"] == run and acts[0]["run"] == run, (run, nan[0], acts[0])
assert acts[0]["evidence"]["ok"] == 1, acts[0]
print("watch_nan: NaN at step %s; %s" % (nan[0]["step"], acts[0]["request"][:60]))
PY
grep -q "decide generation=2 rollback to .*step-0*19: " "$WORK/rollback/events.log" \
  || fail "no rollback to step 19: $(grep decide "$WORK/rollback/events.log")"
[ "$(max_step "$WORK/rollback.pb")" = $((STEPS - 1)) ] || fail "did not reach the last step"
python3 - "$WORK/rollback.pb" "$RUN_ID" "$(dirname "$METRICS_PY")" <<'PY' || fail "--metrics records without the run's id"
import sys
sys.path.insert(0, sys.argv[3])
import metrics
frames = [f for _, f in metrics.frames(open(sys.argv[1], "rb").read())]
runs = {f.get(46, b"").decode() for f in frames if not f.get(metrics.HEARTBEAT)}
assert runs == {sys.argv[2]}, runs
assert all(46 not in f for f in frames if f.get(metrics.HEARTBEAT)), "a heartbeat carries the run"
PY
python3 "$METRICS_PY" check "$WORK/rollback.pb" "$STEPS" 4 > /dev/null || fail "metrics after the rollback"

# A host that is slow, not failed, stays when the plan would run slower or
# with fewer than f + 1 pipelines without it (here: one pipeline left).
kept() {
  wait_step nockpt 3 || return 0  # a stopped run answers nothing; the next checks say why
  local host="${TAG}h2" answer run
  # Evidence of another run (another job's metrics piped to ob-watch --act)
  # does not steer this one; "status" names this run.
  answer=$(control "$WORK/nockpt/control.sock" "status")
  run=$(sed -n 's/.*"run":"\([0-9a-f]\{16\}\)".*/\1/p' <<< "$answer")
  [ -n "$run" ] && grep -q " run id=$run " "$WORK/nockpt/events.log" || fail "status names no run: $answer"
  answer=$(control "$WORK/nockpt/control.sock" "run=00000000000000ff stop straggler: from another run")
  case "$answer" in
    *'"ok":false'*"this request is for run 00000000000000ff, and this master runs run $run"*) ;;
    *) fail "a request of another run answered: $answer" ;;
  esac
  answer=$(control "$WORK/nockpt/control.sock" "exclude $host slow=1.2 straggler: from the test")
  case "$answer" in
    *'"ok":false'*"kept $host: without it 1 pipeline would remain"*) echo "$NAME: slow host kept: ${answer:0:160}" ;;
    *) fail "exclude slow=1.2 answered: $answer" ;;
  esac
}
watched nockpt kept
grep -q " keep host=${TAG}h2 " "$WORK/nockpt/events.log" || fail "the master did not record keeping the slow host"
[ "$RC" = 65 ] || fail "rollback without a checkpoint: exit $RC, expected 65: $(tail -3 "$WORK/nockpt.err")"
grep -q "no checkpoint to roll back to" "$WORK/nockpt.err" || fail "no reason given: $(tail -2 "$WORK/nockpt.err")"
wait_for 5 no_tagged || fail "processes left behind: $(tagged)"
echo "$NAME: ok"
