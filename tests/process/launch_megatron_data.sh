#!/usr/bin/env bash
# ob-launch --data on a Megatron-LM indexed dataset written by an independent
# Python writer (tests/cli/data_megatron.sh's, from the published layout):
# the bytes of the test corpus as uint16 tokens, cut into documents at blank
# lines and into sequences of up to 50 tokens. Trained for 8 steps on 2
# hosts, --data PREFIX gives the very losses of --data FLAT.bin, a flat file
# of the same tokens (nanoGPT's layout), step for step; --data PREFIX.idx
# names the same dataset. A flat FLAT.bin beside a Megatron index that does
# not describe it is refused before any step, exit 65, naming the index.
NAME=launch_megatron_data
source "$(dirname "$0")/../lib/launch.sh"
command -v python3 >/dev/null || skip "no python3"
make_cluster 2
python3 - "$OB_SOURCE_DIR/tests/data/corpus.txt" "$WORK" <<'PY' || fail "the Python writer"
import struct, sys
data, work = open(sys.argv[1], "rb").read(), sys.argv[2]
docs = [d + b"\n\n" for d in data.split(b"\n\n")]
assert b"".join(docs)[:len(data)] == data
tokens = list(b"".join(docs))
open(work + "/flat.bin", "wb").write(struct.pack("<%dH" % len(tokens), *tokens))
sizes, pointers, doc_idx, offset = [], [], [0], 0
with open(work + "/mega.bin", "wb") as b:
    for d in docs:
        for i in range(0, len(d), 50):
            seq = list(d[i:i + 50])
            b.write(struct.pack("<%dH" % len(seq), *seq))
            sizes.append(len(seq)); pointers.append(offset); offset += 2 * len(seq)
        doc_idx.append(len(sizes))
with open(work + "/mega.idx", "wb") as f:
    f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, len(sizes), len(doc_idx)))
    f.write(struct.pack("<%di" % len(sizes), *sizes) + struct.pack("<%dq" % len(pointers), *pointers))
    f.write(struct.pack("<%dq" % len(doc_idx), *doc_idx))
print(f"{len(docs)} documents, {len(sizes)} sequences, {len(tokens)} tokens")
PY
cmp -s "$WORK/flat.bin" "$WORK/mega.bin" || fail "the .bin is not the flat file's tokens"
train() {  # train NAME DATA: 8 steps, metrics $WORK/NAME.pb
  timeout 240 "$OB_BIN/ob-launch" --rsh local --secret-file "$WORK/secret" --run-dir "$WORK/$1" --steps 8 \
    --standby off --data "$2" --metrics "$WORK/$1.pb" "$WORK/plan.pb" "$WORK/hosts.txt" 2> "$WORK/$1.err"
}
train flat "$WORK/flat.bin" || fail "flat: exit $?: $(tail -3 "$WORK/flat.err")"
train mega "$WORK/mega" || fail "--data PREFIX: exit $?: $(tail -3 "$WORK/mega.err")"
python3 "$METRICS_PY" compare "$WORK/flat.pb" "$WORK/mega.pb" 0 || fail "--data PREFIX: losses differ from the flat file's"
train idx "$WORK/mega.idx" || fail "--data PREFIX.idx: exit $?: $(tail -3 "$WORK/idx.err")"
python3 "$METRICS_PY" compare "$WORK/flat.pb" "$WORK/idx.pb" 0 || fail "--data PREFIX.idx: losses differ"
# A flat file written over a dataset's .bin: its index no longer fits.
cp "$WORK/mega.idx" "$WORK/flat.idx"
head -c -2 "$WORK/flat.bin" > "$WORK/short.bin" && mv "$WORK/short.bin" "$WORK/flat.bin"
train stale "$WORK/flat.bin"
rc=$?
[ "$rc" = 65 ] || fail "a .bin its index does not describe: exit $rc, expected 65: $(tail -3 "$WORK/stale.err")"
grep -q "flat.idx: its sequences hold" "$WORK/stale.err" || fail "the refusal does not name the index: $(tail -3 "$WORK/stale.err")"
[ "$(python3 "$METRICS_PY" max-step "$WORK/stale.pb" 2>/dev/null || echo -1)" -lt 0 ] || fail "it trained a step"
echo "launch_megatron_data: a Megatron pair trains with the flat file's losses; a stale index is refused"
