# ob-plan --bandwidth: on a 16-node matrix with two links 5x slower, the
# placement beats hosts-file order by >= 10%, routes no pipeline boundary
# over a slow link, and the same seed gives the same plan.
source "$(dirname "$0")/../lib/assert.sh"
PROFILE="$OB_BIN/ob-profile"
PLAN="$OB_BIN/ob-plan"
"$PROFILE" --model gpt2-xl --analytic --gpu a100-40gb -o "$TMP/xl.pb" || fail "profile"
python3 - "$TMP/net.json" "$TMP/hosts.txt" <<'PY'
import json, sys
n = 16
hosts = [f"h{i:02d}" for i in range(n)]
slow = {(1, 2), (9, 10)}          # boundaries of hosts-file order
links = []
for s in range(n):
    for d in range(n):
        if s == d: continue
        bw = 2e9 / 5 if (min(s, d), max(s, d)) in slow else 2e9
        links.append({"src": s, "dst": d, "bandwidth_bytes_per_s": bw, "latency_seconds": 20e-6})
json.dump({"format_version": 1, "mode": "PROFILE_NETWORK", "end": 0x0b0b0b0b,
           "network": {"hosts": hosts, "links": links, "rounds": 15}}, open(sys.argv[1], "w"))
open(sys.argv[2], "w").write("".join(h + "\n" for h in hosts))
PY
run() { "$PLAN" --hosts "$TMP/hosts.txt" --bandwidth "$TMP/net.json" -g 1 -f 1 -B 64 --seed 7 --json "$TMP/xl.pb"; }
run > "$TMP/a.json" || fail "plan with a bandwidth matrix"
run > "$TMP/b.json" || fail "plan with a bandwidth matrix (again)"
python3 - "$TMP/a.json" "$TMP/b.json" <<'PY' || fail "placement checks"
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
inst = a["instantiation"]
placed, identity = inst["placed_iteration_seconds"], inst["identity_iteration_seconds"]
print(f"placed {placed:.4f} s vs hosts-file order {identity:.4f} s: {100 * (1 - placed / identity):.1f}% better")
assert placed <= 0.9 * identity, (placed, identity)
slow = {frozenset(("h01", "h02")), frozenset(("h09", "h10"))}
for p in inst["pipelines"]:
    for x, y in zip(p["nodes"], p["nodes"][1:]):
        assert frozenset((x, y)) not in slow, f"boundary {x}-{y} is a slow link"
strip = lambda j: {k: v for k, v in j.items() if k != "created_unix_ms"}
assert strip(a) == strip(b), "same seed, different plans"
PY
finish
