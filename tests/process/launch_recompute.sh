#!/usr/bin/env bash
# Activation recomputation in the run (issue 56, acceptance 1): local hosts,
# fp32, the plan's mode for every stage (ob-plan --recompute).
#  1. For gpt-tiny and llama-tiny, 2 pipelines x 2 stages (4 hosts) and one
#     tp-2 pipeline (1 host x 2 slots) each train 20 steps with none,
#     selective and full: selective's and full's losses are none's of the
#     same layout bit for bit (the recomputed forward takes the same paths:
#     model/recompute.h), the plans say which mode every stage runs, and
#     every worker says its backwards recomputed;
#  2. llama-tiny on the 2 x 2 layout with full recomputation and f = 1:
#     kill -9 of host h2 at step 12 (generation 1 parked before step 14, so
#     the run is still going on any machine): recovered in place from the
#     replicas' snapshots, every loss the uninterrupted run's within 1e-4;
#  3. recovery onto a template that fits only with recomputation (issue 56,
#     acceptance 4): llama-tiny, GPUs of 17.7 MiB, f = 1, pipelines 2,2:
#     the 2-node template runs none, the 1-node one recomputes (selective:
#     the one stage holds the embed's state too). kill -9 of h4 at step 12:
#     the survivors re-instantiate on 2 + 1 nodes (or 1 + 1 + 1), the 1-node
#     pipeline's worker recomputes, the memory line of generation 2 shows
#     it fitting, and every loss is the uninterrupted run's within 1e-4.
NAME=launch_recompute
source "$(dirname "$0")/../lib/launch.sh"
command -v python3 >/dev/null || skip "no python3"
(umask 077; echo "secret-$TAG-for-the-tests" > "$WORK/secret")
STEPS=20

modes_of() {  # the plan's stages' modes, one word each
  python3 - "$1" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))["templates"]
print(" ".join(sorted({s.get("recompute", "RECOMPUTE_NONE") for x in t for s in x["stages"]})))
PY
}

blocked_ranks() {  # the instantiation's ranks whose stage holds a block
  python3 - "$1" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
layers = p["profile"]["layers"]
blocks = {i for i, l in enumerate(layers) if l.get("kind") == "LAYER_BLOCK"}
t = {x["nodes"]: x for x in p["templates"]}
n = 0
for pipe in p["instantiation"]["pipelines"]:
    for s in t[pipe["template_nodes"]]["stages"]:
        if blocks & set(range(s.get("first_layer", 0), s["last_layer"] + 1)):
            n += s["tensor_parallel"]
print(n)
PY
}

for MODEL in gpt-tiny llama-tiny; do
  "$OB_BIN/ob-profile" --model "$MODEL" --analytic --gpu h100 --dtype float32 --seq-len 32 -b 1,4 -q \
    -o "$WORK/tiny.pb" || fail "ob-profile $MODEL"
  for mode in none selective full; do
    plan_hosts "pp-$mode" h1 h2 h3 h4 -- -g 1 -f 1 --pipelines 2,2 --gpu-memory 0.1 --recompute "$mode"
    plan_hosts "tp-$mode" "h1 slots=2" -- -g 2 --tp 2 -f 0 -b 4 --gpu-memory 0.1 --recompute "$mode"
    want="RECOMPUTE_$(tr a-z A-Z <<< "$mode")"
    for layout in pp tp; do
      [ "$(modes_of "$WORK/$layout-$mode.json")" = "$want" ] \
        || fail "$MODEL $layout --recompute $mode: stages run $(modes_of "$WORK/$layout-$mode.json")"
      run="$MODEL-$layout-$mode"
      RUN_PLAN="$WORK/$layout-$mode.pb" RUN_HOSTS="$WORK/$layout-$mode.hosts" run_start "$run" "$STEPS" --standby off
      run_wait
      [ "$RC" = 0 ] || fail "$run: exit $RC: $(tail -3 "$WORK/$run.err")"
      # Every worker of a stage with blocks ran the plan's mode: its first
      # step recomputed (a stage of the embed alone has nothing to).
      if [ "$mode" != none ]; then
        ran=$(grep -cE "step 0: [1-9][0-9]* recomputation\(s\) in its backwards \($mode\)" "$WORK/$run.err")
        holders=$(blocked_ranks "$WORK/$layout-$mode.json")
        [ "$ran" = "$holders" ] \
          || fail "$run: $ran of $holders workers with blocks say they recomputed: $(grep -m2 recomputation "$WORK/$run.err")"
      fi
    done
  done
  for layout in pp tp; do
    for mode in selective full; do
      run="$MODEL-$layout-$mode"
      python3 "$METRICS_PY" compare "$WORK/$MODEL-$layout-none.pb" "$WORK/$run.pb" 0 > "$WORK/$run.cmp" \
        || fail "$run against none: $(cat "$WORK/$run.cmp")"
      echo "$NAME: $run against none: $(cat "$WORK/$run.cmp")"
    done
  done
