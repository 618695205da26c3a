# The Llama family at scale (issue 55, acceptance 5): the analytic profile of
# llama3.1-8b costs, per token, the FLOPs of PaLM's formula 6N + 12·L·(a·d)·s
# (N the parameters less the embedding, the LM head's matrix counted once;
# ob-profile(1) states it) within 2%, N taken from Llama 3.1 8B's published
# config.json, not from ob; and llama3.1-70b on 64 nodes with f = 2 and
# llama3.1-405b on 1,024 nodes plan with their memory checked (every
# template's predicted peak within its GPU's capacity). The time each takes
# is bench/llama_plan.sh's.
source "$(dirname "$0")/../lib/assert.sh"
"$OB_BIN/ob-profile" --model llama3.1-8b --analytic --gpu h100 --json > "$TMP/8b.json" || fail "ob-profile llama3.1-8b"
python3 - "$TMP/8b.json" <<'PY' || fail "llama3.1-8b's FLOPs per token are not PaLM's formula's"
import json, sys
p = json.load(open(sys.argv[1]))
# Llama 3.1 8B's config.json: hidden 4096, intermediate 14336, 32 layers,
# 32 heads, 8 kv heads of 128, vocabulary 128256, untied.
h, I, L, H, K, d, V = 4096, 14336, 32, 32, 8, 128, 128256
s = p["sequence_length"]
block = 2 * h * H * d + 2 * h * K * d + 3 * h * I + 2 * h
N = L * block + V * h + h
formula = 6 * N + 12 * L * H * d * s
ob = 0.0
for layer in p["layers"]:
    c = layer["costs"][0]
    ob += (c.get("forward_flops", 0) + c.get("backward_flops", 0)) / (c["microbatch"] * s)
rel = abs(ob - formula) / formula
print(f"sequence {s}: ob {ob:.4e} FLOPs/token, 6N + 12·L·(a·d)·s {formula:.4e}: {rel:.2%}")
assert rel <= 0.02, rel
PY
[ $? = 0 ] && pass
for spec in "llama3.1-70b 64" "llama3.1-405b 1024"; do
  set -- $spec
  "$OB_BIN/ob-profile" --model "$1" --analytic --gpu h100 > "$TMP/$1.prof" || fail "ob-profile $1"
  "$OB_BIN/ob-plan" -f 2 --nodes "$2" -g 8 -B 512 --json "$TMP/$1.prof" > "$TMP/$1.json" 2> "$TMP/$1.err" \
    || fail "ob-plan $1 on $2 nodes: $(cat "$TMP/$1.err")"
  python3 - "$TMP/$1.json" "$1" <<'PY' && pass || fail "$1: a template's predicted memory exceeds its GPU"
import json, sys
p = json.load(open(sys.argv[1]))
ts = p["templates"]
assert ts, "no templates"
for t in ts:
    for s in t["stages"]:
        assert 0 < int(s["memory_bytes"]) <= int(s["memory_capacity_bytes"]) <= int(p["gpu_memory_bytes"]), (t["nodes"], s)
print(f"{sys.argv[2]}: {len(ts)} templates, {len(p['instantiation']['pipelines'])} pipelines")
PY
done
finish
