#!/usr/bin/env bash
# Checkpoints from ob-launch (issue 5; design/ckpt.md), 4 local hosts in 2
# pipelines of 2 stages, f = 1, 40 steps, --ckpt-every 10:
#  1. round trip: a run killed (kill -9 of the master) after the step-19
#     checkpoint is committed, then --resume auto: steps 20..39 have the
#     uninterrupted run's losses exactly; the same checkpoint loaded under a
#     3-stage plan and under one process trains on with the same losses
#     (within 1e-4: other layouts sum in another order);
#     the checkpoint resumed under a plan of the same model from a config
#     file (a model named by its path, not "gpt-tiny"): trains on (before
#     2026-11-29 refused, as if another model); under a plan of a model
#     with other heads (the same weights' shapes): refused before any host
#     starts, exit 78, naming n_head both ways; a second run with the same
#     --metrics keeps the first's records as FILE.1;
#  2. beyond f: with every replica of the first stage's layers killed, the
#     master restarts the survivors from the latest checkpoint and reaches
#     the last step; no more than 10 steps are redone.
NAME=launch_ckpt
source "$(dirname "$0")/../lib/launch.sh"
command -v python3 >/dev/null || skip "no python3"
make_two_by_two
STEPS=40
CKPT=(--ckpt-dir "$WORK/ckpt" --ckpt-every 10)

reference_run "$STEPS"

# 1. Killed after the step-19 checkpoint, resumed.
run_start first "$STEPS" "${CKPT[@]}"
committed() { grep -q " checkpoint step=19 " "$WORK/first/events.log" 2>/dev/null; }
wait_for 60 committed || fail "no checkpoint of step 19: $(tail -3 "$WORK/first.err")"
kill -9 $(pgrep -P "$MASTER_PID" -x ob-launch)  # the master itself, not its timeout(1)
run_wait
wait_for 5 no_tagged || fail "processes left after kill -9 of the master: $(tagged)"
"$OB_BIN/ob-ckpt" ls "$WORK/ckpt" > "$WORK/ls" || fail "ob-ckpt ls: $(cat "$WORK/ls")"
latest=$(readlink -f "$WORK/ckpt/$(cat "$WORK/ckpt/latest")")
"$OB_BIN/ob-ckpt" verify "$latest" > /dev/null || fail "the latest checkpoint does not verify"
cp -r "$latest" "$WORK/step19"  # kept aside: --ckpt-keep below prunes the original
latest="$WORK/step19"

run_start resumed "$STEPS" "${CKPT[@]}" --ckpt-keep 2 --resume auto --standby off
run_wait
[ "$RC" = 0 ] || fail "resumed run: exit $RC: $(tail -3 "$WORK/resumed.err")"
grep -q " resume generation=1 from .*step-0*19$" "$WORK/resumed/events.log" \
  || fail "did not resume from step 19: $(grep resume "$WORK/resumed/events.log")"
python3 "$METRICS_PY" compare "$WORK/resumed.pb" "$WORK/ref.pb" 0 > "$WORK/cmp" || fail "resumed: $(cat "$WORK/cmp")"
echo "$NAME: resumed in the same layout: $(cat "$WORK/cmp")"
kept=$(cd "$WORK/ckpt" && ls -d step-* | tr '\n' ' ')
[ "$kept" = "step-000000000029 step-000000000039 " ] || fail "--ckpt-keep 2 kept: $kept"

# A damaged checkpoint is refused before any host starts: exit 65 naming the file.
cp -r "$latest" "$WORK/ckpt-damaged"
python3 - "$WORK/ckpt-damaged/layer-0002.safetensors" <<'PY'
import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(-100, 2)
    b = f.read(1)
    f.seek(-100, 2)
    f.write(bytes([b[0] ^ 0xFF]))
