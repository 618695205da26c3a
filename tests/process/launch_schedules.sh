#!/usr/bin/env bash
# Pipeline schedules in the run (issue 68, acceptance 1): local hosts,
# fp32, the plan's schedule for every template (ob-plan --schedule).
#  For gpt-tiny and llama-tiny, 2 pipelines x 2 stages (4 hosts) and one
#  pipeline of 2 stages at tensor parallelism 2 (2 hosts x 2 slots) each
#  train 40 steps under 1f1b, zb-h1, zb-h2, interleaved and zb-v (two
#  chunks a stage): the plans say which schedule every template runs, every
#  worker says it runs it, and every loss equals 1F1B's of the same layout
#  within 1e-6 relative (the weight gradients are the same sums in the same
#  order: model/weight_grads.h; a V sums the tied table's two parts on one
#  rank, in another order than 1F1B's all-reduce).
#  The chunked runs' workers name their layer ranges ("layers 0-1+4-5").
#  launch_schedules_recover.sh kills a host under each schedule.
NAME=launch_schedules
source "$(dirname "$0")/../lib/launch.sh"
command -v python3 >/dev/null || skip "no python3"
(umask 077; echo "secret-$TAG-for-the-tests" > "$WORK/secret")
STEPS=40

schedules_of() {  # the plan's templates' schedules, one word each
  python3 - "$1" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))["templates"]
print(" ".join(sorted({x.get("schedule") or "1f1b" for x in t})))
PY
}

for MODEL in gpt-tiny llama-tiny; do
  "$OB_BIN/ob-profile" --model "$MODEL" --analytic --gpu h100 --dtype float32 --seq-len 32 -b 1,2 -q \
    -o "$WORK/tiny.pb" || fail "ob-profile $MODEL"
  for sched in 1f1b zb-h1 zb-h2 interleaved zb-v; do
    plan_hosts "pp-$sched" h1 h2 h3 h4 -- -g 1 -f 1 --pipelines 2,2 --gpu-memory 0.1 --schedule "$sched"
    plan_hosts "tp-$sched" "h1 slots=2" "h2 slots=2" -- -g 2 --tp 2 -f 0 -b 2 --pipelines 2 --gpu-memory 0.1 \
      --schedule "$sched"
    for layout in pp tp; do
      # (a one-stage template has no chunks: it runs 1F1B)
      ran=$(schedules_of "$WORK/$layout-$sched.json")
      [ "$ran" = "$sched" ] || [ "$ran" = "1f1b $sched" ] || fail "$MODEL $layout --schedule $sched: templates run $ran"
      run="$MODEL-$layout-$sched"
      RUN_PLAN="$WORK/$layout-$sched.pb" RUN_HOSTS="$WORK/$layout-$sched.hosts" run_start "$run" "$STEPS" --standby off
      run_wait
      [ "$RC" = 0 ] || fail "$run: exit $RC: $(tail -3 "$WORK/$run.err")"
      ran=$(grep -c "generation 1: pipeline .* micro-batches per step, schedule $sched" "$WORK/$run.err")
      [ "$ran" = 4 ] || fail "$run: $ran of 4 workers say they run $sched: $(grep -m1 "micro-batches per step" "$WORK/$run.err")"
      if [ "$sched" = interleaved ] || [ "$sched" = zb-v ]; then
        grep -q "generation 1: pipeline 0 stage 0 layers [0-9]*-[0-9]*+[0-9]*-[0-9]*, " "$WORK/$run.err" \
          || fail "$run: stage 0 does not hold two ranges: $(grep -m1 "generation 1: pipeline 0 stage 0" "$WORK/$run.err")"
      fi
    done
  done
  for layout in pp tp; do
    for sched in zb-h1 zb-h2 interleaved zb-v; do
      run="$MODEL-$layout-$sched"
      python3 "$METRICS_PY" compare "$WORK/$MODEL-$layout-1f1b.pb" "$WORK/$run.pb" 1e-6 > "$WORK/$run.cmp" \
        || fail "$run against 1f1b: $(cat "$WORK/$run.cmp")"
      echo "$NAME: $run against 1f1b: $(cat "$WORK/$run.cmp")"
    done
  done
done
# Checkpoints of a chunked run load into any layout: llama-tiny's 2 x 2
# interleaved run saves after steps 9 and 19; step 9's resumes under zb-v
# (other ranges a rank) and 1f1b (one range), each loss of steps 10-19 the
# saving run's within 1e-6.
RUN_PLAN="$WORK/pp-interleaved.pb" RUN_HOSTS="$WORK/pp-interleaved.hosts" run_start ck "$STEPS" --standby off \
  --ckpt-dir "$WORK/ckpts" --ckpt-every 10
run_wait
[ "$RC" = 0 ] || fail "interleaved with checkpoints: exit $RC: $(tail -3 "$WORK/ck.err")"
[ -d "$WORK/ckpts/step-000000000009" ] || fail "no checkpoint of step 9: $(ls "$WORK/ckpts")"
for sched in zb-v 1f1b; do
  run_resumed "res-$sched" "$WORK/pp-$sched.pb" "$WORK/pp-$sched.hosts" "$STEPS" "$WORK/ckpts/step-000000000009" \
    "$WORK/ck.pb" 1e-6
  echo "$NAME: interleaved's checkpoint of step 9 resumed under $sched: $RESUMED"
done
wait_for 3 no_tagged || fail "processes left behind: $(tagged)"
echo "$NAME: ok"
