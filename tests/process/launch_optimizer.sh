#!/usr/bin/env bash
# Optimizer and schedule flags (issue 12): 2 local hosts, 12 steps.
#  1. they reach the workers: a run with other settings trains otherwise
#     (from step 1 on: the first update differs), and an --lr too small for
#     std::to_string's six decimals (3e-7) reaches them (it once became 0);
#  2. checkpoints record them (manifest.json's optimizer);
#  3. a resume with other settings is allowed and says so: a resume-change
#     line per setting in events.log, and a warning;
#  4. out-of-range values are usage errors before any host starts.
NAME=launch_optimizer
source "$(dirname "$0")/../lib/launch.sh"
command -v python3 >/dev/null || skip "no python3"
make_cluster 2
STEPS=12
reference_run "$STEPS"

KNOBS=(--lr-schedule constant --min-lr 0 --weight-decay 0 --beta1 0.8 --beta2 0.99 --eps 1e-6 --clip-norm 0.05)
run_start knobs "$STEPS" "${KNOBS[@]}" --ckpt-dir "$WORK/ck" --ckpt-every 6 --standby off
run_wait
[ "$RC" = 0 ] || fail "run with optimizer flags: exit $RC: $(tail -3 "$WORK/knobs.err")"
python3 - "$METRICS_PY" "$WORK/ref.pb" "$WORK/knobs.pb" <<'PY' || fail "the flags did not change training"
import importlib.util, sys
spec = importlib.util.spec_from_file_location("metrics", sys.argv[1])
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
ref, knobs = (m.losses(m.records(p)) for p in sys.argv[2:4])
assert ref[0] == knobs[0], (ref[0], knobs[0])          # the same weights and data
assert all(abs(ref[s] - knobs[s]) > 1e-6 for s in range(1, 12)), [(ref[s], knobs[s]) for s in range(12)]
PY
python3 - "$WORK/ck/step-000000000011/manifest.json" <<'PY' || fail "manifest.json lacks the settings: $(cat "$WORK/ck/step-000000000011/manifest.json")"
import json, sys
o = json.load(open(sys.argv[1]))["optimizer"]
want = {"lrSchedule": "constant", "beta1": 0.8, "beta2": 0.99, "eps": 1e-6, "clipNorm": 0.05, "steps": "12"}
for k, v in want.items():
    got = o.get(k, o.get("".join("_" + c.lower() if c.isupper() else c for c in k)))
    assert got == v, (k, got, v)
assert o.get("weightDecay", o.get("weight_decay", 0)) == 0
PY

# A resume with another weight decay and clip norm: allowed, and said.
run_start resumed 18 "${KNOBS[@]/0.05/0.5}" --ckpt-dir "$WORK/ck" --resume "$WORK/ck/step-000000000005" --standby off
run_wait
[ "$RC" = 0 ] || fail "resume with other settings: exit $RC: $(tail -3 "$WORK/resumed.err")"
grep -q " resume-change clip_norm 0.05 -> 0.5$" "$WORK/resumed/events.log" \
  || fail "no resume-change line for the clip norm: $(grep resume "$WORK/resumed/events.log")"
grep -q " resume-change steps 12 -> 18$" "$WORK/resumed/events.log" \
  || fail "no resume-change line for --steps: $(grep resume "$WORK/resumed/events.log")"
[ "$(grep -c ' resume-change ' "$WORK/resumed/events.log")" = 2 ] \
  || fail "unchanged settings reported: $(grep resume-change "$WORK/resumed/events.log")"
grep -q "warning: resuming with another optimizer setting than the checkpoint's: clip_norm" "$WORK/resumed.err" \
  || fail "no warning on stderr: $(grep -i resum "$WORK/resumed.err")"

run_start tiny 3 --lr 3e-7 --standby off
run_wait
[ "$RC" = 0 ] || fail "--lr 3e-7: exit $RC: $(tail -3 "$WORK/tiny.err")"
grep -q "worker\[0\]: info: optimizer: AdamW lr 3e-07 (0 warm-up steps, then cosine to 0 at step 3), weight decay 0.1, betas 0.9/0.95, eps 1e-08, clip norm 1$" \
  "$WORK/tiny.err" || fail "--lr 3e-7 did not reach the workers: $(grep optimizer "$WORK/tiny.err")"

for bad in "--weight-decay -1" "--beta1 1" "--beta2 -0.1" "--eps 0" "--clip-norm -1" "--min-lr 1" "--lr-schedule linear"; do
  # shellcheck disable=SC2086
  "$OB_BIN/ob-launch" --rsh local --secret-file "$WORK/secret" --run-dir "$WORK/bad" $bad \
    "$WORK/plan.pb" "$WORK/hosts.txt" 2> "$WORK/bad.err"
  rc=$?
  [ "$rc" = 64 ] && [ "$(grep -c . "$WORK/bad.err")" = 1 ] || fail "$bad: exit $rc: $(cat "$WORK/bad.err")"
  ! grep -qs agent-start "$WORK/bad/events.log" || fail "$bad: hosts were started"
done
echo "$NAME: ok"
