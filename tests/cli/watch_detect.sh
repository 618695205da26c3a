# ob-watch on recorded streams: each injected fault gives its event naming
# host, rank and step; the same stream always gives the same bytes; a
# damaged stream gives the events before the damage and one line naming
# the file and offset (exit 65).
source "$(dirname "$0")/../lib/assert.sh"
WATCH="$OB_BIN/ob-watch"
SYNTH="$OB_BIN/watch_synth"

# kinds FILE.jsonl: "KIND host rank step" per event.
kinds() {
  python3 -c '
import json, sys
for line in open(sys.argv[1]):
    e = json.loads(line)
    print(e["kind"], e["host"] or "-", e["rank"], e["step"])' "$1"
}

# A clean 500-step run: nothing to say, exit 0.
"$SYNTH" --steps 500 --seed 3 > "$TMP/clean.pb"
expect 0 '' -- "$WATCH" --json "$TMP/clean.pb"
[ ! -s "$TMP/out" ] && pass || fail "clean run raised: $(head -c 300 "$TMP/out")"

# One fault per stream; ob-watch exits 1 (an expected "no") and says what it found.
check() {  # check NAME 'SYNTH ARGS' 'EXPECTED FIRST EVENT (regex)'
  "$SYNTH" --steps 200 --seed 5 $2 > "$TMP/$1.pb"
  expect 1 "anomal" -- "$WATCH" --json "$TMP/$1.pb"
  kinds "$TMP/out" > "$TMP/$1.kinds"
  if grep -Eq -- "$3" "$TMP/$1.kinds"; then pass; else fail "$1: no /$3/ in: $(tr '\n' ';' < "$TMP/$1.kinds")"; fi
}
check straggler '--slow 2:1.5:40' '^EVENT_STRAGGLER node3 2 (4[0-9]|5[0-9])$'
check hang '--stop 1:70' '^EVENT_HANG node2 1 69$'
check nan '--nan 77' '^EVENT_LOSS_NAN node[0-9] [0-9] 77$'
check spike '--spike 120:1.5' '^EVENT_LOSS_SPIKE node[0-9] [0-9] 120$'
check crash '--crash 3:50' '^EVENT_CRASH node4 3 49$'
check drop '--slow-job 1.6:100' '^EVENT_THROUGHPUT_DROP - -1 10[0-9]$'
check leak '--leak 0:20000000:10' '^EVENT_MEMORY_GROWTH node1 0 '
grep -q '^EVENT_RECOVERY - -1 50$' "$TMP/crash.kinds" && pass || fail "no recovery after the crash"
[ "$(grep -vc STRAGGLER "$TMP/straggler.kinds")" -le 1 ] && pass || fail "straggler run: $(cat "$TMP/straggler.kinds")"

# Determinism: twice from the file, once from a pipe; binary and JSON.
"$SYNTH" --steps 300 --seed 9 --slow 1:1.6:30:120 --nan 150 --crash 2:200 > "$TMP/mix.pb"
"$WATCH" "$TMP/mix.pb" > "$TMP/a.events" 2>/dev/null
"$WATCH" "$TMP/mix.pb" > "$TMP/b.events" 2>/dev/null
cat "$TMP/mix.pb" | "$WATCH" > "$TMP/c.events" 2>/dev/null
[ -s "$TMP/a.events" ] && cmp -s "$TMP/a.events" "$TMP/b.events" && cmp -s "$TMP/a.events" "$TMP/c.events" \
  && pass || fail "event bytes differ between runs"
"$WATCH" --json "$TMP/mix.pb" > "$TMP/a.jsonl" 2>/dev/null
"$WATCH" --json - < "$TMP/mix.pb" > "$TMP/b.jsonl" 2>/dev/null
cmp -s "$TMP/a.jsonl" "$TMP/b.jsonl" && pass || fail "JSON differs between file and stdin"
# The binary events are delimited Event records: as many as JSON lines.
python3 - "$TMP/a.events" "$(grep -c '' "$TMP/a.jsonl")" <<'PY' && pass || fail "binary events are not delimited records"
import sys
data, n, i = open(sys.argv[1], "rb").read(), 0, 0
while i < len(data):
    size = shift = 0
    while True:
        b = data[i]; i += 1
        size |= (b & 0x7F) << shift; shift += 7
        if b < 0x80: break
    i += size; n += 1
assert i == len(data) and n == int(sys.argv[2]), (i, len(data), n)
PY

# -o writes the events to a file; the exit status is the same.
expect 1 '' -- "$WATCH" --json -o "$TMP/o.jsonl" "$TMP/mix.pb"
cmp -s "$TMP/a.jsonl" "$TMP/o.jsonl" && pass || fail "-o FILE differs from stdout"

# Damage: the events up to it, then one line naming file and offset, exit 65.
size=$(stat -c %s "$TMP/mix.pb")
head -c $((size * 3 / 4)) "$TMP/mix.pb" > "$TMP/cut.pb"
expect 65 'cut.pb: record [0-9]+ at byte [0-9]+: truncated' -- "$WATCH" --json "$TMP/cut.pb"
grep -q EVENT_STRAGGLER "$TMP/out" && grep -q EVENT_LOSS_NAN "$TMP/out" && pass \
  || fail "events before the damage are missing: $(kinds "$TMP/out" | tr '\n' ';')"
python3 - "$TMP/mix.pb" "$TMP/corrupt.pb" <<'PY'
import sys
d = bytearray(open(sys.argv[1], "rb").read())
d[len(d) // 2:len(d) // 2 + 12] = b"\xff" * 12
open(sys.argv[2], "wb").write(d)
PY
expect 65 'corrupt.pb: record [0-9]+ at byte [0-9]+: corrupt' -- "$WATCH" --json "$TMP/corrupt.pb"
expect 65 '<stdin>: record [0-9]+ at byte [0-9]+: truncated' -- sh -c "\"$WATCH\" --json < \"$TMP/cut.pb\""
expect 66 'missing.pb: cannot open' -- "$WATCH" "$TMP/missing.pb"
: > "$TMP/empty.pb"
expect 0 '' -- "$WATCH" "$TMP/empty.pb"

# The checked-in recording gives the checked-in events (tests/data/watch).
DATA="$OB_SOURCE_DIR/tests/data/watch"
expect 1 '' -- "$WATCH" --json "$DATA/straggler-hang.pb"
cmp -s "$TMP/out" "$DATA/straggler-hang.events.jsonl" && pass \
  || fail "straggler-hang.pb: events differ from the recording: $(diff "$TMP/out" "$DATA/straggler-hang.events.jsonl" | head -c 600)"
finish
