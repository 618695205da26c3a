#!/usr/bin/env bash
# Tensor parallelism inside a node (issue 11, acceptance 1 and 3), local
# hosts of several slots, gpt-tiny (4 heads, a byte vocabulary of 256
# split over the TP ranks, the LM head tied to the embedding), plans made
# by ob-plan --tp:
#  1. 20 steps of (a) 1 host x 2 slots, one stage, tp 2; (b) 2 hosts x 4
#     slots, 2 pipelines x 2 stages, tp 2 (2 stages a node); (c) 1 host x
#     4 slots, tp 4: each run's losses equal the one-worker run's within
#     1e-5 relative;
#  2. 3 hosts x 4 slots, f = 1, tp 2 and 2 stages a node: kill -9 of host
#     h2 (its agent, its 4 workers, its standbys) after step 15 of 40:
#     training reaches step 40 from the survivors' snapshots (no
#     checkpoint), every loss equal to the one-worker run's within 1e-4,
#     no process left behind;
#  2b. (acceptance 1 and 3, re-sharding) 3 hosts x 4 slots, f = 1, -B 3:
#     ob-plan --tp 2 --template-tp 1=4 instantiates a 2-node pipeline (tp
#     2, 2 stages a node) beside a 1-node one (tp 4): 20 steps give the
#     one-worker run's losses within 1e-5; kill -9 of h2 at step 15 of 40
#     moves h1 onto the 1-node template (tp 4): its ranks re-cut their own
#     tp-2 state and take the rest from h3; every loss equal to the
#     one-worker run's within 1e-4, no checkpoint read, no orphans;
#  3. (acceptance 4) run 1b (2 x 4, tp 2, 2 stages a node) saves
#     checkpoints after steps 9 and 19 (TP rank 0 of each stage writes the
#     merged tensors); step 9's resumes on one worker (tp 1, one stage a
#     node) and on tp 4: steps 10-19 give the saving run's losses within
#     1e-5.
NAME=launch_tp
source "$(dirname "$0")/../lib/launch.sh"
command -v python3 >/dev/null || skip "no python3"

"$OB_BIN/ob-profile" --model gpt-tiny --analytic --gpu h100 --dtype float32 --seq-len 32 -b 1,4 -q \
  -o "$WORK/tiny.pb" || fail "ob-profile"
(umask 077; echo "secret-$TAG-for-the-tests" > "$WORK/secret")

