#!/usr/bin/env bash
# A weighted blend as --data (model/data.h): 0.25 of the test corpus's bytes
# and 0.75 of the same bytes reversed, uint16 token files. Which file each
# sample comes from depends on (seed, step, index) alone, so:
#  1. 100 steps of gpt-tiny on one pipeline of one stage and on 2 x 2
#     pipelines give the same losses, step for step (1e-4: the layouts sum
#     in other orders), so every step drew the same samples;
#  2. a kill -9 of host 4 at step 15 of the 2 x 2 run recovers in place
#     with every loss the uninterrupted run's;
#  3. the same blend with the files' weights swapped trains other losses
#     (the weights are used), and a malformed blend is refused before any
#     host starts, exit 64, naming it.
NAME=launch_blend
source "$(dirname "$0")/../lib/launch.sh"
command -v python3 >/dev/null || skip "no python3"
make_two_by_two
python3 - "$OB_SOURCE_DIR/tests/data/corpus.txt" "$WORK" <<'PY' || fail "token files"
import struct, sys
data, work = open(sys.argv[1], "rb").read(), sys.argv[2]
for name, b in (("a", data), ("b", data[::-1])):
    open(f"{work}/{name}.bin", "wb").write(struct.pack("<%dH" % len(b), *b))
PY
export RUN_DATA="0.25:$WORK/a.bin,0.75:$WORK/b.bin"
STEPS=100
reference_run "$STEPS"

plan_hosts single h1 -- -g 1 -f 0
python3 - "$WORK/single.json" <<'PY' || fail "the one-host plan is not one pipeline of one stage"
import json, sys
p = json.load(open(sys.argv[1]))
assert [x["template_nodes"] for x in p["instantiation"]["pipelines"]] == [1], p["instantiation"]
PY
RUN_PLAN=$WORK/single.pb RUN_HOSTS=$WORK/single.hosts run_start one "$STEPS" --standby off
run_wait
[ "$RC" = 0 ] || fail "one pipeline: exit $RC: $(tail -3 "$WORK/one.err")"
python3 "$METRICS_PY" compare "$WORK/ref.pb" "$WORK/one.pb" 1e-4 || fail "one pipeline: losses differ from 2 x 2's"

run_start kill "$STEPS"
kill_host_at kill 15 "${TAG}h4"
check_recovered kill "$STEPS" "kill -9 of h4 at step 15"

RUN_DATA="0.75:$WORK/a.bin,0.25:$WORK/b.bin" run_start swap 5 --standby off
run_wait
[ "$RC" = 0 ] || fail "swapped weights: exit $RC: $(tail -3 "$WORK/swap.err")"
! python3 "$METRICS_PY" compare "$WORK/ref.pb" "$WORK/swap.pb" 1e-4 > /dev/null 2>&1 ||
  fail "swapped weights: the same losses (the weights are not used)"
RUN_DATA="0.25:$WORK/a.bin,$WORK/b.bin" run_start bad 5 --standby off
run_wait
[ "$RC" = 64 ] || fail "a malformed blend: exit $RC, expected 64: $(tail -3 "$WORK/bad.err")"
grep -q "has no weight" "$WORK/bad.err" || fail "a malformed blend: $(tail -3 "$WORK/bad.err")"
echo "$NAME: a blend draws the same samples on 1 and 4 pipelines and across a recovery"
