# ob-sim: a run replayed through the master's decisions; bad input refused
# with one clear line and the documented exit code.
source "$(dirname "$0")/../lib/assert.sh"
SIM="$OB_BIN/ob-sim"

"$OB_BIN/ob-profile" --model gpt-tiny --analytic --gpu h100 -o "$TMP/tiny.pb" || fail "analytic profile"
"$OB_BIN/ob-plan" -q -f 1 --nodes 8 -g 1 -B 16 -b 1 --overhead-gib 0 -o "$TMP/plan.pb" "$TMP/tiny.pb" || fail "plan"

# A drawn month: both policies reported, the same seed the same figures.
"$SIM" --node-mtbf 2d --repair-time 2h --horizon 30d --svg "$TMP/run.svg" "$TMP/plan.pb" > "$TMP/a.txt" \
  || fail "ob-sim exit $?"
grep -q '^ob (8 nodes, f=1' "$TMP/a.txt" && pass || fail "no ob line: $(cat "$TMP/a.txt")"
grep -q '^checkpoint-restart (8 nodes, f=0' "$TMP/a.txt" && pass || fail "no checkpoint-restart line"
grep -q '^oobleck-style (8 nodes, f=1' "$TMP/a.txt" && pass || fail "no oobleck-style line"
grep -q '<svg' "$TMP/run.svg" && grep -q 'polyline' "$TMP/run.svg" && pass || fail "no timeline drawn"
"$SIM" --node-mtbf 2d --repair-time 2h --horizon 30d "$TMP/plan.pb" > "$TMP/b.txt"
cmp -s "$TMP/a.txt" "$TMP/b.txt" && pass || fail "the same seed gave another result"
"$SIM" --node-mtbf 2d --repair-time 2h --horizon 30d --json --policy ob "$TMP/plan.pb" > "$TMP/c.json"
python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
r = d["results"]
assert len(r) == 1 and r[0]["policy"] == "ob", r
assert 0 < r[0]["ettr"] <= 1 and r[0]["failures"] > 100, r[0]
' "$TMP/c.json" && pass || fail "--json: $(head -c 300 "$TMP/c.json")"

# A trace file, by host index; then its errors, named by file and line.
printf '# two failures\n1h fail 0\n3h repair 0\n2h fail 5\n' > "$TMP/trace.txt"
"$SIM" --trace "$TMP/trace.txt" --horizon 6h "$TMP/plan.pb" > "$TMP/t.txt" && pass || fail "trace exit $?"
grep -q '^2 failures over 0.2 days' "$TMP/t.txt" && pass || fail "trace report: $(head -1 "$TMP/t.txt")"
printf '1h fail 0\n2h melt 1\n' > "$TMP/bad.txt"
expect 65 'bad.txt:2: .melt. is neither fail nor repair' -- "$SIM" --trace "$TMP/bad.txt" "$TMP/plan.pb"
printf '1h fail 9\n' > "$TMP/bad.txt"
expect 65 'bad.txt:1: no host .9. in the plan \(8 hosts\)' -- "$SIM" --trace "$TMP/bad.txt" "$TMP/plan.pb"
printf 'nothing recovered\n' > "$TMP/events.log"
expect 65 'events.log: no .recovered. lines' -- "$SIM" --trace "$TMP/trace.txt" --recovery-log "$TMP/events.log" "$TMP/plan.pb"
expect 64 'give a failure trace' -- "$SIM" "$TMP/plan.pb"
expect 64 'give a failure trace' -- "$SIM" --trace "$TMP/trace.txt" --node-mtbf 2d "$TMP/plan.pb"
# No plan named: standard input, as ob-plan reads its profile (it said
# "no plan: give plan.pb", so ob-plan ... | ob-sim did not compose).
"$SIM" --node-mtbf 2d --seed 7 "$TMP/plan.pb" > "$TMP/named.txt" && "$SIM" --node-mtbf 2d --seed 7 < "$TMP/plan.pb" > "$TMP/piped.txt" \
  && cmp -s "$TMP/named.txt" "$TMP/piped.txt" && pass || fail "a piped plan simulated otherwise than a named one"
expect 65 '<stdin>: empty file, expected an ob Plan' -- "$SIM" --node-mtbf 2d < /dev/null
expect 64 'weibull-shape must be a positive, finite number' -- "$SIM" --node-mtbf 2d --weibull-shape inf "$TMP/plan.pb"
# A shape whose Γ(1 + 1/K) overflows drew NaN times and never ended.
expect 64 'weibull-shape 0.001: a Weibull shape of 0.001 has no finite scale' -- \
  timeout 20 "$SIM" --node-mtbf 2d --weibull-shape 0.001 "$TMP/plan.pb"
expect 64 'policy names ob twice' -- "$SIM" --node-mtbf 2d --policy ob,ob "$TMP/plan.pb"
expect 64 'horizon .soon.: expected a duration' -- "$SIM" --node-mtbf 2d --horizon soon "$TMP/plan.pb"
expect 64 'policy .oobleck.' -- "$SIM" --node-mtbf 2d --policy oobleck "$TMP/plan.pb"
expect 64 'draws about [0-9.e+]+ events .at most 5e7.' -- "$SIM" --node-mtbf 1s --repair-time 0 --horizon 100000d "$TMP/plan.pb"
expect 66 '' -- "$SIM" --node-mtbf 2d "$TMP/missing.pb"
head -c 100 "$TMP/plan.pb" > "$TMP/cut.pb"
expect 65 'cut.pb' -- "$SIM" --node-mtbf 2d "$TMP/cut.pb"
finish