PY
run_start damaged "$STEPS" --resume "$WORK/ckpt-damaged"
run_wait
[ "$RC" = 65 ] || fail "damaged checkpoint: exit $RC, expected 65: $(tail -2 "$WORK/damaged.err")"
grep -q "layer-0002.safetensors" "$WORK/damaged.err" || fail "the damaged file is not named: $(tail -2 "$WORK/damaged.err")"
! grep -qs agent-start "$WORK/damaged/events.log" || fail "hosts were started for a damaged checkpoint"

# "checkpoint" on the control socket: a save at the next step, whatever
# --ckpt-every says (0 here).
run_start now "$STEPS" --ckpt-dir "$WORK/ckpt-now" --standby off
wait_step now 5 || fail "no step 5: $(tail -3 "$WORK/now.err")"
control "$WORK/now/control.sock" "checkpoint from the test" | grep -q '"ok":true' \
  || fail "checkpoint request refused"
run_wait
[ "$RC" = 0 ] || fail "checkpoint-now run: exit $RC"
grep -q " checkpoint step=[0-9]* " "$WORK/now/events.log" || fail "no checkpoint after the request"
"$OB_BIN/ob-ckpt" verify "$WORK/ckpt-now/$(cat "$WORK/ckpt-now/latest")" >/dev/null \
  || fail "the requested checkpoint does not verify"
echo "$NAME: checkpoint on request: $(grep -o 'checkpoint step=[0-9]*' "$WORK/now/events.log" | tr '\n' ' ')"
# The same --metrics again (a job restarted with its command line): the
# first run's records are kept as FILE.1 (before 2026-11-29 truncated).
timeout 60 "$OB_BIN/ob-launch" --rsh local --secret-file "$WORK/secret" --run-dir "$WORK/again" --steps 3 \
  --data "$OB_SOURCE_DIR/tests/data/corpus.txt" --metrics "$WORK/now.pb" --standby off "$WORK/plan.pb" \
  "$WORK/hosts.txt" 2> "$WORK/again.err" || fail "the same --metrics again: exit $?: $(tail -2 "$WORK/again.err")"
python3 "$METRICS_PY" check "$WORK/now.pb.1" "$STEPS" 4 > /dev/null || fail "the first run's metrics were not kept"
python3 "$METRICS_PY" check "$WORK/now.pb" 3 4 > /dev/null || fail "the second run's metrics"
grep -q "the records there before are kept in $WORK/now.pb.1" "$WORK/again.err" || fail "no line says where they were kept"
echo "$NAME: the same --metrics again: the first run's $STEPS steps kept in now.pb.1"

# ... and in other layouts: one 3-stage pipeline, and a single process.
for layout in three:3:0.008 one:1:1; do
  IFS=: read -r name n mem <<< "$layout"
  : > "$WORK/hosts-$name.txt"
  for ((i = 1; i <= n; i++)); do echo "${TAG}h$i" >> "$WORK/hosts-$name.txt"; done
  "$OB_BIN/ob-plan" --hosts "$WORK/hosts-$name.txt" -g 1 -f 0 -B 8 --gpu-memory "$mem" \
    --overhead-gib 0 -o "$WORK/plan-$name.pb" "$WORK/tiny.pb" || fail "ob-plan ($name)"
  RUN_PLAN="$WORK/plan-$name.pb" RUN_HOSTS="$WORK/hosts-$name.txt" run_start "$name" "$STEPS" --resume "$latest" --standby off
  run_wait
  [ "$RC" = 0 ] || fail "resumed as $name: exit $RC: $(tail -3 "$WORK/$name.err")"
  python3 "$METRICS_PY" compare "$WORK/$name.pb" "$WORK/ref.pb" 1e-4 > "$WORK/cmp" \
    || fail "resumed as $name: $(cat "$WORK/cmp")"
  echo "$NAME: resumed on $n host(s): $(cat "$WORK/cmp")"
done

