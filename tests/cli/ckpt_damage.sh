# ob-ckpt verify finds damage, names the file and exits 1: a flipped byte, a
# truncated file, a missing file, a manifest naming a path outside the
# checkpoint, a symbolic link out of it, a damaged manifest.
source "$(dirname "$0")/../lib/assert.sh"
CKPT="$OB_BIN/ob-ckpt"
"$OB_BIN/ckpt_writer" --dir "$TMP/ck" --layers 5 --writers 2 --steps 2 > /dev/null || fail "ckpt_writer"
GOOD="$TMP/ck/step-000000000002"

expect 0 '' -- "$CKPT" verify "$GOOD"
grep -Eq '^ok: 5 files, [0-9]+ bytes verified$' "$TMP/out" && pass || fail "verify output: $(cat "$TMP/out")"
expect 0 '' -- "$CKPT" verify "$TMP/ck"
grep -Eq '^ok: 2 checkpoints, 10 files, [0-9]+ bytes verified$' "$TMP/out" && pass || fail "verify root: $(cat "$TMP/out")"

# A fresh copy of the good checkpoint to damage.
damaged() { rm -rf "$TMP/d"; mkdir -p "$TMP/d"; cp -r "$GOOD" "$TMP/d/"; D="$TMP/d/step-000000000002"; }

damaged  # a flipped byte in the middle of layer 3's data
python3 - "$D/layer-0003.safetensors" <<'PY'
import sys
p = sys.argv[1]; b = bytearray(open(p, "rb").read()); b[len(b) // 2 + 100] ^= 0x01
open(p, "wb").write(b)
PY
expect 1 'layer-0003.safetensors: checksum mismatch: xxh3:[0-9a-f]{16}, the manifest says xxh3:' -- "$CKPT" verify "$D"
expect 1 'layer-0003.safetensors: checksum mismatch' -- "$CKPT" verify "$TMP/d"

damaged  # truncated
truncate -s -1 "$D/layer-0001.safetensors"
expect 1 'layer-0001.safetensors: [0-9]+ bytes, the manifest says [0-9]+ \(truncated\)' -- "$CKPT" verify "$D"

damaged  # missing
rm "$D/layer-0004.safetensors"
expect 1 'layer-0004.safetensors: missing' -- "$CKPT" verify "$D"

damaged  # a manifest naming a path outside the checkpoint (JSON manifests are read too)
cp "$D/layer-0002.safetensors" "$TMP/d/outside.safetensors"
python3 - "$D/manifest.json" "$D/manifest.pb" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
m["files"][2]["path"] = "../outside.safetensors"
open(sys.argv[2], "w").write(json.dumps(m))
PY
expect 1 "manifest.pb: file path '../outside.safetensors' leaves the checkpoint directory" -- "$CKPT" verify "$D"
python3 - "$D/manifest.json" "$D/manifest.pb" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
m["files"][2]["path"] = "/etc/passwd"
open(sys.argv[2], "w").write(json.dumps(m))
PY
expect 1 "manifest.pb: file path '/etc/passwd' leaves the checkpoint directory" -- "$CKPT" verify "$D"

damaged  # a symbolic link out of the checkpoint, to an identical file
mv "$D/layer-0002.safetensors" "$TMP/d/outside.safetensors"
ln -s ../outside.safetensors "$D/layer-0002.safetensors"
expect 1 'layer-0002.safetensors: leaves the checkpoint directory' -- "$CKPT" verify "$D"

damaged  # a damaged and a missing manifest
head -c 100 "$D/manifest.pb" > "$D/m" && mv "$D/m" "$D/manifest.pb"
expect 1 'manifest.pb: (truncated|not a valid ob) Manifest' -- "$CKPT" verify "$D"
rm "$D/manifest.pb"
expect 1 'manifest.pb: missing' -- "$CKPT" verify "$D"

# Not damage but no input: 66; usage: 64.
expect 66 'nowhere: cannot open' -- "$CKPT" verify "$TMP/nowhere"
mkdir "$TMP/empty"
expect 66 'empty: no checkpoints to verify' -- "$CKPT" verify "$TMP/empty"
expect 64 'DIR is required' -- "$CKPT" verify
finish
