# ob-plan refuses bad input with one clear line and the documented exit code.
source "$(dirname "$0")/../lib/assert.sh"
PROFILE="$OB_BIN/ob-profile"
PLAN="$OB_BIN/ob-plan"

"$PROFILE" --model gpt-tiny --analytic --gpu h100 -o "$TMP/tiny.pb" || fail "analytic profile"
"$PROFILE" --json "$TMP/tiny.pb" > "$TMP/tiny.json"

# Empty profile: a profile without layers (a network-only one).
printf '{"format_version": 1, "mode": "PROFILE_NETWORK", "end": %d}\n' $((0x0b0b0b0b)) > "$TMP/empty.json"
expect 65 'empty.json: profile has no layers' -- "$PLAN" --nodes 4 "$TMP/empty.json"
: > "$TMP/zero-bytes.pb"
expect 65 'zero-bytes.pb: empty file' -- "$PLAN" --nodes 4 "$TMP/zero-bytes.pb"

# Zero and negative times, named by layer.
for value in 0 -0.001; do
  python3 - "$TMP/tiny.json" "$TMP/bad.json" "$value" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
p["layers"][2]["costs"][0]["forward_seconds"] = float(sys.argv[3])
json.dump(p, open(sys.argv[2], "w"))
PY
  expect 65 'bad.json: layer 2 \(block.1\): forward and backward times must be positive' -- "$PLAN" --nodes 4 "$TMP/bad.json"
done

# Truncated profile.
head -c 300 "$TMP/tiny.pb" > "$TMP/cut.pb"
expect 65 'cut.pb: ' -- "$PLAN" --nodes 4 "$TMP/cut.pb"

# Too few nodes for f + 1 pipelines of n0 nodes; too little memory.
"$PROFILE" --model gpt3-175b --analytic --gpu h100 -o "$TMP/175b.pb"
expect 78 'needs at least [0-9]+ nodes' -- "$PLAN" --nodes 8 -g 8 -f 2 "$TMP/175b.pb"
expect 78 'GiB per GPU' -- "$PLAN" --nodes 2 -g 1 -f 0 --gpu-memory 1 "$TMP/175b.pb"

# Bandwidth matrices: unreadable, not a matrix, wrong size.
expect 66 'missing.pb: cannot open' -- "$PLAN" --nodes 4 --bandwidth "$TMP/missing.pb" "$TMP/tiny.pb"
expect 65 'not a bandwidth matrix' -- "$PLAN" --nodes 4 --bandwidth "$TMP/tiny.pb" "$TMP/tiny.pb"
python3 - "$TMP/net3.json" <<'PY'
import json, sys
hosts = ["a", "b", "c"]
links = [{"src": s, "dst": d, "bandwidth_bytes_per_s": 1e9, "latency_seconds": 1e-5}
         for s in range(3) for d in range(3) if s != d]
json.dump({"format_version": 1, "mode": "PROFILE_NETWORK", "end": 0x0b0b0b0b,
           "network": {"hosts": hosts, "links": links, "rounds": 3}}, open(sys.argv[1], "w"))
PY
expect 65 'bandwidth matrix has 3 hosts, the cluster 4' -- "$PLAN" --nodes 4 --bandwidth "$TMP/net3.json" "$TMP/tiny.pb"
printf 'a\nb\nc\nd\n' > "$TMP/hosts4.txt"
expect 65 'bandwidth matrix has 3 hosts, the cluster 4' -- "$PLAN" --hosts "$TMP/hosts4.txt" --bandwidth "$TMP/net3.json" "$TMP/tiny.pb"

# Batch and micro-batch mismatches, missing costs, usage errors.
expect 78 'not a positive multiple' -- "$PLAN" --nodes 4 -B 10 -b 3 "$TMP/tiny.pb"
expect 65 'no costs at micro-batch 4' -- "$PLAN" --nodes 4 -b 4 "$TMP/tiny.pb"
expect 64 "try 'ob-plan --help'" -- "$PLAN" --nodes 4 --no-such-option "$TMP/tiny.pb"
expect 64 "give the cluster" -- env -u SLURM_JOB_NODELIST "$PLAN" "$TMP/tiny.pb"
# Sizes, counts and times that are none: refused by name, never read as
# "not given" (a micro-batch of 0 was the profile's first, a host memory of
# -5 or NaN left the check off, a negative overhead made memory).
for o in --nodes --gpus-per-node --microbatch --global-batch --gpu-memory --host-memory --time-limit \
         --link-gbps --intra-gbps; do
  for v in 0 -2 inf nan; do
    expect 64 "$o: '$v' (must be a positive number|is not a finite number)" -- "$PLAN" --nodes 4 "$o" "$v" "$TMP/tiny.pb"
  done
done
for o in --overhead-gib --overhead-fraction --link-latency-us --moves; do
  for v in -1 inf nan; do
    expect 64 "$o: '$v' (must not be negative|is not a finite number)" -- "$PLAN" --nodes 4 "$o" "$v" "$TMP/tiny.pb"
  done