# ... under a plan of gpt-tiny from a config file (named by its path), and
# of a model with other heads: the weights' shapes are the same.
for heads in 4 8; do
  printf 'n_layer: 4\nn_embd: 128\nn_head: %s\nn_positions: 64\nvocab_size: 256\n' "$heads" > "$WORK/tiny$heads.yaml"
  "$OB_BIN/ob-profile" --model "$WORK/tiny$heads.yaml" --analytic --gpu h100 --dtype float32 --seq-len 32 \
    -o "$WORK/tiny$heads.pb" || fail "ob-profile (tiny$heads.yaml)"
  "$OB_BIN/ob-plan" --hosts "$WORK/hosts-one.txt" -g 1 -f 0 -B 8 --gpu-memory 1 --overhead-gib 0 \
    -o "$WORK/plan-heads$heads.pb" "$WORK/tiny$heads.pb" || fail "ob-plan (tiny$heads.yaml)"
  RUN_PLAN="$WORK/plan-heads$heads.pb" RUN_HOSTS="$WORK/hosts-one.txt" run_start "heads$heads" "$STEPS" \
    --resume "$latest" --standby off
  run_wait
  [ "$heads" = 8 ] || [ "$RC" = 0 ] || fail "resumed under a plan of tiny$heads.yaml: exit $RC: $(tail -2 "$WORK/heads$heads.err")"
done
[ "$RC" = 78 ] || fail "resumed as a model of 8 heads: exit $RC, expected 78: $(tail -2 "$WORK/heads8.err")"
line=$(tail -1 "$WORK/heads8.err")
[ "$line" = "ob-launch: $latest: holds another model than the plan's (n_head 4 there, 8 in the plan; gpt-tiny there, $WORK/tiny8.yaml in the plan)" ] \
  || fail "resumed as a model of 8 heads: $line"
! grep -qs agent-start "$WORK/heads8/events.log" || fail "hosts were started for another model"
echo "$NAME: resumed as a model of 8 heads: $line"
python3 "$METRICS_PY" compare "$WORK/heads4.pb" "$WORK/ref.pb" 1e-4 > "$WORK/cmp" \
  || fail "resumed under a plan of tiny4.yaml: $(cat "$WORK/cmp"; tail -2 "$WORK/heads4.err")"
echo "$NAME: resumed under a plan of gpt-tiny from a config file: $(cat "$WORK/cmp")"

# 2. Beyond f: both first stages (every replica of layers 0-1) killed.
rm -rf "$WORK/ckpt"
read -r first_a first_b < <(python3 - "$WORK/plan.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))["instantiation"]["pipelines"]
print(p[0]["nodes"][0], p[1]["nodes"][0])
PY
)
run_start beyond "$STEPS" "${CKPT[@]}"
committed() { grep -q " checkpoint step=19 " "$WORK/beyond/events.log" 2>/dev/null; }
wait_for 60 committed || fail "no checkpoint of step 19: $(tail -3 "$WORK/beyond.err")"
kill -9 $(host_pids "$first_a") $(host_pids "$first_b")
killed_at=$(max_step "$WORK/beyond.pb")
run_wait
[ "$RC" = 0 ] || fail "beyond f: exit $RC: $(tail -3 "$WORK/beyond.err")"
grep -q "decide generation=2 lost hosts .*no surviving replica.*; restarting from checkpoint .*step-0*19 " \
  "$WORK/beyond/events.log" || fail "no restart from the checkpoint: $(grep decide "$WORK/beyond/events.log")"
rec=$(grep " recovered generation=2 from_step=19 " "$WORK/beyond/events.log") || fail "no recovery logged"
[ $((killed_at - 19)) -le 10 ] || fail "$((killed_at - 19)) steps redone (> 10)"
python3 "$METRICS_PY" compare "$WORK/ref.pb" "$WORK/beyond.pb" 1e-4 > "$WORK/cmp" || fail "beyond f: $(cat "$WORK/cmp")"
wait_for 3 no_tagged || fail "processes left behind: $(tagged)"
echo "$NAME: beyond f: killed at step $killed_at, restarted after step 19: $(cat "$WORK/cmp"); ${rec#* recovered }"
echo "$NAME: ok"
