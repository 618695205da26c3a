#!/usr/bin/env bash
# An operator's exclude or drain never takes out the last replica of a
# layer: on 2 hosts, each a whole pipeline of gpt-tiny, excluding one is
# done (the other trains on alone), and then excluding or draining the
# other, or both at once before the first recovery is decided, is refused
# with a reason (ok false) and training goes on; before, the run ended at
# once, exit 75, its steps lost. `stop` then ends the run; without
# --ckpt-dir its steps are not on disk, which it says with exit 75.
NAME=launch_exclude_last
source "$(dirname "$0")/../lib/launch.sh"
command -v python3 >/dev/null || skip "no python3 for the control socket"
make_cluster 2
H1=${TAG}h1 H2=${TAG}h2

# 1. Both at once: the second request comes while the first is pending.
run_start both 100000
wait_step both 5 || fail "both: no step 5: $(tail -3 "$WORK/both.err")"
a=$(control "$WORK/both/control.sock" "exclude $H1 broken fan") || fail "no answer to exclude $H1"
b=$(control "$WORK/both/control.sock" "exclude $H2 broken fan") || fail "no answer to exclude $H2"
echo "$a" | grep -q '"ok":true' || fail "exclude $H1: $a"
echo "$b" | grep -q '"ok":false' && echo "$b" | grep -q "kept $H2: without it layers 0-5 have no surviving replica" \
  || fail "exclude $H2 with $H1 going: $b"
at=$(max_step "$WORK/both.pb")
wait_step both $((at + 10)) || fail "training did not go on after the refusal: $(tail -3 "$WORK/both.err")"

# 2. One after the other: drain and exclude of the last host, refused.
for verb in drain exclude; do
  c=$(control "$WORK/both/control.sock" "$verb $H2") || fail "no answer to $verb $H2"
  echo "$c" | grep -q '"ok":false' && echo "$c" | grep -q "no surviving replica" || fail "$verb $H2: $c"
done
status=$(control "$WORK/both/control.sock" status)
echo "$status" | grep -q '"state":"running"' && echo "$status" | grep -q '"world_size":1' || fail "status: $status"
grep -q " keep host=$H2 kept $H2: without it" "$WORK/both/events.log" || fail "events.log lacks the refusal"
at=$(max_step "$WORK/both.pb")
wait_step both $((at + 10)) || fail "training did not go on: $(tail -3 "$WORK/both.err")"
control "$WORK/both/control.sock" stop > /dev/null || fail "no answer to stop"
wait "$MASTER_PID"; rc=$?; MASTER_PID=""
[ "$rc" = 75 ] || fail "stop: exit $rc, expected 75: $(tail -3 "$WORK/both.err")"
grep -q "ob-launch: an operator asked to stop: stopped without saving: steps 0-[0-9]*, trained since the start, are not on disk (no --ckpt-dir)$" \
  "$WORK/both.err" || fail "stop: no line naming the lost steps: $(tail -2 "$WORK/both.err")"
wait_for 5 no_tagged || fail "processes left: $(tagged | xargs -r ps -o pid,args -p)"
echo "$NAME: ok"
