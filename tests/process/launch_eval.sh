#!/usr/bin/env bash
# Evaluation (issue 12, acceptance 1): gpt-tiny on 4 local hosts (2
# pipelines x 2 stages, f = 1), the last 10% of the corpus held out
# (--eval-split 0.1), evaluated every 25 steps over 2 fixed batches:
#  1. 100 steps: evaluations after steps 24, 49, 74 and 99, every rank
#     the same value, the loss falling; in events.log and the progress
#     line; the closing line names the last; one worker's evaluations
#     are the same within 1e-5;
#     --steps 0 --resume of its checkpoint of step 99 on one worker
#     evaluates to the same loss within 1e-5 and trains nothing (its
#     progress line shows no loss, and ob-watch finds nothing in its
#     metrics: the records are marked evaluation_only); with
#     --eval-data the training data, it warns that the loss is not held out
#     (there --resume names the checkpoint root: its newest is taken, named);
#  2. kill -9 of host 1 at step 60: the run recovers from snapshots and
#     every evaluation equals the uninterrupted run's within 1e-4;
#  3. bad flags exit 64 and a missing eval file 66 before any host starts,
#     one line each; a split too small for a sequence exits 65.
NAME=launch_eval
source "$(dirname "$0")/../lib/launch.sh"
command -v python3 >/dev/null || skip "no python3"
make_two_by_two
EVAL=(--eval-split 0.1 --eval-every 25 --eval-batches 2)

run_start ref 100 "${EVAL[@]}" --ckpt-dir "$WORK/ck" --ckpt-every 50 --standby off
run_wait
[ "$RC" = 0 ] || fail "uninterrupted run: exit $RC: $(tail -3 "$WORK/ref.err")"
python3 "$METRICS_PY" check "$WORK/ref.pb" 100 4 > /dev/null || fail "uninterrupted run's metrics"
python3 "$METRICS_PY" evals "$WORK/ref.pb" > "$WORK/ref.evals" || fail "evals: $(cat "$WORK/ref.evals")"
[ "$(cut -d' ' -f1 "$WORK/ref.evals" | xargs)" = "24 49 74 99" ] || fail "evaluated after: $(cat "$WORK/ref.evals")"
python3 - "$WORK/ref.evals" <<'PY' || fail "the eval loss does not fall: $(cat "$WORK/ref.evals")"
import sys
losses = [float(l.split()[1]) for l in open(sys.argv[1])]
assert losses[-1] < losses[0] - 0.1, losses
PY
grep -q " eval generation=1 step=99 loss=" "$WORK/ref/events.log" || fail "no eval in events.log"
grep -q "step 100/100  loss [0-9.]*  eval [0-9.]*  tokens/s" "$WORK/ref.err" || fail "no eval in the progress line"
grep -q "trained 100 steps: final loss [0-9.]*, eval loss [0-9.]*," "$WORK/ref.err" || fail "no eval in the closing line"
echo "$NAME: evaluations $(tr '\n' ' ' < "$WORK/ref.evals")"
# The same evaluations as one worker computes them (the model unsplit).
echo "${TAG}h0" > "$WORK/one.hosts"
"$OB_BIN/ob-plan" --hosts "$WORK/one.hosts" -g 1 -f 0 -B 8 --gpu-memory 1 --overhead-gib 0 \
  -o "$WORK/one.plan" "$WORK/tiny.pb" || fail "ob-plan for one worker"
RUN_PLAN="$WORK/one.plan" RUN_HOSTS="$WORK/one.hosts" run_start one 100 "${EVAL[@]}" --standby off
run_wait
[ "$RC" = 0 ] || fail "one worker: exit $RC: $(tail -3 "$WORK/one.err")"
python3 "$METRICS_PY" compare-evals "$WORK/one.pb" "$WORK/ref.pb" 1e-5 > "$WORK/one.cmp" \
  || fail "2 x 2 against one worker: $(cat "$WORK/one.cmp")"
echo "$NAME: 2 pipelines x 2 stages against one worker: $(cat "$WORK/one.cmp")"
# --steps 0 --resume: the checkpoint of step 99 evaluated on one worker.
RUN_PLAN="$WORK/one.plan" RUN_HOSTS="$WORK/one.hosts" run_start ckeval 0 --eval-split 0.1 --eval-batches 2 \
  --resume "$WORK/ck/step-000000000099"
run_wait
[ "$RC" = 0 ] || fail "--steps 0 --resume: exit $RC: $(tail -3 "$WORK/ckeval.err")"
python3 "$METRICS_PY" evals "$WORK/ckeval.pb" > "$WORK/ckeval.evals" || fail "$(cat "$WORK/ckeval.evals")"
python3 - "$WORK/ckeval.evals" "$WORK/ref.evals" <<'PY' || fail "checkpoint evaluated to $(cat "$WORK/ckeval.evals"), the run's: $(tail -1 "$WORK/ref.evals")"
import sys
got = open(sys.argv[1]).read().split()
want = open(sys.argv[2]).read().split()[-2:]
assert got[0] == want[0] == "99" and abs(float(got[1]) - float(want[1])) <= 1e-5 * float(want[1]), (got, want)
PY
grep -q "evaluated the weights after step 99: eval loss" "$WORK/ckeval.err" || fail "no closing line: $(tail -2 "$WORK/ckeval.err")"
grep -q "trained" "$WORK/ckeval.err" && fail "--steps 0 trained: $(grep trained "$WORK/ckeval.err")"
# Nothing trained is no NaN loss: not in the progress line, and not to
# ob-watch (before 2026-12-02: "loss nan" there, and a critical loss_nan).
grep -q "step 100  loss -  eval [0-9.]*  tokens/s -" "$WORK/ckeval.err" \
  || fail "--steps 0: progress line: $(grep -m1 'step 100 ' "$WORK/ckeval.err")"