done

# -f auto: its options, and failures too frequent for any f.
expect 64 "f x: expected a number of node failures" -- "$PLAN" --nodes 4 -f x "$TMP/tiny.pb"
expect 64 '-f auto needs --node-mtbf' -- "$PLAN" --nodes 4 -f auto "$TMP/tiny.pb"
expect 64 "--node-mtbf '5y': expected a duration" -- "$PLAN" --nodes 4 -f auto --node-mtbf 5y "$TMP/tiny.pb"
# A zero MTBF is the flag's mistake, not the profile's (the line named tiny.pb).
expect 64 "^ob-plan: --node-mtbf must be a positive duration" -- "$PLAN" --nodes 4 -f auto --node-mtbf 0s "$TMP/tiny.pb"
expect 64 "--repair-time '-1h': expected a duration" -- "$PLAN" --nodes 4 -f auto --node-mtbf 9d --repair-time=-1h "$TMP/tiny.pb"
expect 78 'fail every 15.0 s and stay out 60 min each .--repair-time.: on average all are out at once' -- \
  "$PLAN" --nodes 4 -f auto --node-mtbf 1m "$TMP/tiny.pb"
expect 78 'fail every 2.5 s; with f = [0-9], recoveries .5.0 s each. take [0-9]+% of the time' -- \
  "$PLAN" --nodes 4 -f auto --node-mtbf 10s --repair-time 0 "$TMP/tiny.pb"
"$PLAN" --nodes 4 -f auto --node-mtbf 2d --repair-time 12h --explain -o "$TMP/auto.pb" "$TMP/tiny.pb" > "$TMP/auto.txt" \
  || fail "-f auto on 4 nodes"
grep -q '<- chosen' "$TMP/auto.txt" || fail "-f auto: no chosen row in --explain"
grep -q "^# global batch .*; f = [0-9]" "$TMP/auto.txt" || fail "-f auto: the plan's f is not printed"

# Hosts with different slots (GPUs per node) are refused, naming the line.
printf 'a slots=8\nb slots=8\nc slots=4\n' > "$TMP/mixed.txt"
expect 78 'mixed.txt:3: host .c. has slots=4' -- "$PLAN" --hosts "$TMP/mixed.txt" "$TMP/tiny.pb"

# A plan is not a profile, and the other way round.
"$PLAN" --nodes 4 -f 1 -o "$TMP/plan.pb" "$TMP/tiny.pb" || fail "plan for gpt-tiny"
expect 65 'plan.pb: is an ob Plan, not a Profile' -- "$PROFILE" --json "$TMP/plan.pb"
# --pipelines: not counts; counts that do not cover the nodes, survive f, or
# have no template.
expect 64 '--pipelines 2,x: expected node counts like 2,3' -- "$PLAN" --nodes 4 --pipelines 2,x "$TMP/tiny.pb"
expect 64 '--pipelines 2,,2: expected node counts' -- "$PLAN" --nodes 4 --pipelines 2,,2 "$TMP/tiny.pb"
expect 78 'the pipelines hold 3 nodes, the cluster has 4' -- "$PLAN" --nodes 4 -f 1 --pipelines 2,1 "$TMP/tiny.pb"
expect 78 '2 pipeline\(s\) cannot survive -f 2' -- "$PLAN" --nodes 4 -f 2 --pipelines 2,2 "$TMP/tiny.pb"
expect 78 'no template for 4 nodes \(with -f 1' -- "$PLAN" --nodes 4 -f 1 --pipelines 4 "$TMP/tiny.pb"
"$PLAN" --nodes 4 -f 1 --pipelines 2,2 --json "$TMP/tiny.pb" | grep -c '"template_nodes": 2' | grep -qx 2 \
  && pass || fail "--pipelines 2,2 did not give two pipelines of 2 nodes"
# --local needs a measured profile.
expect 64 '--local prices the run by a measured profile' -- "$PLAN" --nodes 4 --local "$TMP/tiny.pb"

# --measured: only with --explain; a file that is missing, not metrics, or
# holds no step after the warm-up.
"$PLAN" --nodes 4 -f 1 -o "$TMP/p.pb" "$TMP/tiny.pb" || fail "plan for --measured"
expect 64 '--measured goes with --explain' -- "$PLAN" --measured "$TMP/tiny.pb" "$TMP/p.pb"
expect 66 'nope.m: cannot open' -- "$PLAN" --explain --measured "$TMP/nope.m" "$TMP/p.pb"
expect 65 'p.pb: record 1 at byte 0' -- "$PLAN" --explain --measured "$TMP/p.pb" "$TMP/p.pb"
: > "$TMP/empty.m"
expect 65 'empty.m: no step of rank 0 after the first 5' -- "$PLAN" --explain --measured "$TMP/empty.m" "$TMP/p.pb"

finish
