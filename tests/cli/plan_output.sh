# ob-plan's plans: f honoured, the batch split exact, memory within capacity,
# --explain tables, and the same inputs give the same plan.
source "$(dirname "$0")/../lib/assert.sh"
PROFILE="$OB_BIN/ob-profile"
PLAN="$OB_BIN/ob-plan"

# gpt3-6.7b on 40 GiB GPUs: every stage of every template fits.
"$PROFILE" --model gpt3-6.7b --analytic --gpu a100-40gb -o "$TMP/6.7b.pb" || fail "6.7b profile"
"$PLAN" --nodes 16 -g 8 -f 2 -B 512 --json "$TMP/6.7b.pb" > "$TMP/6.7b.json" || fail "6.7b plan"
python3 - "$TMP/6.7b.json" <<'PY' || fail "6.7b plan checks"
import json, sys
p = json.load(open(sys.argv[1]))
cap = int(p["gpu_memory_bytes"])  # JSON writes 64-bit integers as strings
assert cap == 40 * 2**30 or cap == 40960 * 2**20, cap
assert p["templates"], "no templates"
assert p["profile_digest"].startswith("xxh3:"), p["profile_digest"]
for t in p["templates"]:
    for s in t["stages"]:
        assert int(s["memory_bytes"]) <= int(s["memory_capacity_bytes"]) == cap, (t["nodes"], s)
inst = p["instantiation"]
pipes = inst["pipelines"]
assert len(pipes) >= 3, f"f = 2 needs >= 3 pipelines, got {len(pipes)}"
assert sum(x["microbatches"] for x in pipes) == p["microbatches"] == 512
nodes = [n for x in pipes for n in x["node_ids"]]
assert sorted(nodes) == list(range(16)), nodes
PY

# One tensor-parallel degree in every template unless --template-tp asks
# otherwise (replicas split alike sum a layer's gradient shard by shard,
# not in pieces): gpt3-6.7b on 8 nodes of 8 H100s planned templates of
# t = 2, 4 and 8 before.
"$PROFILE" --model gpt3-6.7b --analytic --gpu h100 -o "$TMP/6.7b-h100.pb" || fail "6.7b h100 profile"
for n in 4 8 16; do
  "$PLAN" --nodes "$n" -g 8 -f 1 -B 256 --json "$TMP/6.7b-h100.pb" > "$TMP/tp$n.json" || fail "plan n=$n"
  python3 - "$TMP/tp$n.json" <<'PY' || fail "n=$n: templates of several tensor-parallel degrees"
import json, sys
p = json.load(open(sys.argv[1]))
degrees = {s["tensor_parallel"] for t in p["templates"] for s in t["stages"]}
assert len(degrees) == 1, sorted(degrees)
PY
done
"$PLAN" --nodes 8 -g 8 --tp 8 -f 1 -B 256 --json "$TMP/6.7b-h100.pb" | grep -q '"tensor_parallel": 8' || fail "--tp 8"
expect 64 'tp 3 does not divide the 8 GPUs of a node' -- "$PLAN" --nodes 8 -g 8 --tp 3 "$TMP/6.7b-h100.pb"
expect 64 'tp 16 does not divide the 8 GPUs of a node' -- "$PLAN" --nodes 8 -g 8 --tp 16 "$TMP/6.7b-h100.pb"
# --template-tp: one template at another degree, the rest at --tp's.
"$PLAN" --nodes 8 -g 8 --tp 4 --template-tp 1=8 -f 1 -B 256 --json "$TMP/6.7b-h100.pb" > "$TMP/tpat.json" \
  || fail "--template-tp 1=8"
python3 - "$TMP/tpat.json" <<'PY' || fail "--template-tp 1=8: $(head -c 600 "$TMP/tpat.json")"
import json, sys
p = json.load(open(sys.argv[1]))
for t in p["templates"]:
    want = 8 if t["nodes"] == 1 else 4
    assert {s["tensor_parallel"] for s in t["stages"]} == {want}, (t["nodes"], t["stages"])
PY
expect 64 'template-tp 1=3: 3 does not divide the 8 GPUs of a node' -- "$PLAN" --nodes 8 -g 8 --template-tp 1=3 "$TMP/6.7b-h100.pb"
expect 64 'template-tp 2x4: not NODES=T' -- "$PLAN" --nodes 8 -g 8 --template-tp 2x4 "$TMP/6.7b-h100.pb"

# f = 2 with too few nodes for 3 pipelines is refused.
expect 78 'needs at least' -- "$PLAN" --nodes 2 -g 8 -f 2 "$TMP/6.7b.pb"