done
wait_for 3 no_tagged || fail "processes left behind: $(tagged)"

# 2. kill -9 with full recomputation: the llama-tiny 2 x 2 plan (f = 1).
cp "$WORK/llama-tiny-pp-full.pb" "$WORK/ref.pb"
export OB_INJECT_RELEASE="$WORK/release"
RUN_PLAN="$WORK/pp-full.pb" RUN_HOSTS="$WORK/pp-full.hosts" run_start kill "$STEPS" \
  --inject "0:park=14;1:park=14;2:park=14;3:park=14"
RUN_PLAN="$WORK/pp-full.pb" RUN_HOSTS="$WORK/pp-full.hosts" kill_host_at kill 12 "${TAG}h2"
check_recovered kill "$STEPS" "kill -9 of ${TAG}h2 with full recomputation"
echo "$NAME: kill -9 of ${TAG}h2 at step 12, full recomputation: $(cat "$WORK/kill.cmp")"

# 3. A smaller template that fits only with recomputation.
plan_hosts p-shrink h1 h2 h3 h4 -- -g 1 -f 1 -b 4 --pipelines 2,2 --gpu-memory 0.0173
small=$(python3 - "$WORK/p-shrink.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
t = {x["nodes"]: [s.get("recompute", "RECOMPUTE_NONE") for s in x["stages"]] for x in p["templates"]}
assert len(t[1]) == 1 and t[1][0] != "RECOMPUTE_NONE", t
assert set(t[2]) == {"RECOMPUTE_NONE"}, t
assert [x["template_nodes"] for x in p["instantiation"]["pipelines"]] == [2, 2], p["instantiation"]
print(t[1][0].split("_")[1].lower())
PY
) || fail "not the plan this case is about"

RUN_PLAN="$WORK/p-shrink.pb" RUN_HOSTS="$WORK/p-shrink.hosts" reference_run "$STEPS"
RUN_PLAN="$WORK/p-shrink.pb" RUN_HOSTS="$WORK/p-shrink.hosts" run_start shrink "$STEPS" \
  --inject "0:park=14;1:park=14;2:park=14;3:park=14"
RUN_PLAN="$WORK/p-shrink.pb" RUN_HOSTS="$WORK/p-shrink.hosts" kill_host_at shrink 12 "${TAG}h4"
check_recovered shrink "$STEPS" "kill -9 of ${TAG}h4, onto a template that recomputes"
mem=$(grep " memory generation=2 " "$WORK/shrink/events.log") || fail "shrink: no memory line for generation 2"
[[ "$mem" == *" $small"* && "$mem" == *"every stage fits"* ]] || fail "shrink: generation 2: $mem"
grep -qE "generation 2: pipeline [0-9]+ stage 0 layers 0-5, .*recomputation $small" "$WORK/shrink.err" \
  || fail "shrink: no worker of generation 2 runs the 1-node template with $small recomputation"
echo "$NAME: kill -9 of ${TAG}h4: $(grep -m1 " decide generation=2 " "$WORK/shrink/events.log" | cut -c1-160)"
echo "$NAME: ${mem#* memory }"
echo "$NAME: $(cat "$WORK/shrink.cmp")"
echo "$NAME: ok"
