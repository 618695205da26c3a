#!/usr/bin/env bash
# Every plan ob-plan emits runs (issue 11, acceptance 2): for gpt-tiny (4
# heads) and a variant of it with 8 heads, ob-plan -g 2 and -g 4 on 2 to 6
# local hosts (slots = g), f = 1: whatever layout it picks (stages a node,
# tensor parallelism), ob-launch trains it for 3 steps and exits 0 with
# every rank's metrics (once per distinct layout: ranks, templates used). Not hand-written plans: the ones the planner
# chooses, so a planner choice the runtime cannot run fails here. Nothing
# fails in these runs: --standby off (no standby process is seen once a
# step is done; with standbys, each run would start twice the processes),
# and every worker is forked from its host's seed, which the agents say:
# a host loads LibTorch once, whatever its slots.
NAME=launch_every_plan
source "$(dirname "$0")/../lib/launch.sh"
command -v python3 >/dev/null || skip "no python3"
STEPS=3

cat > "$WORK/tiny8.yaml" <<'EOF'
name: gpt-tiny-8h
n_layer: 4
n_embd: 128
n_head: 8
n_positions: 64
vocab_size: 256
EOF
"$OB_BIN/ob-profile" --model gpt-tiny --analytic --gpu h100 --dtype float32 --seq-len 32 -q \
  -o "$WORK/tiny.pb" || fail "ob-profile gpt-tiny"
"$OB_BIN/ob-profile" --model "$WORK/tiny8.yaml" --analytic --gpu h100 --dtype float32 --seq-len 32 -q \
  -o "$WORK/tiny8.pb" || fail "ob-profile gpt-tiny-8h"
(umask 077; echo "secret-$TAG-for-the-tests" > "$WORK/secret")

layouts="" skipped=""
for model in tiny tiny8; do
  for g in 2 4; do
    for n in 2 3 4 5 6; do
      run="$model-g$g-n$n"
      for ((h = 1; h <= n; h++)); do echo "${TAG}h$h slots=$g"; done > "$WORK/$run.hosts"
      "$OB_BIN/ob-plan" --hosts "$WORK/$run.hosts" -g "$g" -f 1 -B 8 -o "$WORK/p-$run.pb" "$WORK/$model.pb" \
        2> "$WORK/p-$run.err" || fail "$run: ob-plan picked no plan: $(cat "$WORK/p-$run.err")"
      "$OB_BIN/ob-plan" --hosts "$WORK/$run.hosts" -g "$g" -f 1 -B 8 --json "$WORK/$model.pb" > "$WORK/p-$run.json" \
        || fail "$run: ob-plan --json"
      shape=$(python3 - "$WORK/p-$run.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
t = {x["nodes"]: x for x in p["templates"]}
used = [t[q["template_nodes"]] for q in p["instantiation"]["pipelines"]]
ranks = sum(len(x["stages"]) * x["stages"][0]["tensor_parallel"] for x in used)
print(ranks, "k%d/t%d" % (used[0]["stages_per_node"], used[0]["stages"][0]["tensor_parallel"]),
      "+".join(str(len(x["stages"])) for x in used))
PY
) || fail "$run: plan JSON"
      read -r ranks layout stages <<< "$shape"
      # The 8-head model is there for the layouts 4 heads rule out; where
      # the planner picks one already trained, a second run would only
      # repeat it (on two cores, half of this test's time).
      case " $layouts " in *":$ranks:$layout:$stages "*) skipped+=" $run"; continue ;; esac
      RUN_PLAN="$WORK/p-$run.pb" RUN_HOSTS="$WORK/$run.hosts" run_start "$run" "$STEPS" --standby off
      wait_step "$run" 1 || fail "$run: no step: $(tail -3 "$WORK/$run.err")"
      # A worker forked from its host's seed shows the command line of a
      # standby; one that trains has named itself ob-worker-RANK.
      # (One gone between two reads, a worker that finished, is no standby.)
      for p in $(pgrep -f -- "--standby-worker"); do
        grep -qsa "OB_HOST=$TAG" "/proc/$p/environ" || continue
        comm=$(cat "/proc/$p/comm" 2>/dev/null) || continue
        [[ "$comm" != ob-worker-* ]] && fail "$run: a standby worker with --standby off: pid $p ($comm)"
      done
      run_wait
      [ "$RC" = 0 ] || fail "$run ($layout, stages $stages): exit $RC: $(tail -3 "$WORK/$run.err")"
      python3 "$METRICS_PY" check "$WORK/$run.pb" "$STEPS" "$ranks" > /dev/null \
        || fail "$run ($layout): metrics of $ranks ranks for $STEPS steps"
      wait_for 3 no_tagged || fail "$run: processes left behind: $(tagged)"
      # One load a host, and every worker forked from it.
      [ "$(grep -c "standby seed loaded in [0-9]* ms" "$WORK/$run.err")" = "$n" ] \
        || fail "$run: not one seed a host: $(grep -c "standby seed loaded" "$WORK/$run.err") of $n"
      [ "$(grep -c "worker rank [0-9]* started, pid [0-9]*, forked from the seed" "$WORK/$run.err")" = "$ranks" ] \
        || fail "$run: not every worker forked from a seed: $(grep -m3 "worker rank [0-9]* started" "$WORK/$run.err")"
      rm -rf "${WORK:?}/$run"
      layouts+=" $run:$ranks:$layout:$stages"
    done
  done
done
echo "$NAME: ran$layouts"
[ -z "$skipped" ] || echo "$NAME: the same layouts as a run above:$skipped"
echo "$NAME: ok"
