#!/usr/bin/env bash
# A plan the workers cannot run is refused by the master before any host
# starts (issue 11, acceptance 6): exit 78, one line naming the plan file
# and the reason, no agent or worker started, nothing left behind.
#  1. ob-plan's own plan for 2 hosts of 2 GPUs (tensor parallelism 2)
#     hand-edited (protoc) to t = 3, which does not divide gpt-tiny's 4
#     attention heads;
#  2. a --tp 2 plan with one template's first stage edited to t = 1: a
#     pipeline's lanes run stage to stage, so its stages share one degree
#     (templates of different degrees are runnable: launch_tp.sh);
#  3. a plan of 2 stages a node run on hosts with slots=1.
NAME=launch_runnable
source "$(dirname "$0")/../lib/launch.sh"
command -v protoc >/dev/null || skip "no protoc to edit a plan"
PROTO_DIR="$OB_SOURCE_DIR/lib/proto"

"$OB_BIN/ob-profile" --model gpt-tiny --analytic --gpu h100 --dtype float32 --seq-len 32 -q \
  -o "$WORK/tiny.pb" || fail "ob-profile"
printf '%s slots=2\n' "${TAG}h1" "${TAG}h2" > "$WORK/hosts.txt"
(umask 077; echo "secret-$TAG-for-the-tests" > "$WORK/secret")

# refused NAME PLAN HOSTS PATTERN [FLAGS...]: ob-launch exits 78 with one
# line matching PATTERN.
refused() {
  local name=$1 plan=$2 hosts=$3 pattern=$4 rc
  shift 4
  timeout 30 "$OB_BIN/ob-launch" --rsh local --secret-file "$WORK/secret" --run-dir "$WORK/$name" \
    --steps 3 --data "$OB_SOURCE_DIR/README.md" "$@" "$plan" "$hosts" > /dev/null 2> "$WORK/$name.err"
  rc=$?
  [ "$rc" = 78 ] || fail "$name: exit $rc, expected 78: $(tail -3 "$WORK/$name.err")"
  [ "$(grep -c . "$WORK/$name.err")" = 1 ] || fail "$name: not one line: $(cat "$WORK/$name.err")"
  grep -q -- "$pattern" "$WORK/$name.err" || fail "$name: $(cat "$WORK/$name.err") (wanted: $pattern)"
  no_tagged || fail "$name: processes started: $(tagged | xargs -r ps -o pid,args -p)"
  [ ! -e "$WORK/$name/events.log" ] || ! grep -q "start-workers" "$WORK/$name/events.log" \
    || fail "$name: workers were started"
  echo "$NAME: $(cat "$WORK/$name.err")"
}

"$OB_BIN/ob-plan" --hosts "$WORK/hosts.txt" -g 2 -f 1 -B 8 -o "$WORK/tp2.pb" "$WORK/tiny.pb" || fail "ob-plan -g 2"
protoc -I "$PROTO_DIR" --decode=ob.pb.Plan ob/plan.proto < "$WORK/tp2.pb" > "$WORK/tp2.txt" || fail "protoc --decode"
grep -q "tensor_parallel: 2" "$WORK/tp2.txt" || skip "ob-plan did not choose tensor parallelism 2 here"

sed 's/tensor_parallel: 2/tensor_parallel: 3/' "$WORK/tp2.txt" > "$WORK/tp3.txt"
protoc -I "$PROTO_DIR" --encode=ob.pb.Plan ob/plan.proto < "$WORK/tp3.txt" > "$WORK/tp3.pb" || fail "protoc --encode"
refused tp3 "$WORK/tp3.pb" "$WORK/hosts.txt" "tp3.pb: .*tensor parallelism 3 does not divide the model's 4 attention heads"

# 3 hosts of 4 GPUs with --tp 2: templates for 1 and 2 nodes, 2 stages a
# node; the first template's first stage edited to t = 1.
printf '%s slots=4\n' "${TAG}h1" "${TAG}h2" "${TAG}h3" > "$WORK/hosts4.txt"
"$OB_BIN/ob-plan" --hosts "$WORK/hosts4.txt" -g 4 --tp 2 -f 1 -B 8 -o "$WORK/tp2x3.pb" "$WORK/tiny.pb" || fail "ob-plan --tp 2"
protoc -I "$PROTO_DIR" --decode=ob.pb.Plan ob/plan.proto < "$WORK/tp2x3.pb" \
  | sed '0,/tensor_parallel: 2/s//tensor_parallel: 1/' > "$WORK/mixed.txt"
protoc -I "$PROTO_DIR" --encode=ob.pb.Plan ob/plan.proto < "$WORK/mixed.txt" > "$WORK/mixed.pb" || fail "protoc --encode"
refused mixed "$WORK/mixed.pb" "$WORK/hosts4.txt" "mixed.pb: .*stage 1: tensor parallelism 2, stage 0's 1: only a mixed template's stages differ in degree"

# Two stages a node (--tp 1 with 2 GPUs a node: k = 2, t = 1) on hosts of
# one slot each.
"$OB_BIN/ob-plan" --hosts "$WORK/hosts.txt" -g 2 --tp 1 -f 1 -B 8 -o "$WORK/k2.pb" "$WORK/tiny.pb" \
  || fail "ob-plan --tp 1"
protoc -I "$PROTO_DIR" --decode=ob.pb.Plan ob/plan.proto < "$WORK/k2.pb" | grep -q "stages_per_node: 2" \
  || skip "ob-plan did not put 2 stages on a node here"
printf '%s\n' "${TAG}h1" "${TAG}h2" > "$WORK/hosts1.txt"
refused slots "$WORK/k2.pb" "$WORK/hosts1.txt" "the plan puts 2 workers on host ${TAG}h1, which has slots=1 in .*hosts1.txt"
echo "$NAME: ok"