# --explain: tables on stdout, a plan file only with -o.
"$PROFILE" --model gpt-tiny --analytic --gpu h100 -o "$TMP/tiny.pb"
"$PLAN" --nodes 6 -f 2 -B 64 --explain -o "$TMP/plan.pb" "$TMP/tiny.pb" > "$TMP/explain.txt" || fail "--explain"
for want in '^# templates' '^# instantiation' 'predicted iteration' 'survives any 2 node failures' 'bubble'; do
  grep -q -- "$want" "$TMP/explain.txt" || fail "--explain lacks '$want'"
done
"$PLAN" --explain "$TMP/plan.pb" > "$TMP/explain2.txt" || fail "--explain of a plan"
grep -q '^# instantiation' "$TMP/explain2.txt" || fail "--explain plan.pb prints no tables"
# A plan with planning flags: printed as it was, exit 0, as if planned for
# 4 nodes and a batch of 8. Refused, naming what would be ignored.
expect 64 'plan.pb is a plan, which ob-plan prints .* but does not plan again: --nodes, --global-batch would be ignored' \
  -- "$PLAN" --nodes 4 -B 8 -o "$TMP/replanned.pb" "$TMP/plan.pb"
[ ! -e "$TMP/replanned.pb" ] && pass || fail "the refused replan wrote its output"

# Same inputs, same plan (but for the creation time).
"$PLAN" --nodes 6 -f 2 -B 64 --json "$TMP/tiny.pb" | grep -v created_unix_ms > "$TMP/a.json"
"$PLAN" --nodes 6 -f 2 -B 64 --json "$TMP/tiny.pb" | grep -v created_unix_ms > "$TMP/b.json"
cmp -s "$TMP/a.json" "$TMP/b.json" || fail "two runs gave different plans"

# --shard-optimizer (design/shard.md): gpt3-175b on H100s needs 6 nodes a
# pipeline with the whole state in each, 3 with it in S; every plan has
# f + 1 rows of S pipelines, --explain shows them, and ob-launch refuses
# the plan (the workers do not run it yet: issue 69).
"$PROFILE" --model gpt3-175b --analytic --gpu h100 -o "$TMP/175b.pb" || fail "175b profile"
expect 64 'shard-optimizer 0: not auto, on, off or a count from 1 to 64' -- "$PLAN" --nodes 16 -g 8 --shard-optimizer 0 "$TMP/175b.pb"
"$PLAN" --nodes 64 -g 8 -f 1 -B 512 --explain "$TMP/175b.pb" > "$TMP/whole.txt" || fail "unsharded plan"
"$PLAN" --nodes 64 -g 8 -f 1 -B 512 --shard-optimizer on --explain -o "$TMP/sharded.pb" "$TMP/175b.pb" > "$TMP/sharded.txt" || fail "sharded plan"
n0_whole=$(sed -n 's/^# n0 = \([0-9]*\) nodes.*/\1/p' "$TMP/whole.txt")
n0_sharded=$(sed -n 's/^# n0 = \([0-9]*\) nodes.*/\1/p' "$TMP/sharded.txt")
[ "$n0_whole" = 6 ] && [ -n "$n0_sharded" ] && [ "$n0_sharded" -le 3 ] && pass || fail "n0 $n0_whole unsharded, $n0_sharded sharded"
grep -Eq '^# optimizer state sharded .*: 2 rows of [0-9]+ to [0-9]+ pipelines' "$TMP/sharded.txt" && pass || fail "--explain shows no rows: $(grep -i shard "$TMP/sharded.txt")"
read -r P least < <(sed -n 's/^# survives any 1 node failures: \([0-9]*\) pipelines (>= S(f+1) = \([0-9]*\)).*/\1 \2/p' "$TMP/sharded.txt")
[ -n "${least:-}" ] && [ "$least" -ge 4 ] && [ "$P" -ge "$least" ] && pass || fail "pipelines ${P:-?} against S(f+1) = ${least:-?}"
printf 'h%d\n' $(seq 0 63) > "$TMP/hosts64.txt"
(umask 077; echo "plan-output-secret-0123456789" > "$TMP/secret")
expect 78 'sharded.pb: the plan shards the optimizer state in [0-9]+ \(ob-plan --shard-optimizer\), which ob-launch does not run yet' \
  -- "$OB_BIN/ob-launch" --rsh local --secret-file "$TMP/secret" --precision bf16 "$TMP/sharded.pb" "$TMP/hosts64.txt"

# The schedule drawing.
"$PLAN" --nodes 6 -f 1 -B 16 --schedule-svg "$TMP/s.svg" -o /dev/null "$TMP/tiny.pb" || fail "--schedule-svg"
head -c 200 "$TMP/s.svg" | grep -q '<svg' && tail -c 20 "$TMP/s.svg" | grep -q '</svg>' || fail "not an SVG"
finish