"$OB_BIN/ob-watch" --json "$WORK/ckeval.pb" > "$WORK/ckeval.events" 2>&1 && [ ! -s "$WORK/ckeval.events" ] \
  || fail "ob-watch on the evaluation's metrics: $(head -3 "$WORK/ckeval.events")"
echo "$NAME: the checkpoint of step 99 evaluated alone: $(cat "$WORK/ckeval.evals")"
# --eval-data naming the training data: evaluated, with a warning that the
# loss is not a held-out one (a link to it too).
ln -s "$OB_SOURCE_DIR/tests/data/corpus.txt" "$WORK/corpus-link.txt"
# And --resume names the checkpoint root, not a checkpoint (issue 72): its
# newest verified one (step 99 of 49 and 99), named.
RUN_PLAN="$WORK/one.plan" RUN_HOSTS="$WORK/one.hosts" run_start sameeval 0 --eval-data "$WORK/corpus-link.txt" \
  --resume "$WORK/ck"
run_wait
[ "$RC" = 0 ] || fail "--eval-data the training data: exit $RC: $(tail -3 "$WORK/sameeval.err")"
grep -qF -- "--resume $WORK/ck is a checkpoint root: resuming from its newest verified checkpoint, $WORK/ck/step-000000000099 (step 99)" \
  "$WORK/sameeval.err" || fail "--resume ROOT did not name its checkpoint: $(grep -m2 -i "resum" "$WORK/sameeval.err")"
grep -q "evaluated the weights after step 99: eval loss" "$WORK/sameeval.err" \
  || fail "--resume ROOT: no closing line: $(tail -2 "$WORK/sameeval.err")"
grep -q "warn.*--eval-data $WORK/corpus-link.txt is the training data (--data .*corpus.txt): its loss is not a held-out one" \
  "$WORK/sameeval.err" || fail "no warning for --eval-data the training data: $(head -3 "$WORK/sameeval.err")"

run_start host 100 "${EVAL[@]}"
kill_host_at host 60 "${TAG}h1"
check_recovered host 100 "kill -9 of ${TAG}h1 at step 60"
python3 "$METRICS_PY" compare-evals "$WORK/ref.pb" "$WORK/host.pb" 1e-4 > "$WORK/host.cmp" \
  || fail "evaluations after the recovery: $(cat "$WORK/host.cmp")"
echo "$NAME: after the recovery: $(cat "$WORK/host.cmp")"

# refused RC PATTERN FLAGS...: ob-launch (--data $DATA, default the
# corpus; --steps $STEPS, default 3) exits RC at once with one line.
refused() {
  local want=$1 pattern=$2 rc
  shift 2
  timeout 30 "$OB_BIN/ob-launch" --rsh local --secret-file "$WORK/secret" --run-dir "$WORK/bad" --steps "${STEPS:-3}" \
    --data "${DATA:-$OB_SOURCE_DIR/tests/data/corpus.txt}" "$@" "$WORK/plan.pb" "$WORK/hosts.txt" 2> "$WORK/bad.err"
  rc=$?
  [ "$rc" = "$want" ] || fail "$*: exit $rc, expected $want: $(tail -3 "$WORK/bad.err")"
  [ "$(grep -c . "$WORK/bad.err")" = 1 ] || fail "$*: not one line: $(cat "$WORK/bad.err")"
  grep -q -- "$pattern" "$WORK/bad.err" || fail "$*: $(cat "$WORK/bad.err") (wanted: $pattern)"
  no_tagged || fail "$*: processes started: $(tagged)"
}
refused 64 "eval-split must be in \[0, 1)" --eval-split 1.5
refused 64 "need --eval-data or --eval-split" --eval-every 10
refused 64 "exclude each other" --eval-split 0.1 --eval-data "$OB_SOURCE_DIR/README.md"
refused 66 "/nonexistent" --eval-data /nonexistent
mkdir -p "$WORK/empty-root"
STEPS=0 refused 66 "empty-root: neither a checkpoint (no manifest.pb) nor a root holding a committed one" \
  --eval-data "$OB_SOURCE_DIR/README.md" --resume "$WORK/empty-root"
STEPS=0 refused 64 "steps 0 evaluates a checkpoint" --eval-split 0.1
head -c 40 "$OB_SOURCE_DIR/tests/data/corpus.txt" > "$WORK/short.txt"
DATA="$WORK/short.txt" refused 65 "short.txt: 40 tokens split 36 for training and 4 for evaluation" --eval-split 0.1
wait_for 3 no_tagged || fail "processes left behind: $(tagged)"
echo "$NAME: ok"
