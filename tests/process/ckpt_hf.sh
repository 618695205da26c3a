#!/usr/bin/env bash
# Pretrained weights in and out (issue 12, acceptance 4):
#  1. HF -> ob -> HF: a GPT-2 (124M) directory as the Hub ships it (names
#     without "transformer.", the causal-mask buffers attn.bias, random
#     weights), imported with ob-ckpt import and exported with --format hf,
#     read by a stdlib-Python safetensors reader: exactly GPT-2's published
#     names and shapes (Conv1D [in, out]), config.json's keys, and every
#     byte of every weight as it came in;
#  2. ob -> HF -> ob: a trained gpt-tiny checkpoint exported with --format
#     hf and imported back holds the same weights bit for bit;
#  3. ob-launch --resume trains from the imported checkpoint: its first
#     step's loss (before any update) is the original checkpoint's;
#  4. F16 and BF16 weights are widened to fp32 exactly; a NaN or an inf
#     is refused;
#  5. what is not GPT-2 is refused with one line.
NAME=ckpt_hf
source "$(dirname "$0")/../lib/launch.sh"
command -v python3 >/dev/null || skip "no python3"
CKPT="$OB_BIN/ob-ckpt"
ST_PY="$WORK/st.py"
cat > "$ST_PY" <<'PY'
import json, struct
def read(path):
    """{name: (dtype, shape, bytes)} and the metadata of a safetensors file."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", {})
    return {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in header.items()}, meta
def write(path, tensors):
    """tensors: [(name, dtype, shape, bytes)] in order."""
    header, off = {}, 0
    for name, dtype, shape, b in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(b)]}
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for _, _, _, b in tensors:
            f.write(b)
# GPT-2's published layout (GPT2LMHeadModel.state_dict(), tied head left out).
def gpt2_layout(n_layer=12, h=768, s=1024, v=50257):
    out = [("transformer.wte.weight", [v, h]), ("transformer.wpe.weight", [s, h])]
    for i in range(n_layer):
        p = f"transformer.h.{i}."
        out += [(p + "ln_1.weight", [h]), (p + "ln_1.bias", [h]),
                (p + "attn.c_attn.weight", [h, 3 * h]), (p + "attn.c_attn.bias", [3 * h]),
                (p + "attn.c_proj.weight", [h, h]), (p + "attn.c_proj.bias", [h]),
                (p + "ln_2.weight", [h]), (p + "ln_2.bias", [h]),
                (p + "mlp.c_fc.weight", [h, 4 * h]), (p + "mlp.c_fc.bias", [4 * h]),
                (p + "mlp.c_proj.weight", [4 * h, h]), (p + "mlp.c_proj.bias", [h])]
    return out + [("transformer.ln_f.weight", [h]), ("transformer.ln_f.bias", [h])]
PY

# 1. The Hub's GPT-2, in and out.
mkdir -p "$WORK/hub"
python3 - "$WORK" <<'PY' || fail "could not write the stand-in GPT-2"
import json, os, sys
sys.path.insert(0, sys.argv[1])
import st
d = sys.argv[1] + "/hub"
json.dump({"activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
           "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02,
           "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768, "n_head": 12,
           "n_layer": 12, "n_positions": 1024, "resid_pdrop": 0.1, "vocab_size": 50257},
          open(d + "/config.json", "w"))
tensors = []
finite = bytes(x & 0xBF for x in range(256))  # a top byte whose exponent is below 128
for name, shape in st.gpt2_layout():
    n = 4
    for x in shape: n *= x
    b = bytearray(os.urandom(n))
    b[3::4] = b[3::4].translate(finite)  # random, and finite
    tensors.append((name[len("transformer."):], "F32", shape, bytes(b)))
    if name.endswith("ln_1.weight"):  # the causal mask GPT-2's file carries
        tensors.append((name.replace("ln_1.weight", "attn.bias"), "F32", [1, 1, 8, 8], bytes(256)))
st.write(d + "/model.safetensors", tensors)
PY
"$CKPT" import "$WORK/hub" -o "$WORK/imported" > "$WORK/import.out" 2> "$WORK/import.err" \
  || fail "import: $(cat "$WORK/import.err")"
grep -q "imported .*hub as gpt2, .*step-000000000000" "$WORK/import.out" || fail "import said: $(cat "$WORK/import.out")"
"$CKPT" verify "$WORK/imported" > /dev/null || fail "the imported checkpoint does not verify"
"$CKPT" export --format hf "$WORK/imported" -o "$WORK/out" 2> "$WORK/export.err" || fail "export: $(cat "$WORK/export.err")"
python3 - "$WORK" <<'PY' || fail "the export is not GPT-2's layout, or not the imported bytes"
import json, sys
sys.path.insert(0, sys.argv[1])
import st
w = sys.argv[1]
out, meta = st.read(w + "/out/model.safetensors")
assert meta.get("format") == "pt", meta
layout = st.gpt2_layout()
assert list(out) == [n for n, _ in layout], [n for n in out][:5]
for name, shape in layout:
    assert out[name][0] == "F32" and out[name][1] == shape, (name, out[name][:2], shape)
hub, _ = st.read(w + "/hub/model.safetensors")
for name, _ in layout:
    assert out[name][2] == hub[name[len("transformer."):]][2], name
c = json.load(open(w + "/out/config.json"))
want = {"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12, "n_positions": 1024,
        "vocab_size": 50257, "activation_function": "gelu_new", "tie_word_embeddings": True}
for k, v in want.items():
    assert c[k] == v, (k, c.get(k), v)
assert c["architectures"] == ["GPT2LMHeadModel"]
print(len(out), "tensors")
PY
echo "$NAME: HF GPT-2 -> ob -> HF: GPT-2's 148 names and shapes, every byte as it came in"
rm -rf "$WORK/hub" "$WORK/imported" "$WORK/out"

# 2. ob -> HF -> ob, from a trained gpt-tiny checkpoint.
make_cluster 2
run_start tiny 4 --ckpt-dir "$WORK/ck" --ckpt-every 2 --standby off
run_wait
[ "$RC" = 0 ] || fail "training gpt-tiny: exit $RC: $(tail -3 "$WORK/tiny.err")"
"$CKPT" export --format hf "$WORK/ck/step-000000000001" -o "$WORK/tiny-hf" || fail "export of gpt-tiny"
"$CKPT" import --step 1 "$WORK/tiny-hf" -o "$WORK/ck2" > /dev/null || fail "import of gpt-tiny"
"$CKPT" export "$WORK/ck/step-000000000001" -o "$WORK/a.safetensors" || fail "ob export"
"$CKPT" export "$WORK/ck2" -o "$WORK/b.safetensors" || fail "ob export of the import"
python3 - "$WORK" <<'PY' || fail "ob -> HF -> ob changed the weights"
import sys
sys.path.insert(0, sys.argv[1])
import st
a, _ = st.read(sys.argv[1] + "/a.safetensors")
b, _ = st.read(sys.argv[1] + "/b.safetensors")
assert a.keys() == b.keys(), (sorted(a.keys() ^ b.keys()))
assert all(a[k] == b[k] for k in a), [k for k in a if a[k] != b[k]]
PY
echo "$NAME: gpt-tiny -> HF -> ob: bit for bit"

# 3. Training resumes from the import; its first loss is the original's.
run_start orig 6 --ckpt-dir "$WORK/ck-orig" --resume "$WORK/ck/step-000000000001" --standby off
run_wait
[ "$RC" = 0 ] || fail "resume from the original: exit $RC: $(tail -3 "$WORK/orig.err")"
run_start fromhf 6 --ckpt-dir "$WORK/ck2" --resume auto --standby off
run_wait
[ "$RC" = 0 ] || fail "resume from the import: exit $RC: $(tail -3 "$WORK/fromhf.err")"
python3 - "$METRICS_PY" "$WORK/orig.pb" "$WORK/fromhf.pb" <<'PY' || fail "the import does not train from the same weights"
import importlib.util, math, sys
spec = importlib.util.spec_from_file_location("metrics", sys.argv[1])
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
a, b = (m.losses(m.records(p)) for p in sys.argv[2:4])
assert sorted(a) == sorted(b) == [2, 3, 4, 5], (sorted(a), sorted(b))
assert a[2] == b[2], (a[2], b[2])             # the same weights, the same batch
assert all(math.isfinite(b[s]) for s in b)     # and AdamW, started afresh, trains on
print(f"step 2 loss {a[2]:.6f} both")
PY

# 4. Half-precision weights (F16, BF16), as many Hub models ship: widened
#    to fp32 exactly. Every finite F16 bit pattern and every finite BF16
#    one, spread over gpt-tiny's tensors, comes out of import + export as
#    Python's own decoding of it; a tensor holding a NaN or an inf is
#    refused with one line (a model holding one cannot train).
for dtype in F16 BF16; do
  python3 - "$WORK" "$dtype" <<'PY' || fail "$dtype: could not write the model"
import json, os, shutil, struct, sys
sys.path.insert(0, sys.argv[1])
import st
w, dtype = sys.argv[1], sys.argv[2]
d = f"{w}/half-{dtype}"
os.makedirs(d, exist_ok=True)
shutil.copy(f"{w}/tiny-hf/config.json", d)
src, _ = st.read(f"{w}/tiny-hf/model.safetensors")
def finite(p):
    return (p & 0x7C00) != 0x7C00 if dtype == "F16" else (p & 0x7F80) != 0x7F80
patterns = [p for p in range(65536) if finite(p)]
tensors, at = [], 0
for name, (_, shape, _) in src.items():
    n = 1
    for x in shape: n *= x
    vals = [patterns[(at + i) % len(patterns)] for i in range(n)]
    at += n
    tensors.append((name, dtype, shape, struct.pack(f"<{n}H", *vals)))
assert at >= len(patterns), at
st.write(d + "/model.safetensors", tensors)
bad = [list(t) for t in tensors]
bad[3][3] = struct.pack("<H", 0x7C00 if dtype == "F16" else 0x7F80) + bad[3][3][2:]   # +inf first
os.makedirs(d + "-inf", exist_ok=True)
shutil.copy(f"{w}/tiny-hf/config.json", d + "-inf")
st.write(d + "-inf/model.safetensors", [tuple(t) for t in bad])
PY
  "$CKPT" import "$WORK/half-$dtype" -o "$WORK/half-ck-$dtype" > /dev/null 2> "$WORK/half.err" \
    || fail "$dtype import: $(cat "$WORK/half.err")"
  "$CKPT" export --format hf "$WORK/half-ck-$dtype" -o "$WORK/half-out-$dtype" 2> "$WORK/half.err" \
    || fail "$dtype export: $(cat "$WORK/half.err")"
  python3 - "$WORK" "$dtype" <<'PY' || fail "$dtype: the weights did not come through exactly"
import math, struct, sys
sys.path.insert(0, sys.argv[1])
import st
w, dtype = sys.argv[1], sys.argv[2]
src, _ = st.read(f"{w}/half-{dtype}/model.safetensors")
out, _ = st.read(f"{w}/half-out-{dtype}/model.safetensors")
checked = 0
for name, (_, shape, b) in src.items():
    o = out[name]
    assert o[0] == "F32" and o[1] == shape, (name, o[:2])
    n = len(b) // 2
    got = struct.unpack(f"<{n}f", o[2])
    if dtype == "F16":
        want = struct.unpack(f"<{n}e", b)
    else:
        want = struct.unpack(f"<{n}f", b"".join(b"\0\0" + b[2 * i:2 * i + 2] for i in range(n)))
    for g, x in zip(got, want):
        assert g == x and math.copysign(1, g) == math.copysign(1, x), (name, g, x)
    checked += n
print(f"{dtype}: {checked} values exact")
PY
  "$CKPT" import "$WORK/half-$dtype-inf" -o "$WORK/half-inf-ck" 2> "$WORK/half.err"
  rc=$?
  [ "$rc" = 65 ] && [ "$(grep -c . "$WORK/half.err")" = 1 ] && grep -q "holds 1 value(s) that are not finite" "$WORK/half.err" \
    || fail "$dtype with an inf: exit $rc: $(cat "$WORK/half.err")"
  [ ! -e "$WORK/half-inf-ck" ] || fail "$dtype with an inf: a checkpoint directory was made"
done

# 5. Not GPT-2.
mkdir -p "$WORK/bad"
cp "$WORK/tiny-hf/model.safetensors" "$WORK/bad/"
sed 's/"gelu_new"/"relu"/' "$WORK/tiny-hf/config.json" > "$WORK/bad/config.json"
"$CKPT" import "$WORK/bad" -o "$WORK/ck3" 2> "$WORK/bad.err"
rc=$?
[ "$rc" = 65 ] && [ "$(grep -c . "$WORK/bad.err")" = 1 ] && grep -Eq "config.json:[0-9]+: activation_function 'relu': ob's GPT-2 uses gelu_new" "$WORK/bad.err" \
  || fail "relu: exit $rc: $(cat "$WORK/bad.err")"
sed 's/"n_head": 4/"n_head": 2/' "$WORK/tiny-hf/config.json" > "$WORK/bad/config.json"
"$CKPT" import --model gpt-tiny "$WORK/bad" -o "$WORK/ck3" 2> "$WORK/bad.err"
rc=$?
[ "$rc" = 65 ] && grep -q "is not gpt-tiny's" "$WORK/bad.err" || fail "another shape: exit $rc: $(cat "$WORK/bad.err")"
"$CKPT" import --step 1 "$WORK/tiny-hf" -o "$WORK/ck2" 2> "$WORK/bad.err"
rc=$?
[ "$rc" = 78 ] && grep -q "exists" "$WORK/bad.err" || fail "import over a step: exit $rc: $(cat "$WORK/bad.err")"
echo "$NAME: ok"
