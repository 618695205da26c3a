#!/usr/bin/env bash
# Mixed templates (issue 14, the fourth known error: a template could not
# mix stage sizes): gpt-tiny's analytic profile with its LM head made dear
# (3 ms a micro-batch, the blocks' all-reduces dear at --intra-gbps 0.1), so
# that ob-plan --mixed-stages puts the embedding and the blocks on node 1
# one GPU a stage and the head alone on both GPUs of node 2 — a pipeline of
# degrees 1, 1, 2, whose boundary between degrees 1 and 2 moves whole
# tensors (runtime/topology.h):
#  1. 2 hosts x 2 slots, that one pipeline: 20 steps give the one-worker
#     run's losses within 1e-5; it saves a checkpoint after step 9, which
#     resumes on one worker: steps 10-19 equal within 1e-5;
#  2. 3 hosts x 2 slots, f = 1, --pipelines 2,1: the mixed pipeline beside
#     a one-node pipeline of degree 2; kill -9 of the host holding the
#     mixed pipeline's head at step 15 of 60: training reaches step 60
#     from the survivors' snapshots, every loss the one-worker run's
#     within 1e-4, no process left behind.
NAME=launch_mixed_stages
source "$(dirname "$0")/../lib/launch.sh"
command -v python3 >/dev/null || skip "no python3"
command -v protoc >/dev/null || skip "no protoc"
PROTO_DIR="$OB_SOURCE_DIR/lib/proto"

"$OB_BIN/ob-profile" --model gpt-tiny --analytic --gpu h100 --dtype float32 --seq-len 32 -q \
  -o "$WORK/plain.pb" || fail "ob-profile"
protoc -I "$PROTO_DIR" --decode=ob.pb.Profile ob/profile.proto < "$WORK/plain.pb" > "$WORK/plain.txt" \
  || fail "protoc --decode"
python3 - "$WORK/plain.txt" > "$WORK/tiny.txt" <<'PY' || fail "could not edit the profile"
import re, sys
text = open(sys.argv[1]).read()
i = text.index("kind: LAYER_HEAD")
tail = re.sub(r"forward_seconds: [0-9.e+-]+", "forward_seconds: 1e-3", text[i:], count=1)
tail = re.sub(r"backward_seconds: [0-9.e+-]+", "backward_seconds: 2e-3", tail, count=1)
sys.stdout.write(text[:i] + tail)
PY
protoc -I "$PROTO_DIR" --encode=ob.pb.Profile ob/profile.proto < "$WORK/tiny.txt" > "$WORK/tiny.pb" \
  || fail "protoc --encode"
(umask 077; echo "secret-$TAG-for-the-tests" > "$WORK/secret")

# plan NAME HOSTS... -- OB-PLAN FLAGS: plan_hosts with GPUs of 0.1 GiB.
plan() {
  local hosts=()
  while [ "$1" != "--" ]; do hosts+=("$1"); shift; done
  shift
  plan_hosts "${hosts[@]}" -- --gpu-memory 0.1 "$@"
}
# is_mixed NAME: NAME's 2-node template is the mixed one this test is about.
is_mixed() {
  python3 - "$WORK/$1.json" <<'PY' || fail "$1: not a mixed 2-node template: $(head -c 900 "$WORK/$1.json")"
import json, sys
p = json.load(open(sys.argv[1]))
t = {x["nodes"]: x for x in p["templates"]}[2]
assert t.get("stages_per_node", 0) == 0, t
assert [s["tensor_parallel"] for s in t["stages"]] == [1, 1, 2], t
assert [s.get("node", 0) for s in t["stages"]] == [0, 0, 1], t
assert t["stages"][2]["first_layer"] == 5, t
PY
}

plan p-one h0 -- -g 1 -f 0
RUN_PLAN="$WORK/p-one.pb" RUN_HOSTS="$WORK/p-one.hosts" reference_run 20
cp "$WORK/ref.pb" "$WORK/ref20.pb"

# 1. One mixed pipeline against one worker; its checkpoint on one worker.
plan p-mix "h1 slots=2" "h2 slots=2" -- -g 2 -f 0 --intra-gbps 0.1 --pipelines 2 --mixed-stages
is_mixed p-mix
"$OB_BIN/ob-plan" --explain "$WORK/p-mix.pb" | grep -q "mix mix .*/1 .*/1 5/2  \*$" \
  || fail "--explain does not show the mixed stages: $("$OB_BIN/ob-plan" --explain "$WORK/p-mix.pb" | head -20)"
export RUN_PLAN="$WORK/p-mix.pb" RUN_HOSTS="$WORK/p-mix.hosts"
run_start mix 20 --ckpt-dir "$WORK/ck" --ckpt-every 10 --standby off
run_wait
[ "$RC" = 0 ] || fail "mixed: exit $RC: $(tail -3 "$WORK/mix.err")"
python3 "$METRICS_PY" compare "$WORK/ref20.pb" "$WORK/mix.pb" 1e-5 > "$WORK/mix.cmp" \
  || fail "mixed pipeline against one worker: $(cat "$WORK/mix.cmp")"
echo "$NAME: degrees 1,1 | 2 against one worker: $(cat "$WORK/mix.cmp")"
[ -f "$WORK/ck/step-000000000009/manifest.pb" ] || fail "no checkpoint of step 9: $(ls "$WORK/ck")"
RUN_PLAN="$WORK/p-one.pb" RUN_HOSTS="$WORK/p-one.hosts" run_start resume 20 --resume "$WORK/ck/step-000000000009" --standby off
run_wait
[ "$RC" = 0 ] || fail "resumed on one worker: exit $RC: $(tail -3 "$WORK/resume.err")"
python3 "$METRICS_PY" compare "$WORK/resume.pb" "$WORK/mix.pb" 1e-5 > "$WORK/resume.cmp" \
  || fail "mixed checkpoint resumed on one worker: $(cat "$WORK/resume.cmp")"
echo "$NAME: its checkpoint of step 9 on one worker: $(cat "$WORK/resume.cmp")"
wait_for 3 no_tagged || fail "processes left behind: $(tagged)"

# 2. The mixed pipeline beside a one-node one; the head's host lost.
plan p-r "h1 slots=2" "h2 slots=2" "h3 slots=2" -- -g 2 -f 1 --intra-gbps 0.1 --pipelines 2,1 --mixed-stages
is_mixed p-r
victim=$(python3 - "$WORK/p-r.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
pipes = p["instantiation"]["pipelines"]
assert [q["template_nodes"] for q in pipes] == [2, 1], pipes
print(pipes[0]["nodes"][1])
PY
) || fail "plan p-r is not a 2-node pipeline beside a 1-node one: $(head -c 900 "$WORK/p-r.json")"
RUN_PLAN="$WORK/p-one.pb" RUN_HOSTS="$WORK/p-one.hosts" reference_run 60
export RUN_PLAN="$WORK/p-r.pb" RUN_HOSTS="$WORK/p-r.hosts"
run_start host 60
kill_host_at host 15 "$victim"
grep -q "decide generation=2 lost hosts $victim; re-instantiated" "$WORK/host/events.log" \
  || fail "no re-instantiation: $(grep -E 'decide|done' "$WORK/host/events.log")"
check_recovered host 60 "kill -9 of $victim (the mixed pipeline's head, degree 2)"
echo "$NAME: ok"
