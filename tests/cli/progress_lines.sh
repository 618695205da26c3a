# Long work shows its progress on stderr (issue 72): on a stderr that is not
# a terminal, plain lines "TOOL: WHAT (P%, T left)" (OB_PROGRESS_SECONDS
# apart; 0 here, so every step of work shows and the test does not depend
# on this machine's speed), the share rising to 100%; with -q, nothing.
source "$(dirname "$0")/../lib/assert.sh"

# progress FILE TOOL: the progress lines of FILE, checked: at least two,
# each "TOOL: ... (P%, T left)", P never falling, the last 100%.
progress() {
  local file=$1 tool=$2
  grep -E "^$tool: .* \([0-9]+%(, [0-9hmins ]+ left)?\)$" "$file" > "$TMP/lines" || true
  local n
  n=$(grep -c '' "$TMP/lines")
  [ "$n" -ge 2 ] || { fail "$tool: $n progress lines on stderr: $(head -c 600 "$file")"; return; }
  python3 - "$TMP/lines" <<'PY' || fail "$tool: the share does not rise to 100%: $(cat "$TMP/lines")"
import re, sys
shares = [int(re.search(r"\((\d+)%", l).group(1)) for l in open(sys.argv[1])]
sys.exit(0 if shares == sorted(shares) and shares[-1] == 100 and any("left" in l for l in open(sys.argv[1])) else 1)
PY
  pass
}

# ob-profile measuring a small model (seconds here, minutes for gpt2).
OB_PROGRESS_SECONDS=0 "$OB_BIN/ob-profile" --model gpt-tiny --threads 1 --warmup 0 -k 1 --seq-len 32 \
  -o "$TMP/p.pb" 2> "$TMP/profile.err" || fail "ob-profile: $(tail -3 "$TMP/profile.err")"
progress "$TMP/profile.err" ob-profile
grep -q 'micro-batch 1, .* layers chained' "$TMP/lines" || fail "ob-profile's lines do not say what was done: $(head -3 "$TMP/lines")"
OB_PROGRESS_SECONDS=0 "$OB_BIN/ob-profile" --model gpt-tiny --threads 1 --warmup 0 -k 1 --seq-len 32 -q \
  -o "$TMP/q.pb" 2> "$TMP/quiet.err" || fail "ob-profile -q: $(tail -3 "$TMP/quiet.err")"
[ ! -s "$TMP/quiet.err" ] && pass || fail "ob-profile -q wrote to stderr: $(head -c 300 "$TMP/quiet.err")"

# ob-data tokenizing 4 MiB (four chunks of a MiB) with a byte-level BPE of
# no merges (GPT-2's byte alphabet: one id a byte).
python3 - "$TMP/encoder.json" "$TMP/vocab.bpe" <<'PY'
import json, sys
bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
cs = bs[:]
n = 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + n); n += 1
enc = {chr(c): i for i, c in enumerate(cs)}
enc["<|endoftext|>"] = 256
json.dump(enc, open(sys.argv[1], "w"))
open(sys.argv[2], "w").write("#version: 0.2\n")
PY
python3 -c 'import sys; t = open(sys.argv[1], "rb").read(); n = 4 << 20
open(sys.argv[2], "wb").write((t * (n // len(t) + 1))[:n])' "$OB_SOURCE_DIR/tests/data/corpus.txt" "$TMP/text.txt"
V=(--vocab "$TMP/encoder.json" --merges "$TMP/vocab.bpe")
OB_PROGRESS_SECONDS=0 "$OB_BIN/ob-data" tokenize "${V[@]}" "$TMP/text.txt" -o "$TMP/t.bin" 2> "$TMP/data.err" \
  || fail "ob-data: $(tail -3 "$TMP/data.err")"
progress "$TMP/data.err" ob-data
grep -q 'MiB of 4.0 MiB, [0-9]* tokens' "$TMP/lines" || fail "ob-data's lines do not say what was done: $(head -3 "$TMP/lines")"
grep -q '→ [0-9]* tokens in' "$TMP/data.err" || fail "ob-data's summary is missing: $(tail -2 "$TMP/data.err")"
OB_PROGRESS_SECONDS=0 "$OB_BIN/ob-data" tokenize -q "${V[@]}" "$TMP/text.txt" -o "$TMP/q.bin" 2> "$TMP/quiet.err" \
  || fail "ob-data -q: $(tail -3 "$TMP/quiet.err")"
[ ! -s "$TMP/quiet.err" ] && pass || fail "ob-data -q wrote to stderr: $(head -c 300 "$TMP/quiet.err")"
cmp -s "$TMP/t.bin" "$TMP/q.bin" && pass || fail "ob-data's output differs with -q"
finish