# plan NAME HOSTS... -- OB-PLAN FLAGS: $WORK/NAME.pb (and NAME.hosts,
# NAME.json) for local hosts "HOST slots=N", checked with its JSON: every
# stage has the asked tp. (Not a run's name: run_start removes RUN.pb.)
plan() {
  local name=$1 tp
  shift
  : > "$WORK/$name.hosts"
  while [ "$1" != "--" ]; do echo "${TAG}$1" >> "$WORK/$name.hosts"; shift; done
  shift
  tp=1
  for ((i = 1; i <= $#; i++)); do [ "${!i}" = --tp ] && { j=$((i + 1)); tp=${!j}; }; done
  for ((i = 1; i <= $#; i++)); do [ "${!i}" = --template-tp ] && tp=0; done  # checked by the caller
  local flags=(--hosts "$WORK/$name.hosts" -B "${PLAN_B:-8}" --gpu-memory 0.1 --overhead-gib 0 "$@")
  "$OB_BIN/ob-plan" "${flags[@]}" -o "$WORK/$name.pb" "$WORK/tiny.pb" || fail "ob-plan $name"
  "$OB_BIN/ob-plan" "${flags[@]}" --json "$WORK/tiny.pb" > "$WORK/$name.json" || fail "ob-plan --json $name"
  python3 - "$WORK/$name.json" "$tp" <<'PY' || fail "$name: not the plan this test is about: $(head -c 400 "$WORK/$name.json")"
import json, sys
p, tp = json.load(open(sys.argv[1])), int(sys.argv[2])
assert tp == 0 or all(s["tensor_parallel"] == tp for t in p["templates"] for s in t["stages"]), p["templates"]
PY
}

# 1. Equivalence with one worker.
plan p-one h0 -- -g 1 -f 0
RUN_PLAN="$WORK/p-one.pb" RUN_HOSTS="$WORK/p-one.hosts" reference_run 20
# The one-stage layouts take micro-batches of 4 sequences (2 a step, not
# 8: each costs ~20 all-reduces of its tp group, and 4 ranks' all-reduces
# on 2 cores take ~8 ms each); the one worker's are of 1, so the sums
# agree across micro-batch sizes too.
plan p-a "h1 slots=2" -- -g 2 --tp 2 -f 0 -b 4
plan p-b "h1 slots=4" "h2 slots=4" -- -g 4 --tp 2 -f 1
plan p-c "h1 slots=4" -- -g 4 --tp 4 -f 0 -b 4
python3 - "$WORK/p-b.json" <<'PY' || fail "plan p-b is not 2 pipelines x 2 stages: $(head -c 600 "$WORK/p-b.json")"
import json, sys
p = json.load(open(sys.argv[1]))
pipes = p["instantiation"]["pipelines"]
t = {x["nodes"]: x for x in p["templates"]}
assert len(pipes) == 2 and all(len(t[q["template_nodes"]]["stages"]) == 2 for q in pipes), (pipes, t)
PY
# Run b also saves the checkpoints of part 3 (a 12-rank run of its own
# would check nothing more and cost a tenth of this test).
for run in a b c; do
  ckpt=()
  [ "$run" = b ] && ckpt=(--ckpt-dir "$WORK/ck" --ckpt-every 10)
  RUN_PLAN="$WORK/p-$run.pb" RUN_HOSTS="$WORK/p-$run.hosts" run_start "$run" 20 --standby off "${ckpt[@]}"
  run_wait
  [ "$RC" = 0 ] || fail "$run: exit $RC: $(tail -3 "$WORK/$run.err")"
  python3 "$METRICS_PY" compare "$WORK/ref.pb" "$WORK/$run.pb" 1e-5 > "$WORK/$run.cmp" \
    || fail "$run: $(cat "$WORK/$run.cmp")"
  echo "$NAME: $run: $(cat "$WORK/$run.cmp")"
done
wait_for 3 no_tagged || fail "processes left behind: $(tagged)"

# 2. A host of 4 TP ranks lost and recovered in place.
plan p-r "h1 slots=4" "h2 slots=4" "h3 slots=4" -- -g 4 --tp 2 -f 1
python3 - "$WORK/p-r.json" "$TAG" <<'PY' || fail "plan p-r: $(head -c 600 "$WORK/p-r.json")"
import json, sys
p, tag = json.load(open(sys.argv[1])), sys.argv[2]
assert all(t["stages_per_node"] == 2 for t in p["templates"]), p["templates"]
assert tag + "h2" in p["instantiation"]["pipelines"][0]["nodes"], p["instantiation"]
PY
# The reference is the one-worker run of 40 steps (part 1 showed the tp
# layouts equal to it): a 12-rank reference would cost a third of this
# test's time on two cores and check nothing more.
RUN_PLAN="$WORK/p-one.pb" RUN_HOSTS="$WORK/p-one.hosts" reference_run 40
export RUN_PLAN="$WORK/p-r.pb" RUN_HOSTS="$WORK/p-r.hosts"
run_start host 40
kill_host_at host 15 "${TAG}h2"
grep -q "decide generation=2 lost hosts ${TAG}h2; re-instantiated" "$WORK/host/events.log" \
  || fail "no re-instantiation: $(grep -E 'decide|done' "$WORK/host/events.log")"
check_recovered host 40 "kill -9 of ${TAG}h2 (4 TP ranks)"

# 2b. Replicas of degrees 2 and 4; a recovery from one to the other.
PLAN_B=3 plan p-one3 h0 -- -g 1 -f 0
PLAN_B=3 plan p-m "h1 slots=4" "h2 slots=4" "h3 slots=4" -- -g 4 --tp 2 --template-tp 1=4 -f 1
python3 - "$WORK/p-m.json" "$TAG" <<'PY' || fail "plan p-m is not a tp-2 2-node pipeline beside a tp-4 1-node one: $(head -c 900 "$WORK/p-m.json")"
import json, sys
p, tag = json.load(open(sys.argv[1])), sys.argv[2]
t = {x["nodes"]: x for x in p["templates"]}
assert {s["tensor_parallel"] for s in t[1]["stages"]} == {4} and t[1]["stages_per_node"] == 1, t[1]
assert {s["tensor_parallel"] for s in t[2]["stages"]} == {2} and t[2]["stages_per_node"] == 2, t[2]
pipes = p["instantiation"]["pipelines"]
assert [q["template_nodes"] for q in pipes] == [2, 1], pipes
assert tag + "h2" in pipes[0]["nodes"], pipes
PY
RUN_PLAN="$WORK/p-one3.pb" RUN_HOSTS="$WORK/p-one3.hosts" reference_run 20
export RUN_PLAN="$WORK/p-m.pb" RUN_HOSTS="$WORK/p-m.hosts"
run_start mixed 20 --standby off
run_wait
[ "$RC" = 0 ] || fail "mixed: exit $RC: $(tail -3 "$WORK/mixed.err")"
python3 "$METRICS_PY" compare "$WORK/ref.pb" "$WORK/mixed.pb" 1e-5 > "$WORK/mixed.cmp" \
  || fail "mixed degrees: $(cat "$WORK/mixed.cmp")"
echo "$NAME: tp 2 + tp 4 replicas against one worker: $(cat "$WORK/mixed.cmp")"
RUN_PLAN="$WORK/p-one3.pb" RUN_HOSTS="$WORK/p-one3.hosts" reference_run 40  # the schedule spans --steps
run_start reshard 40
kill_host_at reshard 15 "${TAG}h2"
# Both pipelines now on the 1-node template: h1's at tp 4, re-cut.
grep -q "decide generation=2 lost hosts ${TAG}h2; re-instantiated as pipelines of 1+1 nodes" \
  "$WORK/reshard/events.log" \
  || fail "no re-instantiation: $(grep -E 'decide|done' "$WORK/reshard/events.log")"
check_recovered reshard 40 "kill -9 of ${TAG}h2, h1 re-cut from tp 2 to tp 4"
unset RUN_PLAN RUN_HOSTS

# 3. Checkpoints across tensor-parallel degrees: run b's.
[ -f "$WORK/ck/step-000000000009/manifest.pb" ] || fail "no checkpoint of step 9: $(ls "$WORK/ck")"
"$OB_BIN/ob-ckpt" verify "$WORK/ck/step-000000000009" > /dev/null || fail "ob-ckpt verify step 9"
for to in p-one p-c; do
  run_resumed "resume-$to" "$WORK/$to.pb" "$WORK/$to.hosts" 20 "$WORK/ck/step-000000000009" "$WORK/b.pb" 1e-5
  echo "$NAME: tp 2 checkpoint of step 9 resumed on $to: $RESUMED"
done
wait_for 3 no_tagged || fail "processes left behind: $(tagged)"
echo "$NAME: ok"
