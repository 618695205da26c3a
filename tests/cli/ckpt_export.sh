# ob-ckpt export writes one safetensors file that an independent reader
# (tests/lib/safetensors_reader.py: Python's standard library only) reads
# back with the right names, dtypes, shapes, values and metadata.
source "$(dirname "$0")/../lib/assert.sh"
CKPT="$OB_BIN/ob-ckpt"
WRITER="$OB_BIN/ckpt_writer"
READER="$OB_SOURCE_DIR/tests/lib/safetensors_reader.py"
"$WRITER" --dir "$TMP/ck" --layers 6 --writers 3 --steps 3 --rows 12 --cols 20 > /dev/null || fail "ckpt_writer"

# Weights only (the default), from the root: the latest checkpoint, step 3.
expect 0 '' -- "$CKPT" export "$TMP/ck" -o "$TMP/w.safetensors"
"$WRITER" --expect --step 3 --layers 6 --rows 12 --cols 20 > "$TMP/w.json"
expect 0 '' -- python3 "$READER" "$TMP/w.safetensors" --expect "$TMP/w.json"
grep -q '^ok: 14 tensors match$' "$TMP/out" && pass || fail "reader: $(cat "$TMP/out")"

# With the optimizer state, from an older checkpoint, through a pipe.
"$CKPT" export --with-optimizer "$TMP/ck/step-000000000002" | python3 "$READER" - > "$TMP/all.json" \
  && pass || fail "export to a pipe"
"$WRITER" --expect --step 2 --layers 6 --rows 12 --cols 20 --with-optimizer > "$TMP/all-expected.json"
python3 - "$TMP/all.json" "$TMP/all-expected.json" <<'PY' && pass || fail "export --with-optimizer differs"
import json, sys
got, want = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert got == want, "differ"
assert len(got["tensors"]) == 42 and got["metadata"]["tied.adam_step"] == "2"
PY

# The export is streamed and atomic: a damaged source leaves no output.
python3 - "$TMP/ck/step-000000000003/layer-0005.safetensors" <<'PY'
import sys
p = sys.argv[1]; b = bytearray(open(p, "rb").read()); b[-1] ^= 0x80
open(p, "wb").write(b)
PY
expect 65 'layer-0005.safetensors: checksum mismatch: .*; nothing exported' -- "$CKPT" export "$TMP/ck" -o "$TMP/bad.safetensors"
[ -z "$(ls "$TMP" | grep '^bad\.safetensors')" ] && pass || fail "damaged export left output: $(ls "$TMP")"

# An output that is a file of the checkpoint read (by name, by a link, or
# the log) is refused before anything is written: an export over one of its
# own layers replaced it and exited 0, and the checkpoint no longer verified.
S2="$TMP/ck/step-000000000002"
cp -a "$S2" "$TMP/s2.orig"
expect 64 "writing -o .*layer-0001.safetensors would destroy the input .*layer-0001.safetensors \(the checkpoint\)" -- \
  "$CKPT" export "$S2" -o "$S2/layer-0001.safetensors"
ln -s "$S2/manifest.pb" "$TMP/m-link"
expect 64 "writing -o .*m-link would destroy the input .*manifest.pb \(the checkpoint: the same file\)" -- \
  "$CKPT" export "$TMP/ck" -o "$TMP/m-link"
expect 64 "writing --log-file .*manifest.json would destroy the input" -- "$CKPT" verify "$TMP/ck" --log-file "$S2/manifest.json"
diff -r "$S2" "$TMP/s2.orig" > /dev/null && pass || fail "a refused command changed the checkpoint"
expect 66 'nowhere: no such checkpoint directory' -- "$CKPT" export "$TMP/nowhere" -o "$TMP/x"
expect 74 'no/such/dir/x.safetensors: cannot create' -- "$CKPT" export "$TMP/ck/step-000000000002" -o "$TMP/no/such/dir/x.safetensors"
finish
